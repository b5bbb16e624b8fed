"""A fault-injecting HTTPS proxy in front of the local control plane's real kube-apiserver.

Integration tests point the process under test (an operator, an agent) at :attr:`FaultProxy.kubeconfig`
instead of the admin kubeconfig. Every request the proxy does not fault is forwarded unchanged to the
real apiserver of a :class:`~dra_devcluster.LocalCluster` and the real response is streamed
back chunk by chunk, so lists, writes and long-lived watches behave exactly as against the apiserver
itself. A test adds :class:`Fault` rules to make chosen requests fail: a Kubernetes Status error
(503, 429 with Retry-After, ...), a connection reset with no response, or a watch that ends at once
with "410 Expired" (resource version too old). :meth:`FaultProxy.drop_streams` cuts every open watch,
as an apiserver restart would. A :class:`Blackhole` stalls connections silently: the streams it holds
stay open but carry nothing more (no bytes, no end) until it is lifted, as behind a network path that
drops packets; it can hold new requests too. :meth:`FaultProxy.records` tells what happened to each
request.

It is not a fake API server: nothing is answered from the proxy except the injected faults.

The proxy runs its own asyncio loop in a daemon thread and its public API is synchronous and
thread-safe, because the tests that use it are plain pytest functions driving subprocesses.

Identity: the proxy does not ask clients for certificates. Requests that carry an ``Authorization``
header (bearer tokens) are forwarded over a connection without a client certificate, so the apiserver
authenticates the token's own identity; all others go up with the admin client certificate. Loopback
only, test clusters only. Upgrade requests (exec, port-forward) are not supported.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

import aiohttp
import yaml
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from dra_devcluster.cluster import LocalCluster

log = logging.getLogger(__name__)

_T = TypeVar("_T")

FaultAction = Literal["status", "reset", "gone"]
_ACTIONS: frozenset[str] = frozenset({"status", "reset", "gone"})

# Hop-by-hop headers belong to one connection, not to the request. Accept-Encoding is dropped too so
# the apiserver never compresses and chunks can be relayed as they come.
_DROP_UPSTREAM = frozenset(
    h.lower()
    for h in (
        "Host",
        "Connection",
        "Transfer-Encoding",
        "Content-Length",
        "Keep-Alive",
        "Upgrade",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Accept-Encoding",
    )
)
# aiohttp frames the response itself (chunked) and has already decompressed anything compressed.
_DROP_DOWNSTREAM = frozenset(
    h.lower() for h in ("Content-Length", "Transfer-Encoding", "Connection", "Content-Encoding", "Keep-Alive")
)

# Kubernetes StatusReason for the codes a test is likely to inject (k8s.io/apimachinery metav1).
_REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Gone",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    502: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

# The legacy watch paths (/api/v1/watch/..., /apis/<group>/<version>/watch/...) are watches too.
_LEGACY_WATCH_PATH = re.compile(r"^/(?:api/[^/]+|apis/[^/]+/[^/]+)/watch/")

_GONE_EVENT = (
    json.dumps(
        {
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
        },
        separators=(",", ":"),
    )
    + "\n"
).encode()

_serial = itertools.count(1)


@dataclass
class Fault:
    """A rule: which requests to fault and how.

    ``status`` answers with HTTP ``code`` and a Kubernetes Status body (plus ``Retry-After`` when
    ``retry_after`` is set); ``reset`` aborts the client's connection without any response; ``gone``
    (watch requests only) answers 200 with one ERROR event, 410 Expired, and ends the stream.
    ``methods`` (upper-cased here), ``path`` (``re.search`` against the URL path) and ``watch``
    narrow the match; ``None`` matches anything. ``count`` limits how many requests are faulted;
    ``hits`` counts them (written by the proxy).
    """

    action: FaultAction
    code: int = 503
    retry_after: int | None = None
    methods: frozenset[str] | None = None
    path: str | None = None
    watch: bool | None = None
    count: int | None = None
    hits: int = 0

    def __post_init__(self) -> None:
        if self.action not in _ACTIONS:
            raise ValueError(f"unknown fault action {self.action!r}; expected one of {sorted(_ACTIONS)}")
        if self.action == "gone" and self.watch is False:
            raise ValueError("a 'gone' fault applies to watch requests only; watch=False never matches")
        if self.count is not None and self.count < 0:
            raise ValueError(f"count must be >= 0, not {self.count}")
        if self.methods is not None:
            self.methods = frozenset(m.upper() for m in self.methods)
        if self.path is not None:
            # Compiled now so a bad pattern fails in the test that wrote it, not in the proxy's thread.
            re.compile(self.path)

    @property
    def exhausted(self) -> bool:
        return self.count is not None and self.hits >= self.count

    def matches(self, method: str, path: str, watch: bool) -> bool:
        if self.exhausted:
            return False
        if self.methods is not None and method.upper() not in self.methods:
            return False
        # A 410 ERROR event is meaningless outside a watch stream.
        wants_watch = True if self.action == "gone" else self.watch
        if wants_watch is not None and wants_watch != watch:
            return False
        return self.path is None or re.search(self.path, path) is not None


@dataclass(eq=False)
class Blackhole:
    """A silent stall: matching connections stay open and carry nothing until the blackhole lifts.

    ``existing``: responses already being relayed when it is added stop there; what the apiserver
    sends afterwards (events, bookmarks, the end of the stream) waits in the proxy, so the client
    sees a connection that is neither alive nor closed. ``new``: requests that arrive while it is
    in place are held before they reach the apiserver (a held write has not happened). Lifting it
    (:meth:`FaultProxy.lift`, :meth:`FaultProxy.clear`, or ``seconds`` after it was added) lets
    both go on where they stopped, unless the client hung up meanwhile.

    ``watch`` is True for watch requests only (the default), False for all others, None for both;
    ``methods`` and ``path`` narrow the match as in :class:`Fault`. ``stalled`` counts the
    connections it stopped and ``held`` the new requests it held (written by the proxy).
    """

    watch: bool | None = True
    methods: frozenset[str] | None = None
    path: str | None = None
    existing: bool = True
    new: bool = True
    seconds: float | None = None
    stalled: int = 0
    held: int = 0
    # Set by FaultProxy.blackhole(): when the blackhole lifts by itself, and which streams it finds
    # open (those opened before it, see _Stream.serial).
    until: float | None = field(default=None, init=False)
    since: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not (self.existing or self.new):
            raise ValueError("a blackhole that holds neither existing nor new connections does nothing")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError(f"seconds must be > 0, not {self.seconds}")
        if self.methods is not None:
            self.methods = frozenset(m.upper() for m in self.methods)
        if self.path is not None:
            re.compile(self.path)

    def matches(self, method: str, path: str, watch: bool) -> bool:
        if self.methods is not None and method.upper() not in self.methods:
            return False
        if self.watch is not None and self.watch != watch:
            return False
        return self.path is None or re.search(self.path, path) is not None


@dataclass(frozen=True)
class RequestRecord:
    """One request as the proxy saw it.

    ``outcome`` is ``forwarded:<status>``, ``injected:<code>``, ``injected:reset``,
    ``injected:gone``, or ``upstream-error:502`` when the apiserver could not be reached.
    """

    at: float
    method: str
    path: str
    query: str
    watch: bool
    outcome: str


@dataclass(eq=False)
class _Stream:
    """A forwarded watch being relayed; lives on the proxy's loop only."""

    copy: asyncio.Task[None]
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    abort: bool = False


@dataclass(frozen=True)
class _Conn:
    """What a blackhole matches a request or a relayed response by. ``serial`` orders responses
    against blackholes: a blackhole holds the responses that began before it (``existing``)."""

    method: str
    path: str
    watch: bool
    serial: int


def _is_watch_request(path: str, query: Mapping[str, str]) -> bool:
    value = query.get("watch", "").lower()
    return value in ("true", "1") or _LEGACY_WATCH_PATH.match(path) is not None


def _status_body(code: int, reason: str, message: str, *, retry_after: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if retry_after is not None:
        # The apiserver puts it here too when it sends Retry-After (e.g. with 429).
        body["details"] = {"retryAfterSeconds": retry_after}
    return body


def _status_response(code: int, message: str, *, retry_after: int | None = None) -> web.Response:
    reason = _REASONS.get(code, "Unknown")
    headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
    return web.Response(
        status=code,
        body=json.dumps(_status_body(code, reason, message, retry_after=retry_after)).encode(),
        content_type="application/json",
        headers=headers,
    )


class FaultProxy:
    """HTTPS proxy on 127.0.0.1 to ``cluster``'s apiserver; see the module docstring.

    Single use: :meth:`start` once, :meth:`stop` (idempotent) when done, or use it as a context manager.
    """

    def __init__(self, cluster: LocalCluster) -> None:
        self._cluster = cluster
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._records: list[RequestRecord] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = False
        self._port = 0
        self._kubeconfig: Path | None = None
        # Owned by the proxy's loop thread.
        self._runner: web.ServerRunner | None = None
        self._with_cert: aiohttp.ClientSession | None = None
        self._without_cert: aiohttp.ClientSession | None = None
        self._streams: set[_Stream] = set()
        self._blackholes: list[Blackhole] = []
        # Replaced (and the old one set) whenever the blackholes change, to wake what they hold.
        self._blackholes_changed = asyncio.Event()
        self._serials = itertools.count(1)

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Bind a free loopback port and serve; returns once the proxy accepts connections."""
        with self._lock:
            if self._started:
                raise RuntimeError("a FaultProxy is single use: start() was already called")
            self._started = True
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=self._run_loop, args=(loop,), name=f"faultproxy-{next(_serial)}", daemon=True
        )
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            self._call(self._astart())
            self._kubeconfig = self.kubeconfig_via(self._cluster.kubeconfig)
        except BaseException:
            self.stop()
            raise
        log.info("fault proxy %s -> %s", self.url, self._cluster.server)

    def stop(self) -> None:
        """End open streams, close the server and the upstream sessions, and join the thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = None
        if loop is None or thread is None:
            return
        try:
            if loop.is_running():
                asyncio.run_coroutine_threadsafe(self._astop(), loop).result(timeout=30)
        except Exception:
            log.exception("fault proxy did not shut down cleanly")
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)

    @property
    def url(self) -> str:
        if not self._port:
            raise RuntimeError("the fault proxy is not started")
        return f"https://127.0.0.1:{self._port}"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig with its server replaced by :attr:`url`."""
        if self._kubeconfig is None:
            raise RuntimeError("the fault proxy is not started")
        return self._kubeconfig

    def kubeconfig_via(self, source: Path) -> Path:
        """Write a copy of any kubeconfig of this cluster (e.g. a token one) that goes through the proxy."""
        doc = yaml.safe_load(source.read_text())
        for entry in doc.get("clusters", []):
            entry["cluster"]["server"] = self.url
        path = self._cluster.workdir / f"faultproxy-{self._port}-{next(_serial)}-{source.stem}.kubeconfig"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        path.chmod(0o600)
        return path

    # -- faults and records --------------------------------------------------------------------

    def add(self, fault: Fault) -> Fault:
        """Append a rule; the first matching rule with count left wins. Returns ``fault``."""
        with self._lock:
            self._faults.append(fault)
        return fault

    def remove(self, fault: Fault) -> None:
        """Remove this very rule (by identity); absent is fine."""
        with self._lock:
            self._faults = [f for f in self._faults if f is not fault]

    def clear(self) -> None:
        """Remove every fault and lift every blackhole."""
        with self._lock:
            self._faults.clear()
            lifted, self._blackholes = self._blackholes, []
        if lifted:
            self._wake_held()

    def blackhole(self, hole: Blackhole | None = None) -> Blackhole:
        """Put a :class:`Blackhole` in place now (a default one: every watch, existing and new);
        returns it. Responses already relayed to their end are not affected."""
        hole = hole if hole is not None else Blackhole()
        with self._lock:
            hole.since = next(self._serials)
            hole.until = None if hole.seconds is None else time.monotonic() + hole.seconds
            self._blackholes.append(hole)
        return hole

    def lift(self, hole: Blackhole) -> None:
        """Remove this very blackhole; what it held goes on. Absent (or already expired) is fine."""
        with self._lock:
            self._blackholes = [b for b in self._blackholes if b is not hole]
        self._wake_held()

    def _wake_held(self) -> None:
        with self._lock:
            changed, self._blackholes_changed = self._blackholes_changed, asyncio.Event()
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(changed.set)

    def records(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    def drop_streams(self, *, abort: bool = False) -> int:
        """End every open watch stream now and return how many there were.

        By default each ends cleanly (the final chunk is sent), as when the apiserver closes a
        watch; with ``abort`` the client connections are cut instead, as on a network failure.
        Returns after the streams have ended.
        """
        if self._loop is None:
            return 0
        return self._call(self._drop_streams(abort=abort))

    # -- loop thread ---------------------------------------------------------------------------

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            # Let whatever is left (connection closers, cancelled handlers) finish before closing.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _call(self, coro: Coroutine[Any, Any, _T], *, timeout: float = 30) -> _T:
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the fault proxy is not running")
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("FaultProxy's synchronous API cannot be called from its own loop")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=timeout)

    def _upstream_ssl(self, *, client_cert: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self._cluster.ca_file))
        if client_cert:
            # LocalCluster has no public accessor for its PKI; reading it here keeps cluster.py as is.
            pki = self._cluster._pki
            assert pki is not None, "the cluster is not started"
            ctx.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
        return ctx

    def _session(self, *, client_cert: bool) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._upstream_ssl(client_cert=client_cert), limit=0),
            # Watches stay open for many minutes and may be idle all along: no total or read timeout.
            timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_connect=10, sock_read=None),
            # Forward what the client sent and nothing aiohttp would add on its own.
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def _astart(self) -> None:
        pki = self._cluster._pki  # see _upstream_ssl
        assert pki is not None, "the cluster is not started"
        # The apiserver's own serving certificate names 127.0.0.1, so clients keep the cluster CA.
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(str(pki.apiserver.cert), str(pki.apiserver.key))
        self._with_cert = self._session(client_cert=True)
        self._without_cert = self._session(client_cert=False)
        # handler_cancellation: a client that hangs up ends its handler, which closes the upstream watch.
        server = web.Server(self._handle, handler_cancellation=True)
        self._runner = web.ServerRunner(server, shutdown_timeout=2.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock, ssl_context=server_ssl).start()

    async def _astop(self) -> None:
        await self._drop_streams(abort=False)
        if self._runner is not None:
            await self._runner.cleanup()
        for session in (self._with_cert, self._without_cert):
            if session is not None:
                await session.close()

    async def _drop_streams(self, *, abort: bool) -> int:
        streams = list(self._streams)
        for stream in streams:
            stream.abort = abort
            stream.copy.cancel()
        if streams:
            waits = [asyncio.ensure_future(s.ended.wait()) for s in streams]
            _, late = await asyncio.wait(waits, timeout=10)
            for wait in late:
                wait.cancel()
        return len(streams)

    # -- requests ------------------------------------------------------------------------------

    def _take_fault(self, method: str, path: str, watch: bool) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path, watch):
                    fault.hits += 1
                    return fault
        return None

    def _record(self, request: web.BaseRequest, at: float, watch: bool, outcome: str) -> None:
        record = RequestRecord(
            at=at,
            method=request.method,
            path=request.path,
            query=request.query_string,
            watch=watch,
            outcome=outcome,
        )
        with self._lock:
            self._records.append(record)

    def _holding(
        self, conn: _Conn, *, new: bool, counted: set[int]
    ) -> tuple[float | None, asyncio.Event] | None:
        """Whether a blackhole holds ``conn`` now: None if not, else when the first of those that
        hold it expires by itself (None: never) and the event that signals a change. Counts each
        blackhole once per connection (``counted``: the ids already counted)."""
        now = time.monotonic()
        with self._lock:
            self._blackholes = [b for b in self._blackholes if b.until is None or b.until > now]
            holding = [
                b
                for b in self._blackholes
                if b.matches(conn.method, conn.path, conn.watch)
                and (b.new if new else b.existing and conn.serial < b.since)
            ]
            for b in holding:
                if id(b) not in counted:
                    counted.add(id(b))
                    if new:
                        b.held += 1
                    else:
                        b.stalled += 1
            changed = self._blackholes_changed
        if not holding:
            return None
        ends = [b.until for b in holding if b.until is not None]
        return (min(ends) if len(ends) == len(holding) else None), changed

    async def _pass_blackholes(self, conn: _Conn, *, new: bool) -> None:
        """Return once no blackhole holds ``conn`` (at once when none does)."""
        counted: set[int] = set()
        while (held := self._holding(conn, new=new, counted=counted)) is not None:
            until, changed = held
            timeout = None if until is None else max(0.0, until - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        at = time.monotonic()
        watch = _is_watch_request(request.path, request.query)
        conn = _Conn(request.method, request.path, watch, next(self._serials))
        # A held request waits here, before anything reaches the apiserver or the client; the
        # client hanging up meanwhile cancels this handler (handler_cancellation).
        await self._pass_blackholes(conn, new=True)
        # Responses that begin from here on are held only by blackholes added later.
        conn = _Conn(request.method, request.path, watch, next(self._serials))
        fault = self._take_fault(request.method, request.path, watch)
        if fault is None:
            return await self._forward(request, at=at, conn=conn)
        if fault.action == "reset":
            self._record(request, at, watch, "injected:reset")
            if request.transport is not None:
                request.transport.abort()
            # Never reaches the client; aiohttp drops it on the closed transport.
            return web.Response(status=500)
        if fault.action == "gone":
            self._record(request, at, watch, "injected:gone")
            return web.Response(status=200, body=_GONE_EVENT, content_type="application/json")
        self._record(request, at, watch, f"injected:{fault.code}")
        return _status_response(
            fault.code,
            f"injected by faultproxy: {request.method} {request.path} -> {fault.code}",
            retry_after=fault.retry_after,
        )

    async def _forward(self, request: web.BaseRequest, *, at: float, conn: _Conn) -> web.StreamResponse:
        watch = conn.watch
        headers: CIMultiDict[str] = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in _DROP_UPSTREAM
        )
        # Read the stream directly: request.read() caps bodies at 1 MiB, the apiserver at 3 MiB.
        body = await request.content.read() if request.body_exists else None
        session = self._without_cert if "Authorization" in request.headers else self._with_cert
        assert session is not None
        # encoded=True: forward the path and query byte for byte, without re-quoting.
        url = URL(self._cluster.server + request.raw_path, encoded=True)
        try:
            upstream = await session.request(
                request.method, url, headers=headers, data=body, allow_redirects=False
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            self._record(request, at, watch, "upstream-error:502")
            return _status_response(502, f"faultproxy: the apiserver could not be reached: {err!r}")
        clean = False
        try:
            self._record(request, at, watch, f"forwarded:{upstream.status}")
            response = web.StreamResponse(
                status=upstream.status,
                reason=upstream.reason,
                headers=_downstream_headers(upstream.headers.items()),
            )
            await response.prepare(request)
            stream = _Stream(
                copy=asyncio.create_task(
                    _relay(upstream, response, gate=lambda: self._pass_blackholes(conn, new=False))
                )
            )
            if watch:
                self._streams.add(stream)
            try:
                try:
                    await asyncio.wait({stream.copy})
                finally:
                    self._streams.discard(stream)
                    # Our handler itself was cancelled (client gone, shutdown): stop relaying too.
                    stream.copy.cancel()
                if stream.copy.cancelled() and not stream.abort:
                    await response.write_eof()
                elif stream.copy.cancelled() or stream.copy.exception() is not None:
                    # Upstream broke mid-body (or drop_streams(abort=True)): cut the client off too, so
                    # a truncated body cannot pass for a complete one.
                    if request.transport is not None:
                        request.transport.abort()
                else:
                    await response.write_eof()
                    clean = True
            finally:
                # drop_streams() returns only once the client has been sent the end.
                stream.ended.set()
            return response
        finally:
            # A fully read response returns its connection to the pool; anything else closes it.
            if clean:
                upstream.release()
            else:
                upstream.close()


def _downstream_headers(items: Iterable[tuple[str, str]]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in items if k.lower() not in _DROP_DOWNSTREAM)


async def _relay(
    upstream: aiohttp.ClientResponse,
    response: web.StreamResponse,
    *,
    gate: Callable[[], Awaitable[None]],
) -> None:
    """Copy the body; ``gate`` before each chunk and before the end (clean or broken), so a
    blackhole stops the stream where it is and shows the client neither data nor an end."""
    try:
        async for chunk in upstream.content.iter_any():
            await gate()
            await response.write(chunk)
    except (aiohttp.ClientError, OSError):
        await gate()
        raise
    await gate()


__all__ = ["Blackhole", "Fault", "FaultAction", "FaultProxy", "RequestRecord"]
