"""The ComputeDomain controller: Kopf's watch events in, one domain at a time reconciled out.

Kopf's event handlers (``watch.cdwatch``) feed the state on both operator instances, and each event
marks the domains it concerns. The worker reconciles marked domains one at a time, only while this
instance is the active one (``watch.peering``): a standby keeps its state current and writes
nothing, and a takeover marks every domain, so a reconcile cut short by a failover is finished by
the new active instance. A domain whose reconcile asks to be looked at again (something it waits
for is not there yet), or failed, comes back after a delay that grows while it keeps failing.

Besides the events: every ``resync_s`` every domain is marked (a missed event cannot leave one
behind), and every ``label_sweep_s`` the node labels of domains that no longer exist are removed
(NVIDIA's controller sweeps them too: a node whose agent never released a deleted domain's label
would otherwise keep its daemon away from the next domain).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from dra_api import computedomains as cd
from dra_operator.computedomains.reconcile import Reconciler
from dra_operator.computedomains.state import DomainState

logger = logging.getLogger(__name__)

BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 60.0


class EventPoster(Protocol):
    def post(self, *, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


class DomainLister(Protocol):
    async def list_domains(self) -> list[dict[str, Any]]: ...

    async def remove_node_label(self, *, node: str, value: str) -> bool: ...


class DomainMetrics:
    """The controller's metrics, in the operator's registry."""

    def __init__(self, registry: CollectorRegistry, state: DomainState) -> None:
        self.domains = Gauge(
            "dra_operator_compute_domains",
            "ComputeDomains the operator knows, by status.status (Invalid: cannot be read).",
            ["status"],
            registry=registry,
        )
        self.errors = Counter(
            "dra_operator_compute_domain_reconcile_errors",
            "ComputeDomain reconciles that failed (retried with back-off).",
            registry=registry,
        )
        self.labels_removed = Counter(
            "dra_operator_compute_domain_stale_labels_removed",
            "Node labels of deleted ComputeDomains the sweep removed.",
            registry=registry,
        )
        for status in (cd.READY, cd.NOT_READY, "Invalid"):
            self.domains.labels(status).set_function(_counter(state, status))


def _counter(state: DomainState, status: str) -> Callable[[], float]:
    return lambda: _count(state, status)


def _count(state: DomainState, status: str) -> float:
    if status == "Invalid":
        return float(len(state.invalid))
    return float(sum(1 for d in state.domains.values() if d.status == status))


class ComputeDomainController:
    """Marks, the worker, the sweeps; ``reconciler`` does the work of one domain."""

    def __init__(
        self,
        *,
        state: DomainState,
        reconciler: Reconciler,
        api: DomainLister,
        events: EventPoster,
        active: Callable[[], bool],
        metrics: DomainMetrics | None = None,
        resync_s: float = 60.0,
        label_sweep_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.reconciler = reconciler
        self.api = api
        self.events = events
        self.active = active
        self.metrics = metrics
        self.resync_s = resync_s
        self.label_sweep_s = label_sweep_s
        self.clock = clock
        self._due: dict[str, float] = {}  # uid -> when to reconcile it
        self._failures: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._told: dict[tuple[str, str], str] = {}  # (uid, reason) -> message last posted

    # -- inputs (Kopf's handlers) -------------------------------------------------------------------

    def mark(self, uids: set[str], *, after: float = 0.0) -> None:
        now = self.clock()
        for uid in uids:
            if uid not in self.state.domains:
                continue
            when = now + after
            self._due[uid] = min(self._due.get(uid, when), when)
        if uids:
            self._wake.set()

    def domain_event(self, kind: str | None, obj: Mapping[str, Any]) -> None:
        self.mark(self.state.domain_event(kind, obj))

    def clique_event(self, kind: str | None, obj: Mapping[str, Any]) -> None:
        self.mark(self.state.clique_event(kind, obj))

    def pod_event(self, kind: str | None, obj: Mapping[str, Any]) -> None:
        self.mark(self.state.pod_event(kind, obj))

    def node_event(self, kind: str | None, obj: Mapping[str, Any]) -> None:
        self.mark(self.state.node_event(kind, obj))

    def tell(self, domain: cd.ComputeDomain, type_: str, reason: str, message: str) -> None:
        """An Event about ``domain``, posted once while its message stays the same."""
        if self._told.get((domain.uid, reason)) == message:
            return
        self._told[(domain.uid, reason)] = message
        (logger.warning if type_ == "Warning" else logger.info)("%s", message)
        self.events.post(involved=domain.involved(), type_=type_, reason=reason, message=message)

    # -- the worker ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Reconcile due domains while active; mark all on becoming active and every resync."""
        was_active = False
        last_resync = last_sweep = self.clock()
        while True:
            active = self.active()
            now = self.clock()
            if active and not was_active:
                logger.info(
                    "ComputeDomain controller active: looking at all %d domains", len(self.state.domains)
                )
                self.mark(set(self.state.domains))
            was_active = active
            if now - last_resync >= self.resync_s:
                last_resync = now
                self.mark(set(self.state.domains))
            if active and now - last_sweep >= self.label_sweep_s:
                last_sweep = now
                await self._guarded(self.sweep_labels(), what="node label sweep")
            if active:
                await self._run_due()
            await self._sleep()

    async def _run_due(self) -> None:
        now = self.clock()
        for uid in [u for u, when in sorted(self._due.items(), key=lambda i: i[1]) if when <= now]:
            if not self.active():
                return
            self._due.pop(uid, None)
            try:
                again = await self.reconciler.reconcile(uid)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures = self._failures.get(uid, 0) + 1
                self._failures[uid] = failures
                delay = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** (failures - 1))
                logger.warning(
                    "ComputeDomain %s: reconcile failed (%s); again in %.0f s", uid, _text(exc), delay
                )
                if self.metrics is not None:
                    self.metrics.errors.inc()
                self.mark({uid}, after=delay)
                continue
            self._failures.pop(uid, None)
            if again is not None:
                self.mark({uid}, after=again)
            if uid not in self.state.domains:
                self._forget(uid)

    def _forget(self, uid: str) -> None:
        for key in [k for k in self._told if k[0] == uid]:
            del self._told[key]

    async def _sleep(self) -> None:
        now = self.clock()
        next_due = min(self._due.values(), default=now + 1.0)
        delay = max(0.05, min(1.0, next_due - now))
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=delay)

    async def _guarded(self, work: Any, *, what: str) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("ComputeDomain %s failed: %s", what, _text(exc))

    async def sweep_labels(self) -> int:
        """Remove the domain label of nodes whose domain does not exist (asked of the API server,
        not the cache, so a domain the watch has not shown yet keeps its nodes); returns how many."""
        labelled = dict(self.state.node_labels)
        if not labelled:
            return 0
        existing = {
            str((obj.get("metadata") or {}).get("uid") or "") for obj in await self.api.list_domains()
        }
        removed = 0
        for node, value in sorted(labelled.items()):
            if value in existing:
                continue
            if await self.api.remove_node_label(node=node, value=value):
                removed += 1
                logger.info(
                    "node %s: removed the label of ComputeDomain %s, which no longer exists", node, value
                )
        if removed and self.metrics is not None:
            self.metrics.labels_removed.inc(removed)
        return removed


def _text(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__
