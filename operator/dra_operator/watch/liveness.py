"""Liveness and the HTTP endpoint: ``/healthz`` and ``/metrics`` on one port.

Kopf's watch streams can stop delivering events without failing (a half-open TCP connection, or a
watcher task that died: Kopf issues #1276 and #996). Liveness therefore proves the round trip: with
every keep-alive (see :mod:`dra_operator.watch.peering`) the operator writes a heartbeat annotation
``<identity>@<time>`` on its peering object, and its own Kopf watch must bring one back.
``/healthz`` fails when none came back for ``liveness_stale_after`` seconds, on the standby too: its
watches keep the model a takeover allocates from, so a standby whose watch went deaf is restarted
rather than left to take over with a stale model. Only an instance that writes no heartbeat (the
peering object is missing) is not checked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dra_operator.model.metrics import Metrics

logger = logging.getLogger(__name__)


class Health:
    """Heartbeat bookkeeping and the ``/healthz`` verdict."""

    def __init__(
        self,
        *,
        stale_after: float,
        identity: str = "",
        active: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_enabled: bool = True,
        writing: Callable[[], bool] = lambda: True,
    ) -> None:
        self.stale_after = stale_after
        self.identity = identity
        self._active = active
        self.clock = clock
        self.heartbeat_enabled = heartbeat_enabled
        self._writing = writing
        """Whether this instance writes heartbeats now (not while its peering object is missing)."""
        self.started = clock()
        self.last_heartbeat_seen: float | None = None
        self.last_event: float | None = None

    @property
    def active(self) -> bool:
        """Whether this instance may allocate (see :class:`dra_operator.watch.peering.Peering`)."""
        return self._active()

    def event_seen(self) -> None:
        self.last_event = self.clock()

    def heartbeat_seen(self, value: str | None) -> None:
        """A watch event of the peering object; ``value`` is its heartbeat annotation. Only this
        instance's own heartbeats prove that its watch delivers what it wrote."""
        self.event_seen()
        if value is not None and value.startswith(f"{self.identity}@"):
            self.last_heartbeat_seen = self.clock()

    def verdict(self) -> tuple[bool, str]:
        now = self.clock()
        if not self.heartbeat_enabled:
            return True, "ok (no heartbeat object; watch liveness not checked)"
        if not self._writing():
            self.started = now  # the wait for a heartbeat starts when writing it does
            return True, "ok (no heartbeat written: the peering object is missing)"
        role = "active" if self.active else "standby"
        reference = self.last_heartbeat_seen if self.last_heartbeat_seen is not None else self.started
        age = now - reference
        if age > self.stale_after:
            return (
                False,
                f"{role}: no heartbeat came back on the watch for {age:.0f} s "
                f"(limit {self.stale_after:.0f} s)",
            )
        return True, f"ok ({role}, heartbeat seen {age:.0f} s ago)"


def make_app(*, health: Health, metrics: Metrics) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        ok, text = health.verdict()
        return web.Response(status=200 if ok else 500, text=text + "\n")

    async def metrics_endpoint(_: web.Request) -> web.Response:
        # In the loop's thread: the collectors read the model, which only this thread changes.
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_endpoint)
    return app


async def serve(*, app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host=host, port=port)
    await site.start()
    logger.info("serving /healthz and /metrics on %s:%d", host, port)
    return runner
