"""The agent's HTTP endpoint: ``/healthz`` (liveness), ``/readyz`` (serving), ``/metrics`` (Prometheus)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import prometheus_client
from aiohttp import web

logger = logging.getLogger(__name__)


def split_address(address: str) -> tuple[str, int]:
    """``":8081"`` -> ("0.0.0.0", 8081); ``"127.0.0.1:0"`` picks a free port."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics address {address!r}: expected HOST:PORT or :PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


class HttpEndpoints:
    """Serves the probes and metrics on ``address``; an empty address serves nothing."""

    def __init__(self, *, address: str) -> None:
        self.address = address
        self.ready = False
        self.not_ready_because: Callable[[], str | None] = lambda: None
        """Once started: why the agent is not ready yet (the kubelet has not registered a driver),
        or None. A rolling update waits on this before it stops the old agent."""
        self.port: int | None = None
        self._runner: web.AppRunner | None = None

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if not self.ready:
            return web.Response(status=503, text="starting\n")
        reason = self.not_ready_because()
        if reason is not None:
            return web.Response(status=503, text=f"{reason}\n")
        return web.Response(text="ok\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        body = prometheus_client.generate_latest()
        return web.Response(body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        if not self.address:
            return
        host, port = split_address(self.address)
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else port
        logger.info("serving /healthz, /readyz and /metrics on %s:%s", host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
