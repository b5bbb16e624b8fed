"""How the API server reaches the real nodes' kubelets (``kubectl logs``, ``exec``, ``port-forward``).

Node names do not resolve here, the machine's ``/etc/hosts`` is not the project's to edit, and the
kubelets listen on loopback ports. So the API server's egress selector (egress type ``cluster``,
``HTTPConnect`` over a unix socket) sends every connection to a node through :class:`NodeProxy`, a
CONNECT proxy that maps ``<node name>:<kubelet port>`` to ``127.0.0.1:<kubelet port>`` of the
node's kubelet and refuses every other target: it never connects anywhere but to a kubelet of this
cluster on loopback.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

_BUFFER = 65536


class NodeProxy:
    """A CONNECT proxy on a unix socket, in threads of the process that runs the cluster."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._routes: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def add_route(self, *, node: str, port: int) -> None:
        """Send CONNECTs to ``node:port`` to the kubelet on ``127.0.0.1:port``."""
        with self._lock:
            self._routes[(node, port)] = port

    def remove_routes(self, node: str) -> None:
        with self._lock:
            for key in [k for k in self._routes if k[0] == node]:
                del self._routes[key]

    def start(self) -> None:
        self.path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.path))
        server.listen(64)
        self._server = server
        self._thread = threading.Thread(
            target=accept_in_threads,
            args=(server, self._serve),
            kwargs={"alive": lambda: self._server is server},
            name="node-proxy",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        self.path.unlink(missing_ok=True)

    def _serve(self, client: socket.socket) -> None:
        with client:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 8192:
                chunk = client.recv(4096)
                if not chunk:
                    return
                head += chunk
            request, _, rest = head.partition(b"\r\n\r\n")
            method, _, target = request.split(b"\r\n", 1)[0].decode(errors="replace").partition(" ")
            authority = target.split(" ", 1)[0]
            host, _, port_text = authority.rpartition(":")
            with self._lock:
                port = self._routes.get((host, int(port_text))) if port_text.isdigit() else None
            if method != "CONNECT" or port is None:
                log.warning("node proxy: refusing %s %s (not a kubelet of this cluster)", method, authority)
                client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
            except OSError as exc:
                client.sendall(
                    f"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nX-Error: {exc}\r\n\r\n".encode()
                )
                return
            with upstream:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if rest:
                    upstream.sendall(rest)
                relay_both_ways(client, upstream)


def accept_in_threads(
    server: socket.socket, serve: Callable[[socket.socket], None], *, alive: Callable[[], bool]
) -> None:
    """Hand each connection ``server`` accepts to ``serve``, in a thread of its own, while ``alive()``
    (closing the server ends the loop too)."""
    while alive():
        try:
            client, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(client,), daemon=True).start()


def relay_both_ways(client: socket.socket, upstream: socket.socket) -> None:
    """Copy each side to the other until both have ended."""
    upstream.settimeout(None)
    pump = threading.Thread(target=copy_until_closed, args=(upstream, client), daemon=True)
    pump.start()
    copy_until_closed(client, upstream)
    pump.join()


def copy_until_closed(source: socket.socket, sink: socket.socket) -> None:
    """Relay one direction of a connection until its source ends, then end the sink's side."""
    try:
        while True:
            data = source.recv(_BUFFER)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def egress_selector_config(proxy_socket: Path) -> str:
    """The API server's EgressSelectorConfiguration: node traffic through the proxy's socket."""
    return (
        "apiVersion: apiserver.k8s.io/v1beta1\n"
        "kind: EgressSelectorConfiguration\n"
        "egressSelections:\n"
        "- name: cluster\n"
        "  connection:\n"
        "    proxyProtocol: HTTPConnect\n"
        "    transport:\n"
        "      uds:\n"
        f"        udsName: {proxy_socket}\n"
    )
