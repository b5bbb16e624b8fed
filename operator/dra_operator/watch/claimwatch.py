"""ResourceClaims are watched here, not through Kopf.

Claims are the operator's hot path: every allocation brings three claim events (creation, the
finalizer, the allocation). Kopf runs each event through its cause detection, diff-base and
progress bookkeeping (deep copies of the object), which the operator does not use for claims: it
only needs the object. In the allocation benchmark that machinery was about a third of the
operator's CPU, so claims get a plain list-then-watch loop of their own (what client-go calls a
reflector); Kopf keeps the other resources, the peering and the probes.

The loop: list the claims into the model (one consistent snapshot, in pages, each applied as it
comes), then watch from the listing's resourceVersion with bookmarks, resuming from the last
version seen when the server ends the stream or the connection drops. On 410 Gone the version is
too old: list again, which also drops claims deleted during the gap
(:meth:`ClaimReconciler.list_for_watch`), and ask for a re-list of the other resources, whose
watches most likely had the same gap. Failures back off exponentially.

It runs on the standby instance too: its model stays current, and the claim worker, not the
watch, is what the peering pauses. A watch that hangs without failing (a silent TCP stall: no data,
no end) is dropped when nothing, not even a bookmark, came for ``watch_inactivity_timeout_s``, and
resumes from the last version seen; ``watch_client_timeout_s`` is the backstop for a stream the
server never ends. Every restart is counted in ``dra_operator_watch_restarts_total`` by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from dra_operator.base.settings import Settings
from dra_operator.claims.coordinator import ClaimReconciler
from dra_operator.client.errors import Expired, WatchInactive, error_text
from dra_operator.client.kubeapi import KubeApi
from dra_operator.model.metrics import Metrics
from dra_operator.watch.liveness import Health

logger = logging.getLogger(__name__)

RESOURCE = "resourceclaims"


class ClaimWatch:
    """Keeps the model's claims current from a watch, and feeds each event to the reconciler."""

    def __init__(
        self,
        *,
        api: KubeApi,
        claims: ClaimReconciler,
        health: Health,
        metrics: Metrics,
        settings: Settings,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.api = api
        self.claims = claims
        self.health = health
        self.metrics = metrics
        self.settings = settings
        self.sleep = sleep
        self.version: str | None = None
        """The resourceVersion to resume from; None when the next step is a listing."""
        self.listings = 0

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                if await self.step():
                    failures = 0
                else:
                    failures += 1
            except asyncio.CancelledError:
                raise
            except Expired as exc:
                logger.info("the claim watch expired (%s); listing claims again", " ".join(str(exc).split()))
                self.metrics.watch_restarts.labels(RESOURCE, "expired").inc()
                self.version = None
                failures += 1
            except WatchInactive as exc:
                # Not a failure of the server: reconnect at once (a new connection takes another
                # path through a NAT or proxy that dropped this one).
                logger.warning(
                    "the claim watch went silent (%s); dropped it, resuming from resourceVersion %s",
                    exc,
                    self.version,
                )
                self.metrics.watch_restarts.labels(RESOURCE, "inactive").inc()
                failures = 0
            except Exception as exc:
                self.metrics.watch_restarts.labels(RESOURCE, "error").inc()
                failures += 1
                logger.warning(
                    "the claim watch failed (%s); resuming in %.1f s", error_text(exc), _delay(failures)
                )
            if failures:
                await self.sleep(_delay(failures))

    async def step(self) -> bool:
        """List if needed, then watch until the stream ends. Whether it made progress (events, or
        a stream that lasted), as opposed to ending at once, which backs off like a failure."""
        if self.version is None:
            self.version = await self.claims.list_for_watch(RESOURCE)
            self.listings += 1
            if self.listings > 1 and self.claims.synced.is_set():
                # A gap in this watch: the others likely had one too (see Relister.watch_relisted).
                self.claims.request_relist()
        started, events = time.monotonic(), 0
        settings = self.settings
        counted = self.metrics.watch_events.labels(RESOURCE)  # looked up once, not per event
        stream = self.api.watch(
            RESOURCE,
            resource_version=self.version,
            server_timeout_s=int(settings.watch_server_timeout_s),
            client_timeout_s=settings.watch_client_timeout_s,
            connect_timeout_s=settings.watch_connect_timeout_s,
            inactivity_timeout_s=settings.watch_inactivity_timeout_s,
        )
        async with contextlib.aclosing(stream):
            async for kind, obj in stream:
                events += 1
                version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                if kind != "BOOKMARK":
                    counted.inc()
                    self.health.event_seen()
                    self.claims.on_claim_event(obj, deleted=kind == "DELETED")
                if version:
                    self.version = version
        self.metrics.watch_restarts.labels(RESOURCE, "closed").inc()
        return events > 0 or time.monotonic() - started >= 1.0


def _delay(failures: int) -> float:
    return min(30.0, 0.5 * 2.0 ** (failures - 1))
