"""Liveness and the HTTP endpoint: ``/healthz`` and ``/metrics`` on one port.

Kopf's watch streams can stop delivering events without failing (a half-open TCP connection, or a
watcher task that died: Kopf issues #1276 and #996). Liveness therefore proves the round trip: the
operator writes a heartbeat annotation on its peering object every ``heartbeat_interval`` seconds
and its own watch must bring it back. ``/healthz`` fails when the last heartbeat seen on the watch is
older than ``liveness_stale_after`` - unless this instance is the paused standby, whose watches Kopf
freezes on purpose.

The same patch response carries the peers' keep-alives (Kopf's peering status), from which the
operator tells whether it is the active instance: the live peer with the highest priority is; on a
tie Kopf pauses everyone, and so does this.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dra_api.names import PROJECT_DOMAIN
from dra_operator.kubeapi import KubeApi
from dra_operator.metrics import Metrics

logger = logging.getLogger(__name__)

HEARTBEAT_ANNOTATION = f"{PROJECT_DOMAIN}/heartbeat"


def _parse_time(text: str) -> float | None:
    for fmt in ("%Y-%m-%dT%H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S"):
        try:
            return datetime.datetime.strptime(text, fmt).replace(tzinfo=datetime.UTC).timestamp()
        except ValueError:
            continue
    return None


def is_active(*, peers: Mapping[str, Any], identity: str, priority: int, now: float) -> bool:
    """Kopf's rule seen from one peer: paused when another live peer has the same or a higher priority.

    ``peers`` is the peering object's ``status``: identity -> {priority, lifetime, lastseen}.
    """
    for other, info in peers.items():
        if other == identity or not isinstance(info, Mapping):
            continue
        lastseen = _parse_time(str(info.get("lastseen", "")).rstrip("Z").split("+")[0])
        lifetime = float(info.get("lifetime") or 0)
        if lastseen is None or lastseen + lifetime < now:
            continue  # a dead peer; Kopf ignores it too
        if int(info.get("priority") or 0) >= priority:
            return False
    return True


class Health:
    """Heartbeat bookkeeping, peering state, and the ``/healthz`` verdict."""

    def __init__(
        self,
        *,
        stale_after: float,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_enabled: bool = True,
    ) -> None:
        self.stale_after = stale_after
        self.clock = clock
        self.heartbeat_enabled = heartbeat_enabled
        self.started = clock()
        self.last_heartbeat_seen: float | None = None
        self.last_event: float | None = None
        self.sent: str | None = None
        self.active = not heartbeat_enabled
        """Whether this instance may allocate (peering says it is the active one)."""

    def event_seen(self) -> None:
        self.last_event = self.clock()

    def heartbeat_seen(self, value: str | None) -> None:
        self.event_seen()
        if value is not None and value == self.sent:
            self.last_heartbeat_seen = self.clock()

    def verdict(self) -> tuple[bool, str]:
        now = self.clock()
        if not self.heartbeat_enabled:
            return True, "ok (no heartbeat object; watch liveness not checked)"
        if not self.active:
            return True, "ok (standby: another instance is active)"
        reference = self.last_heartbeat_seen if self.last_heartbeat_seen is not None else self.started
        age = now - reference
        if age > self.stale_after:
            return (
                False,
                f"no heartbeat came back on the watch for {age:.0f} s (limit {self.stale_after:.0f} s)",
            )
        return True, f"ok (heartbeat seen {age:.0f} s ago)"


async def heartbeat_loop(
    *, health: Health, api: KubeApi, name: str, identity: str, priority: int, interval: float
) -> None:
    """Write the heartbeat and read the peers back, forever."""
    missing_reported = False
    while True:
        stamp = f"{time.time():.3f}"
        try:
            obj = await api.patch_peering(
                name=name, body={"metadata": {"annotations": {HEARTBEAT_ANNOTATION: f"{identity}@{stamp}"}}}
            )
        except Exception as exc:
            logger.warning("heartbeat to peering object %s failed: %s", name, exc)
            obj = None
        if obj is None and not missing_reported:
            missing_reported = True
            logger.warning(
                "peering object ClusterKopfPeering %s is missing or unreachable: staying paused. Apply "
                "crds/ and manifests/base/operator-peering.yaml, or run with --standalone=true",
                name,
            )
        if obj is not None:
            missing_reported = False
            health.sent = f"{identity}@{stamp}"
            peers = obj.get("status") or {}
            was = health.active
            health.active = identity in peers and is_active(
                peers=peers, identity=identity, priority=priority, now=time.time()
            )
            if was != health.active:
                logger.info("this instance is now %s", "active" if health.active else "standby")
        # Faster while not (yet) active, so a takeover happens soon after the peer's keep-alive lapses.
        await asyncio.sleep(interval if health.active else min(interval, 2.0))


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
