"""The fault proxy forwards to the real apiserver and injects exactly the faults it is told to.

Requests go through plain ``http.client`` so each test sees the raw HTTP: status, headers, body,
connection errors and chunked watch streams.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from dra_devcluster import LocalCluster
from dra_devcluster.faultproxy import Blackhole, Fault, FaultProxy

pytestmark = pytest.mark.cluster


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@pytest.fixture
def proxy(local_cluster: LocalCluster) -> Iterator[FaultProxy]:
    with FaultProxy(local_cluster) as p:
        yield p


def _connect(proxy: FaultProxy, cluster: LocalCluster, *, timeout: float = 30) -> http.client.HTTPSConnection:
    # Clients trust the cluster CA: the proxy serves the apiserver's own certificate.
    ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
    port = urlsplit(proxy.url).port
    assert port is not None
    return http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout)


def _request(proxy: FaultProxy, cluster: LocalCluster, path: str, *, method: str = "GET") -> Reply:
    conn = _connect(proxy, cluster)
    try:
        conn.request(method, path, headers={"Accept": "application/json"})
        resp = conn.getresponse()
        return Reply(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def _outcomes(proxy: FaultProxy, path: str) -> list[str]:
    return [r.outcome for r in proxy.records() if r.path == path]


def test_pass_through_kubectl(proxy: FaultProxy, local_cluster: LocalCluster) -> None:
    out = local_cluster.kubectl("get", "namespaces", "-o", "name", kubeconfig=proxy.kubeconfig).stdout
    assert "namespace/default" in out.split()
    assert "forwarded:200" in _outcomes(proxy, "/api/v1/namespaces")
    # The proxy's kubeconfig differs from the admin one only in its server.
    assert proxy.url in proxy.kubeconfig.read_text()
    assert local_cluster.server not in proxy.kubeconfig.read_text()

    # Writes carry their bodies up and the apiserver's answers back.
    name = f"faultproxy-{uuid.uuid4().hex[:8]}"
    local_cluster.kubectl(
        "create", "configmap", name, "-n", "default", "--from-literal=k=v", kubeconfig=proxy.kubeconfig
    )
    assert local_cluster.get_json("configmap", name, "-n", "default")["data"] == {"k": "v"}
    local_cluster.kubectl("delete", "configmap", name, "-n", "default", kubeconfig=proxy.kubeconfig)
    assert "forwarded:201" in _outcomes(proxy, "/api/v1/namespaces/default/configmaps")
    assert "forwarded:200" in _outcomes(proxy, f"/api/v1/namespaces/default/configmaps/{name}")


def test_token_identity_is_kept(proxy: FaultProxy, local_cluster: LocalCluster) -> None:
    # The proxy presents the admin certificate only for requests without credentials of their own;
    # the apiserver prefers a client certificate to a bearer token, so this must hold.
    name = f"faultproxy-{uuid.uuid4().hex[:8]}"
    local_cluster.kubectl("create", "serviceaccount", name, "-n", "default")
    try:
        token = local_cluster.kubectl("create", "token", name, "-n", "default").stdout.strip()
        via_proxy = proxy.kubeconfig_via(local_cluster.kubeconfig_for_token(token, name=name))
        whoami = json.loads(
            local_cluster.kubectl("auth", "whoami", "-o", "json", kubeconfig=via_proxy).stdout
        )
        assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:default:{name}"
        admin = json.loads(
            local_cluster.kubectl("auth", "whoami", "-o", "json", kubeconfig=proxy.kubeconfig).stdout
        )
        assert admin["status"]["userInfo"]["username"] != whoami["status"]["userInfo"]["username"]
    finally:
        local_cluster.kubectl("delete", "serviceaccount", name, "-n", "default", "--wait=false")


def test_status_fault_counts_then_forwards(proxy: FaultProxy, local_cluster: LocalCluster) -> None:
    target = "/api/v1/namespaces/default"
    fault = proxy.add(
        Fault("status", code=429, retry_after=3, methods=frozenset({"get"}), path="/default$", count=2)
    )
    other = proxy.add(Fault("status", code=503, path="^/api/v1/namespaces/kube-system$"))

    first = _request(proxy, local_cluster, target)
    # A request the fault does not match is forwarded and does not use up its count.
    assert _request(proxy, local_cluster, "/api/v1/namespaces/kube-public").status == 200
    second = _request(proxy, local_cluster, target)
    third = _request(proxy, local_cluster, target)

    for reply in (first, second):
        assert reply.status == 429
        assert reply.headers["Retry-After"] == "3"
        body = reply.json()
        assert (body["kind"], body["apiVersion"], body["status"]) == ("Status", "v1", "Failure")
        assert (body["code"], body["reason"]) == (429, "TooManyRequests")
        assert "injected" in body["message"]
    assert third.status == 200
    assert third.json()["metadata"]["name"] == "default"
    assert fault.hits == 2
    assert _outcomes(proxy, target) == ["injected:429", "injected:429", "forwarded:200"]

    unavailable = _request(proxy, local_cluster, "/api/v1/namespaces/kube-system")
    assert unavailable.status == 503
    assert unavailable.headers["Retry-After"] is None
    assert unavailable.json()["reason"] == "ServiceUnavailable"
    # Without a count the fault stays until removed.
    assert _request(proxy, local_cluster, "/api/v1/namespaces/kube-system").status == 503
    proxy.remove(other)
    assert _request(proxy, local_cluster, "/api/v1/namespaces/kube-system").status == 200
    assert other.hits == 2


def test_reset_drops_the_connection(proxy: FaultProxy, local_cluster: LocalCluster) -> None:
    target = "/api/v1/namespaces/default"
    fault = proxy.add(Fault("reset", path="^/api/v1/namespaces/default$", count=1))

    # No HTTP response at all (http.client's RemoteDisconnected is a ConnectionResetError); a timeout,
    # as from a proxy that hung instead, is neither of these.
    with pytest.raises((ConnectionError, ssl.SSLError)):
        _request(proxy, local_cluster, target)
    assert fault.hits == 1

    assert _request(proxy, local_cluster, target).status == 200
    assert _outcomes(proxy, target) == ["injected:reset", "forwarded:200"]


def test_gone_ends_watches_only(proxy: FaultProxy, local_cluster: LocalCluster) -> None:
    proxy.add(Fault("gone"))

    watch = _request(proxy, local_cluster, "/api/v1/namespaces?watch=true")
    listed = _request(proxy, local_cluster, "/api/v1/namespaces")

    assert watch.status == 200
    # Exactly one event line, and then the stream ended (read() returned).
    assert watch.body.count(b"\n") == 1
    assert watch.body.endswith(b"\n")
    assert json.loads(watch.body) == {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "too old resource version: injected",
            "reason": "Expired",
            "code": 410,
        },
    }
    assert listed.status == 200
    assert listed.json()["kind"] == "NamespaceList"
    assert _outcomes(proxy, "/api/v1/namespaces") == ["injected:gone", "forwarded:200"]
    assert [r.watch for r in proxy.records()] == [True, False]

    with pytest.raises(ValueError, match="watch requests only"):
        Fault("gone", watch=False)


def _open_watch(
    proxy: FaultProxy, cluster: LocalCluster, path: str, stack: contextlib.ExitStack
) -> http.client.HTTPResponse:
    conn = _connect(proxy, cluster)
    stack.callback(conn.close)
    conn.request("GET", path, headers={"Accept": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    return resp


def _next_event(resp: http.client.HTTPResponse) -> dict[str, Any]:
    line = resp.readline()
    assert line, "the watch stream ended"
    event: dict[str, Any] = json.loads(line)
    return event


def test_watch_streams_through_and_drop_streams_ends_it(
    proxy: FaultProxy, local_cluster: LocalCluster
) -> None:
    namespace = f"faultproxy-{uuid.uuid4().hex[:8]}"
    local_cluster.kubectl("create", "namespace", namespace)
    stack = contextlib.ExitStack()
    try:
        listed = _request(proxy, local_cluster, f"/api/v1/namespaces/{namespace}/configmaps")
        rv = listed.json()["metadata"]["resourceVersion"]
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        resp = _open_watch(proxy, local_cluster, f"{path}?watch=true&resourceVersion={rv}", stack)

        # Written around the proxy: the event can only come from the apiserver's own watch.
        local_cluster.kubectl("create", "configmap", "probe", "-n", namespace, "--from-literal=k=v")
        deadline = time.monotonic() + 20
        while True:
            assert time.monotonic() < deadline, "no ADDED event for the probe configmap"
            event = _next_event(resp)
            if event["object"]["metadata"]["name"] == "probe":
                break
        assert event["type"] == "ADDED"
        assert event["object"]["data"] == {"k": "v"}
        assert [r.outcome for r in proxy.records() if r.path == path and r.watch] == ["forwarded:200"]

        assert proxy.drop_streams() == 1
        # Ended cleanly: the final chunk arrives, so read() returns the (empty) rest instead of
        # raising IncompleteRead as on a cut connection, or timing out as on a stream left open.
        assert resp.read() == b""
        assert proxy.drop_streams() == 0

        # abort=True cuts the connection instead: the client sees a truncated stream.
        aborted = _open_watch(proxy, local_cluster, f"{path}?watch=1&resourceVersion={rv}", stack)
        # The controller-manager's kube-root-ca.crt may come first: it is created in every new
        # namespace, sometimes after the listing above.
        names = [_next_event(aborted)["object"]["metadata"]["name"]]
        while names[-1] != "probe":
            assert len(names) < 5, f"no ADDED event for the probe configmap: {names}"
            names.append(_next_event(aborted)["object"]["metadata"]["name"])
        assert proxy.drop_streams(abort=True) == 1
        with pytest.raises(http.client.IncompleteRead):
            aborted.read()
    finally:
        stack.close()
        local_cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def _proxy_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("faultproxy"))


def test_stop_closes_the_port_and_ends_the_thread(local_cluster: LocalCluster) -> None:
    threads_before = _proxy_threads()
    proxy = FaultProxy(local_cluster)
    proxy.start()
    assert _proxy_threads() == threads_before + 1
    port = urlsplit(proxy.url).port
    assert port is not None
    assert _request(proxy, local_cluster, "/readyz").status == 200

    proxy.stop()
    proxy.stop()

    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert _proxy_threads() == threads_before
    assert proxy.drop_streams() == 0


class _Lines:
    """Reads a watch stream's lines in a thread, so a test can wait for the next one with a timeout
    without breaking the stream (a socket read that times out cannot be resumed)."""

    def __init__(self, resp: http.client.HTTPResponse) -> None:
        self.lines: queue.Queue[bytes] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(resp,), daemon=True)
        self._thread.start()

    def _read(self, resp: http.client.HTTPResponse) -> None:
        with contextlib.suppress(Exception):
            while line := resp.readline():
                self.lines.put(line)
        self.lines.put(b"")  # the end (or a broken connection)

    def until_name(self, name: str, *, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line, f"the watch stream ended before {name!r}"
            event: dict[str, Any] = json.loads(line)
            if event["object"]["metadata"].get("name") == name:
                return event


def _in_thread(fn: Callable[[], Reply]) -> queue.Queue[Reply | BaseException]:
    out: queue.Queue[Reply | BaseException] = queue.Queue()

    def run() -> None:
        try:
            out.put(fn())
        except BaseException as exc:
            out.put(exc)

    threading.Thread(target=run, daemon=True).start()
    return out


def test_blackhole_stalls_open_watches_until_lifted(proxy: FaultProxy, local_cluster: LocalCluster) -> None:
    """An existing-only blackhole: the open watch gets nothing (no event, no end) while a watch opened
    afterwards gets the same event; plain requests pass; once lifted, the held event arrives."""
    namespace = f"faultproxy-{uuid.uuid4().hex[:8]}"
    local_cluster.kubectl("create", "namespace", namespace)
    stack = contextlib.ExitStack()
    try:
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        rv = _request(proxy, local_cluster, path).json()["metadata"]["resourceVersion"]
        old = _Lines(_open_watch(proxy, local_cluster, f"{path}?watch=true&resourceVersion={rv}", stack))
        local_cluster.kubectl("create", "configmap", "before", "-n", namespace)
        old.until_name("before")

        hole = proxy.blackhole(Blackhole(new=False))
        fresh = _Lines(_open_watch(proxy, local_cluster, f"{path}?watch=true&resourceVersion={rv}", stack))
        assert _request(proxy, local_cluster, path).status == 200  # not a watch: passes
        local_cluster.kubectl("create", "configmap", "during", "-n", namespace)
        # The new connection is not held: the event reached the proxy...
        fresh.until_name("during")
        # ...and the stalled one shows nothing at all, not even its end.
        with pytest.raises(queue.Empty):
            old.lines.get(timeout=2)
        assert hole.stalled == 1
        assert hole.held == 0

        proxy.lift(hole)
        assert old.until_name("during")["type"] == "ADDED"
    finally:
        stack.close()
        local_cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_blackhole_holds_new_requests_until_lifted_or_expired(
    proxy: FaultProxy, local_cluster: LocalCluster
) -> None:
    """A blackhole for new requests (watch=None: plain GETs too) holds them before the apiserver; a
    client that gives up never got a byte, one that waits is answered once it lifts or expires."""
    target = "/api/v1/namespaces/default"
    hole = proxy.blackhole(Blackhole(watch=None, path="/default$", existing=False))
    assert _request(proxy, local_cluster, "/api/v1/namespaces/kube-system").status == 200

    conn = _connect(proxy, local_cluster, timeout=2)
    try:
        conn.request("GET", target, headers={"Accept": "application/json"})
        with pytest.raises(TimeoutError):
            conn.getresponse()
    finally:
        conn.close()
    waiting = _in_thread(lambda: _request(proxy, local_cluster, target))
    with pytest.raises(queue.Empty):
        waiting.get(timeout=1)
    assert _outcomes(proxy, target) == []  # nothing reached the apiserver
    assert hole.held == 2

    proxy.lift(hole)
    reply = waiting.get(timeout=60)
    assert isinstance(reply, Reply), reply
    assert reply.status == 200, reply
    assert _outcomes(proxy, target) == ["forwarded:200"]

    timed = proxy.blackhole(Blackhole(watch=None, seconds=1))
    reply = _in_thread(lambda: _request(proxy, local_cluster, target)).get(timeout=60)
    assert isinstance(reply, Reply), reply
    assert reply.status == 200, reply
    assert timed.held == 1

    with pytest.raises(ValueError, match="does nothing"):
        Blackhole(existing=False, new=False)
