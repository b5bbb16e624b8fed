"""The ResourceClaim lifecycle: allocate the claims the operator owns, deallocate and clean up.

One worker drains a queue of claims that need attention. Claims are queued by watch events (the
claim's own, and - for claims that could not be allocated - any change of slices, classes, nodes or
of other claims' allocations), never by polling.

Allocating a claim:

1. place it on the model (the allocator), and hold the chosen devices in the model (``assume``)
   before the first ``await``, so that no other placement can take them;
2. add the operator's finalizer with a merge patch carrying ``metadata.resourceVersion``;
3. write ``status.allocation`` the same way.

Claims are reconciled in tasks of their own, up to ``Settings.max_concurrent_writes`` at once, so
the API round trips of different claims overlap. Step 1 has no ``await`` in it, so placements still
happen one at a time against a model that holds every claim in flight's devices: claims written
together never share a device. A write that fails forgets its claim's assumed devices.

While pods wait for kube-scheduler, which allocates from the same devices, a placement goes ahead
only if kube-scheduler cannot reach its devices before it runs out of pods (see
:mod:`dra_operator.reconcile.contention`); otherwise the claim waits, with a condition and one Event
saying so, and is placed again when pods, claims or devices change.

A 409 Conflict means someone changed the claim first (kube-scheduler allocating it, a user editing
it): the claim is read again and reconsidered; a device is never written into two claims by this
operator. A claim that cannot be allocated gets a Warning Event and a condition in the annotation
``dra.accel.dev/condition`` (ResourceClaim status has no conditions of its own); our finalizer is
not left behind on it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_api.model import AllocationResult, ModelError, ResourceClaim
from dra_api.names import OPERATOR_FINALIZER, PROJECT_DOMAIN
from dra_operator.clustermodel import ClaimKey, ClusterModel, DeviceID, InvalidClaim, claim_key_of
from dra_operator.events import EventSink
from dra_operator.kubeapi import (
    Conflict,
    Gone,
    KubeApi,
    Listing,
    NotActive,
    error_cause,
    error_text,
    retry_after,
    transient,
)
from dra_operator.logthrottle import LogThrottle, held_back
from dra_operator.metrics import Metrics
from dra_operator.placement import Placement, Placer, Unallocatable
from dra_operator.planner import SPREAD
from dra_operator.reconcile.backoff import Backoff
from dra_operator.reconcile.contention import (
    PARKED_RETRY_WINDOW_S,
    Clearance,
    Crowded,
    SchedulerDemand,
    scheduler_demand,
)
from dra_operator.reconcile.ownership import allocated_by_us, generated_from_template, is_ours
from dra_operator.settings import Settings

logger = logging.getLogger(__name__)

CONDITION_ANNOTATION = f"{PROJECT_DOMAIN}/condition"
CONDITION_TYPE = "Allocated"
WAITING_REASON = "WaitingForScheduler"
RECHECK_DELAY_S = 0.1
"""Claims waiting for kube-scheduler are placed again this long after a change of pods, claims or
devices: one try for a burst of changes."""
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
RELIST_KINDS = ("deviceclasses", "resourceslices", "resourceclaims", "nodes", "pods")


def condition_json(*, status: str, reason: str, message: str, now: str | None = None) -> str:
    """A metav1.Condition, as JSON, for the claim's condition annotation."""
    return json.dumps(
        {
            "type": CONDITION_TYPE,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now or _now(),
        },
        separators=(",", ":"),
    )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _age_seconds(created: str, *, now: float) -> float | None:
    try:
        stamp = datetime.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None
    return max(0.0, now - stamp.timestamp())


def validate_claim(
    claim: ResourceClaim, *, known_drivers: set[str], compiler: Callable[[str], object] | None = None
) -> Unallocatable | None:
    """Checks made before placement, for messages that name the field: request selectors that do
    not compile, and opaque configuration for drivers nobody runs."""
    if compiler is not None:
        for i, request in enumerate(claim.spec.requests):
            specs = [(f"spec.devices.requests[{i}].exactly", request.exactly)] if request.exactly else []
            specs += [
                (f"spec.devices.requests[{i}].firstAvailable[{j}]", sub.spec)
                for j, sub in enumerate(request.first_available)
            ]
            for path, spec in specs:
                assert spec is not None
                for k, selector in enumerate(spec.selectors):
                    expression = selector.cel
                    if expression is None:
                        continue
                    try:
                        compiler(expression)
                    except Exception as exc:
                        return Unallocatable(
                            reason="InvalidSelector",
                            message=f"ResourceClaim {claim.ref}: {path}.selectors[{k}].cel.expression "
                            f"{expression!r} does not compile: {' '.join(str(exc).split())}",
                        )
    for i, config in enumerate(claim.spec.config):
        if config.opaque is not None and config.opaque.driver not in known_drivers:
            return Unallocatable(
                reason="UnknownConfigDriver",
                message=f"ResourceClaim {claim.ref}: spec.devices.config[{i}].opaque.driver "
                f"{config.opaque.driver!r} is not a driver in this cluster (known: "
                f"{', '.join(sorted(known_drivers)) or 'none'}); no node could apply this configuration",
            )
    return None


def involved(claim: ResourceClaim, *, api_version: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "ResourceClaim",
        "name": claim.name,
        "namespace": claim.namespace,
        "uid": claim.metadata.uid,
    }


def describe_allocation(allocation: AllocationResult, node: str | None) -> str:
    devices = ", ".join(f"{r.driver}/{r.pool}/{r.device}" for r in allocation.devices)
    where = f"on node {node}" if node else "usable from any node"
    return f"allocated {devices or 'no devices'} {where}"


class DevicesTaken(Exception):
    """The devices placed for a claim are held by other claims (``taken``: device -> a holder): a
    race with another allocator, or a placer out of step with the model."""

    def __init__(self, taken: Mapping[DeviceID, ClaimKey]) -> None:
        self.taken = dict(taken)
        super().__init__(", ".join(f"{'/'.join(d)} (held by {k})" for d, k in sorted(self.taken.items())))


@dataclass
class _Failure:
    reason: str
    message: str


@dataclass
class _Wait:
    """A claim that gave way to kube-scheduler, from its first wait until it is allocated."""

    since: float
    """time.monotonic() of the first wait."""
    announced: bool = False
    """Whether its condition and Event were written (once per claim, not per try)."""


def waiting_message(*, demand: SchedulerDemand, crowded: Crowded) -> str:
    """What the WaitingForScheduler condition and Event say."""
    pods = f"{demand.pods} pod{'s' if demand.pods != 1 else ''}"
    device = "/".join(crowded.device)
    return (
        f"kube-scheduler is placing {pods} that could use the devices this claim would get, and "
        f"allocates from the same devices: {device} has {crowded.ahead} free device"
        f"{'s' if crowded.ahead != 1 else ''} ahead of it, where those pods could take {crowded.needed}. "
        "The operator gives way rather than risk both taking one device; it tries again whenever "
        "those pods, their claims or the devices change, and allocates as soon as it finds devices "
        "they cannot reach"
    )


_CLASS_SELECTOR_ERROR = re.compile(r"class (\S+): selector #(\d+) on device \S+:")


class ClaimReconciler:
    """Owns the claim queue and the worker that drains it."""

    def __init__(
        self,
        *,
        model: ClusterModel,
        placer: Placer,
        api: KubeApi,
        settings: Settings,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        compiler: Callable[[str], object] | None = None,
    ) -> None:
        self.model = model
        self.placer = placer
        self.api = api
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.classes = settings.managed_class_names()
        self.compiler = compiler
        self._dirty: dict[ClaimKey, None] = {}
        self._busy: set[ClaimKey] = set()
        self._wake = asyncio.Event()
        self._failing: dict[ClaimKey, _Failure] = {}
        self._class_reports: dict[str, tuple[str, int, str]] = {}
        self._was_reserved: set[ClaimKey] = set()
        # Claims are reconciled in tasks of their own so that their API writes overlap; this bounds
        # how many run at once. Placement needs no lock: a task places and assumes before its first
        # await, and the event loop runs one task at a time.
        self._writes = asyncio.Semaphore(settings.max_concurrent_writes)
        self._tasks: set[asyncio.Task[None]] = set()
        self.clearance = Clearance()
        self._waits: dict[ClaimKey, _Wait] = {}
        # Claims giving way to kube-scheduler now: placed again on every change (they stay in the
        # set meanwhile), until allocated, unallocatable, deleted or no longer ours.
        self._waiting: set[ClaimKey] = set()
        self._recheck_timer: asyncio.TimerHandle | None = None
        # When devices were last freed or slices, classes or nodes changed (time.monotonic()):
        # what sends parked pods back to kube-scheduler. -inf until then: nothing did yet.
        self._helped_parked_at = float("-inf")
        self._settle_timer: asyncio.TimerHandle | None = None
        self._settle_at = 0.0
        self.backoff = Backoff()
        self._log_throttle = LogThrottle()
        self._index_reported: set[DeviceID] = set()
        self.events = EventSink(api, idle=self.idle, dropped=metrics.events_dropped)
        self._relist_wanted: set[str] = set()
        self._relist_task: asyncio.Task[None] | None = None
        self.synced = asyncio.Event()
        """Set once the model holds a full listing; nothing is allocated before."""

    # -- inputs ---------------------------------------------------------------------------------

    def idle(self) -> bool:
        """No claim queued or being written."""
        return not self._dirty and not self._busy

    def failing(self) -> frozenset[object]:
        """Claims that cannot be allocated now (waiting for kube-scheduler is not failing)."""
        return frozenset(k for k in self._failing if k not in self._waiting)

    def waiting(self) -> frozenset[object]:
        """Claims giving way to kube-scheduler now."""
        return frozenset(self._waiting)

    def longest_wait(self) -> float:
        """Seconds the claim that has waited longest for kube-scheduler has waited so far; 0 if none."""
        starts = [self._waits[k].since for k in self._waiting if k in self._waits]
        return max(0.0, time.monotonic() - min(starts)) if starts else 0.0

    def mark(self, key: ClaimKey) -> None:
        self._dirty[key] = None
        self._wake.set()

    def on_claim_event(self, obj: Mapping[str, Any], *, deleted: bool) -> None:
        key = claim_key_of(obj)
        before = self.model.claims.get(key)
        held_before = before is not None and before.status.allocation is not None
        if deleted:
            self.model.remove_claim(
                key, resource_version=str((obj.get("metadata") or {}).get("resourceVersion", ""))
            )
            self._failing.pop(key, None)
            self._was_reserved.discard(key)
            self._waits.pop(key, None)
            self._waiting.discard(key)
            self.backoff.forget(key)
            if held_before:
                self._helped_parked_at = time.monotonic()
                self.retry_failing()
            self._recheck_waiting()
            self._verify_after_event()
            return
        result = self.model.upsert_claim(obj)
        if result is None:
            return  # older than what we have
        if isinstance(result, ResourceClaim):
            if result.status.allocation is not None or result.metadata.deletion_timestamp is not None:
                self._waiting.discard(key)
            if result.status.reserved_for:
                self._was_reserved.add(key)
            if held_before and result.status.allocation is None:
                self._helped_parked_at = time.monotonic()
                self.retry_failing()  # devices were freed
        self.mark(key)
        self._recheck_waiting()
        self._verify_after_event()

    def on_cluster_change(self) -> None:
        """Slices, classes or nodes changed: claims that could not be allocated get another try."""
        self._helped_parked_at = time.monotonic()
        self.retry_failing()
        for claim in self.model.pending_claims():
            if is_ours(claim, ownership=self.settings.ownership, classes=self.classes):
                self._dirty[ClaimKey(claim.namespace, claim.name)] = None
        self._wake.set()
        self._verify_after_event()

    def _verify_after_event(self) -> None:
        if self.settings.verify_placer_index:
            self.check_placer(found_by="check")

    def check_placer(
        self,
        *,
        found_by: str,
        claim: ResourceClaim | None = None,
        taken: Mapping[DeviceID, ClaimKey] | None = None,
    ) -> bool:
        """Compare the placer's free-device index with the model; on a difference, rebuild the
        index from the model, count it, log it (at most every 30 s) and, when a placement ran into
        it, post a Warning Event on the claim once per device. True when they disagreed."""
        problems = self.placer.disagreements(self.model)
        if not problems:
            return False
        self.metrics.index_repairs.labels(found_by).inc()
        self.placer.rebuild()
        held = self._log_throttle.allow(("placer index", found_by))
        if held is not None:
            logger.error(
                "placer index disagrees with the model (found by %s); rebuilt it from the model: %s%s",
                found_by,
                "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""),
                held_back(held),
            )
        fresh = {d: k for d, k in (taken or {}).items() if d not in self._index_reported}
        if claim is not None and fresh:
            self._index_reported.update(fresh)
            devices = ", ".join(f"{'/'.join(d)} (held by {k})" for d, k in sorted(fresh.items()))
            self.events.post(
                involved=involved(claim, api_version=self.api.api_version),
                type_="Warning",
                reason="PlacementIndexRepaired",
                message=f"the operator's free-device index counted {devices} as free; it was rebuilt "
                "from the cluster state and the claim will be placed again",
            )
        return True

    def retry_failing(self) -> None:
        for key in self._failing:
            self._dirty[key] = None
        if self._failing:
            self._wake.set()

    def on_pod_change(self) -> None:
        """A pod changed (created, bound, deleted, ...): what kube-scheduler has yet to place may
        have changed, so claims waiting for it get another try."""
        self._recheck_waiting()

    def _recheck_waiting(self) -> None:
        if self._waiting and self._recheck_timer is None:
            self._recheck_timer = asyncio.get_running_loop().call_later(
                RECHECK_DELAY_S, self._release_waiting
            )

    def _recheck_when_parked_settle(self) -> None:
        """Parked pods stop counting a while after the last change that may help them, with no
        event to say so: try the waiting claims again then."""
        settle = self._helped_parked_at + PARKED_RETRY_WINDOW_S - time.monotonic()
        if settle <= 0 or (self._settle_timer is not None and self._settle_at >= settle + time.monotonic()):
            return
        if self._settle_timer is not None:
            self._settle_timer.cancel()
        self._settle_at = time.monotonic() + settle
        self._settle_timer = asyncio.get_running_loop().call_later(settle + 0.01, self._settled)

    def _settled(self) -> None:
        self._settle_timer = None
        self._recheck_waiting()

    def _release_waiting(self) -> None:
        self._recheck_timer = None
        for key in self._waiting:
            self._dirty[key] = None
        self._wake.set()

    def scheduler_demand(self) -> SchedulerDemand:
        """What the pods waiting for kube-scheduler could take now."""
        parked = time.monotonic() - self._helped_parked_at < PARKED_RETRY_WINDOW_S
        return scheduler_demand(
            self.model, ownership=self.settings.ownership, classes=self.classes, parked=parked
        )

    def crowded(self, allocation: AllocationResult, demand: SchedulerDemand) -> Crowded | None:
        return self.clearance.crowded(
            model=self.model, allocation=allocation, demand=demand, headroom=self.settings.scheduler_headroom
        )

    def on_pod_gone(self, *, namespace: str, name: str) -> None:
        """A pod vanished: claims we allocated that it reserved need their reservedFor cleaned."""
        for key, claim in self.model.claims.items():
            if (
                allocated_by_us(claim)
                and any(r.resource == "pods" and r.name == name for r in claim.status.reserved_for)
                and key.namespace == namespace
            ):
                self.mark(key)

    # -- the worker -----------------------------------------------------------------------------

    async def resync(self) -> None:
        """List claims, slices, classes, nodes and pods into the model; queue every claim."""
        counts = await self.relist(RELIST_KINDS, mark_all=True)
        self.synced.set()
        logger.info(
            "model synced: %d claims, %d slices, %d classes, %d nodes",
            counts["resourceclaims"],
            counts["resourceslices"],
            counts["deviceclasses"],
            counts["nodes"],
        )

    async def relist(self, kinds: Iterable[str], *, mark_all: bool = False) -> dict[str, int]:
        """Read whole resources again and make the model match them, deletions included. A watch
        that resumes after a gap (410 Gone, a reconnect) lists what exists, so objects deleted
        during the gap would stay in the model for good: a deleted slice's devices would look free,
        a deleted claim's devices held. Claims that changed are queued; with ``mark_all``, every claim
        (after a standby period, when nothing may have been done about them). Returns how many
        objects each listing had."""
        wanted = [k for k in RELIST_KINDS if k in set(kinds)]
        listings: list[Listing] = await asyncio.gather(*(self._list(kind) for kind in wanted))
        changed = False
        for kind, listing in zip(wanted, listings, strict=True):
            changed |= self.apply_listing(kind, listing, mark_all=mark_all)
        if changed:
            self.on_cluster_change()
        return {kind: len(listing.items) for kind, listing in zip(wanted, listings, strict=True)}

    async def _list(self, kind: str) -> Listing:
        if kind in ("nodes", "pods"):
            return await self.api.list_core(kind)
        return await self.api.list_snapshot(kind)

    def apply_listing(self, kind: str, listing: Listing, *, mark_all: bool = False) -> bool:
        """Upsert what is listed, drop what is gone; whether classes, slices or nodes changed."""
        model, at = self.model, listing.resource_version
        before = model.generation
        names = {str((o.get("metadata") or {}).get("name", "")) for o in listing.items}
        if kind == "resourceclaims":
            for obj in listing.items:
                self.on_claim_event(obj, deleted=False)
                if mark_all:
                    self.mark(claim_key_of(obj))
            listed = {str(claim_key_of(o)) for o in listing.items}
            held = {str(k): k for k in [*model.claims, *model.invalid_claims]}
            for name in model.unseen_since("claim", held, listed, at):
                key = held[name]
                logger.info("claim %s was deleted while the watch was not looking", key)
                self.on_claim_event(
                    {"metadata": {"namespace": key.namespace, "name": key.name, "resourceVersion": at}},
                    deleted=True,
                )
            return False
        if kind == "pods":
            for obj in listing.items:
                model.upsert_pod(obj)
            listed_pods = {
                (str(o["metadata"].get("namespace", "")), str(o["metadata"]["name"])) for o in listing.items
            }
            for namespace, name in [k for k in model.pods if k not in listed_pods]:
                model.remove_pod(namespace=namespace, name=name)
                self.on_pod_gone(namespace=namespace, name=name)
            return False
        upsert: Callable[[Mapping[str, Any]], object]
        remove: Callable[..., None]
        if kind == "deviceclasses":
            upsert, remove, version_kind, held_names = (
                model.upsert_class,
                model.remove_class,
                "class",
                list(model.classes),
            )
        elif kind == "resourceslices":
            upsert, remove, version_kind, held_names = (
                model.upsert_slice,
                model.remove_slice,
                "slice",
                list(model.slices),
            )
        else:
            upsert, remove, version_kind, held_names = (
                model.upsert_node,
                model.remove_node,
                "node",
                list(model.nodes),
            )
        for obj in listing.items:
            try:
                upsert(obj)
            except ModelError as exc:
                logger.warning("ignoring %s %s: %s", kind, (obj.get("metadata") or {}).get("name"), exc)
                self.metrics.reconcile_errors.labels(kind).inc()
        for name in model.unseen_since(version_kind, held_names, names, at):
            logger.info("%s %s was deleted while the watch was not looking", kind, name)
            remove(name, resource_version=at)
        return model.generation != before

    def watch_relisted(self, kind: str) -> None:
        """A watch listed ``kind`` again (Kopf's, or the claim watch), which happens after a gap in
        it (410 Gone, a lost connection): list the cluster here too, so that what was deleted
        during the gap leaves the model. Every kind, not just this one: a gap rarely hits one watch
        alone, and a watch whose re-list is empty gives no event to notice it by. The events of one
        listing make one re-list."""
        if self.synced.is_set():
            self.request_relist()

    def request_relist(self) -> None:
        self._relist_wanted.update(RELIST_KINDS)
        if self._relist_task is None or self._relist_task.done():
            self._relist_task = asyncio.create_task(self._relist_soon(), name="relist")

    async def _relist_soon(self) -> None:
        attempt = 0
        while self._relist_wanted:
            await asyncio.sleep(1.0)  # let Kopf's listing, which triggered this, reach the model first
            kinds = tuple(self._relist_wanted)
            self._relist_wanted.clear()
            try:
                await self.relist(kinds)
            except Exception as exc:
                attempt += 1
                delay = min(30.0, 0.5 * 2**attempt)
                logger.warning("re-listing failed (%s); retrying in %.1f s", error_text(exc), delay)
                self._relist_wanted.update(kinds)
                await asyncio.sleep(delay)
                continue
            attempt = 0
            for kind in kinds:
                self.metrics.relists.labels(kind).inc()
            logger.info("re-listed %s", ", ".join(k for k in RELIST_KINDS if k in kinds))

    async def run(self, *, active: Callable[[], bool] = lambda: True) -> None:
        """Drain the queue forever. ``active`` is False while another instance is the active one."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not active():
                await asyncio.sleep(1.0)
                self._wake.set()
                continue
            if not self.synced.is_set():
                await self.resync()
            batch = [k for k in self._dirty if k not in self._busy]
            for key in batch:
                del self._dirty[key]
            for key in sorted(batch, key=lambda k: self.model.claim_created.get(k, "")):
                self._busy.add(key)
                await self._writes.acquire()
                task = asyncio.create_task(self._reconcile_guarded(key), name=f"claim {key}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if batch:
                await self._repair_double_bookings()

    async def drain(self, *, within: float = 30.0) -> None:
        """Wait until the queue is empty and no claim is being written (tests)."""
        deadline = time.monotonic() + within
        while self._dirty or self._busy:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"claims still queued: {sorted(map(str, self._dirty | dict.fromkeys(self._busy)))}"
                )
            await asyncio.sleep(0.02)

    async def _reconcile_guarded(self, key: ClaimKey) -> None:
        try:
            await self.backoff.wait_for_pause()
            await self.reconcile(key)
            self.backoff.succeeded(key)
        except DevicesTaken as exc:
            self._retry_later(key, exc)
        except NotActive:
            # Stepped down mid-claim: the claim waits, without a back-off, for whichever instance
            # is active next (this one lists everything again before it writes).
            self.model.forget_assumed(key)
            self._dirty[key] = None
        except (Conflict, Gone):
            self.metrics.conflicts.inc()
            try:
                await self._refetch(key)
            except Exception as exc:
                self._retry_later(key, exc)
        except Exception as exc:
            self._retry_later(key, exc)
        finally:
            self._busy.discard(key)
            self._writes.release()
            if key in self._dirty:
                self._wake.set()

    def _retry_later(self, key: ClaimKey, exc: Exception) -> None:
        """Queue the claim again after its backoff (and after the server's Retry-After, if any)."""
        self.model.forget_assumed(key)
        attempt, delay = self.backoff.failed(key, retry_after=retry_after(exc))
        # One line per claim and kind of failure every 30 s at most: a failure that keeps coming
        # back is counted in the next line logged, not repeated.
        held = self._log_throttle.allow((key, type(exc)))
        if isinstance(exc, DevicesTaken):
            if held is not None:
                logger.info(
                    "claim %s: devices %s were taken meanwhile; placing again in %.1f s (attempt #%d)%s",
                    key,
                    exc,
                    delay,
                    attempt,
                    held_back(held),
                )
        elif transient(exc):
            self.metrics.api_retries.labels(error_cause(exc)).inc()
            if held is not None:
                logger.warning(
                    "claim %s: attempt #%d failed (%s); will retry in %.1f s%s",
                    key,
                    attempt,
                    error_text(exc),
                    delay,
                    held_back(held),
                )
        else:
            self.metrics.reconcile_errors.labels("ResourceClaim").inc()
            if held is not None:
                logger.exception(
                    "claim %s: attempt #%d failed; will retry in %.1f s%s",
                    key,
                    attempt,
                    delay,
                    held_back(held),
                )
        asyncio.get_running_loop().call_later(delay, self.mark, key)

    async def _refetch(self, key: ClaimKey) -> None:
        self.model.forget_assumed(key)
        obj = await self.api.get_claim(namespace=key.namespace, name=key.name)
        if obj is None:
            self.on_claim_event({"metadata": {"namespace": key.namespace, "name": key.name}}, deleted=True)
        else:
            self.on_claim_event(obj, deleted=False)
            self.mark(key)  # also when the watch already brought this version

    # -- one claim ------------------------------------------------------------------------------

    async def reconcile(self, key: ClaimKey) -> None:
        invalid = self.model.invalid_claims.get(key)
        if invalid is not None:
            await self._report_invalid(invalid)
            return
        claim = self.model.claims.get(key)
        if claim is None:
            return
        ours_by_finalizer = OPERATOR_FINALIZER in claim.metadata.finalizers
        if claim.metadata.deletion_timestamp is not None:
            if ours_by_finalizer:
                await self._release_deleted(claim)
            return
        if claim.status.allocation is not None:
            if ours_by_finalizer:
                await self._maintain_allocated(claim)
            return
        if not is_ours(claim, ownership=self.settings.ownership, classes=self.classes):
            self._waiting.discard(key)
            if ours_by_finalizer:
                await self._patch_meta(claim, finalizer=False, condition=None)
            return
        await self._allocate(claim)

    def assess(self, claim: ResourceClaim) -> Placement | Unallocatable:
        """Where the claim would go on the model as it is now, or why it cannot go anywhere. Holds
        nothing: the caller assumes the devices if it goes on to allocate."""
        known = set(self.settings.drivers) | {s.driver for s in self.model.slices.values()}
        invalid = validate_claim(claim, known_drivers=known, compiler=self.compiler)
        if invalid is not None:
            return invalid
        return self.placer.place(claims=[claim], model=self.model)

    async def _allocate(self, claim: ResourceClaim) -> None:
        key = ClaimKey(claim.namespace, claim.name)
        outcome = self.assess(claim)
        if isinstance(outcome, Unallocatable):
            await self._fail(claim, outcome)
            return
        demand = self.scheduler_demand()
        if not demand.empty:
            found = self._clear_of_scheduler(claim, outcome, demand)
            if isinstance(found, Crowded):
                await self._wait_for_scheduler(claim, demand, found)
                return
            outcome = found
        # kube-scheduler (1.34+ with DRADeviceBindingConditions and DRAResourceClaimDeviceStatus) stamps
        # allocationTimestamp when it reserves a claim whose allocation lacks one, which the API
        # server refuses (allocation is immutable): a pod could never use the claim. Set it here;
        # a server with those gates off drops the field.
        allocation = dataclasses.replace(outcome.allocations[0], allocation_timestamp=_now())
        # No await between placement and this line: the devices are held before anyone else looks.
        self.model.assume(key, allocation)
        try:
            current: ResourceClaim | None = claim
            if (
                OPERATOR_FINALIZER not in claim.metadata.finalizers
                or CONDITION_ANNOTATION in claim.metadata.annotations
            ):
                current = await self._patch_meta(claim, finalizer=True, condition=None)
            if current is None or current.status.allocation is not None:
                self.model.forget_assumed(key)
                return
            # Pods may have come to kube-scheduler while the finalizer was being written, and it may
            # have taken one of the devices (its write shows up in the model through the watch).
            # Checking both again here shrinks the race to the status write itself.
            demand = self.scheduler_demand()
            crowded = self.crowded(allocation, demand)
            if crowded is not None:
                self.model.forget_assumed(key)
                await self._wait_for_scheduler(current, demand, crowded)
                return
            taken = self.model.taken_by_others(key, allocation)
            if taken:
                # Held by a claim written meanwhile (a race: the placer has caught up by now), or
                # held all along by a claim the placer counted free: then its index is repaired
                # here. Either way the claim goes through its back-off, never straight back.
                self.model.forget_assumed(key)
                self.check_placer(found_by="placement", claim=claim, taken=taken)
                raise DevicesTaken(taken)
            obj = await self.api.patch_claim_status(
                namespace=claim.namespace,
                name=claim.name,
                body={
                    "metadata": {"resourceVersion": current.metadata.resource_version},
                    "status": {"allocation": allocation.to_json()},
                },
            )
        except BaseException:
            self.model.forget_assumed(key)
            raise
        self.on_claim_event(obj, deleted=False)
        self.model.forget_assumed(key)
        waited = self._waits.pop(key, None)
        self._waiting.discard(key)
        unallocatable = self._failing.pop(key, None)
        self.metrics.allocations.inc()
        age = _age_seconds(self.model.claim_created.get(key, ""), now=self.clock())
        if age is not None:
            self.metrics.allocation_latency.observe(age)
            reason = "scheduler_busy" if waited else "unallocatable" if unallocatable else "none"
            self.metrics.allocation_wait.labels(reason).observe(age)
        text = describe_allocation(allocation, outcome.node)
        logger.info("claim %s: %s", key, text)
        self.events.post(
            involved=involved(claim, api_version=self.api.api_version),
            type_="Normal",
            reason="Allocated",
            message=text,
        )

    def _clear_of_scheduler(
        self, claim: ResourceClaim, placement: Placement, demand: SchedulerDemand
    ) -> Placement | Crowded:
        """``placement``, or one on other devices, that kube-scheduler cannot reach while it places
        the waiting pods; or why the best found is not clear."""
        crowded = self.crowded(placement.allocations[0], demand)
        if crowded is None:
            return placement
        # The node with the most free devices has the most of them ahead of its last one.
        spread = self.placer.place(claims=[claim], model=self.model, policy=SPREAD)
        if not isinstance(spread, Placement):
            return crowded
        again = self.crowded(spread.allocations[0], demand)
        return spread if again is None else again

    async def _wait_for_scheduler(
        self, claim: ResourceClaim, demand: SchedulerDemand, crowded: Crowded
    ) -> None:
        """Leave the claim until pods, claims or devices change; say why once per claim."""
        key = ClaimKey(claim.namespace, claim.name)
        wait = self._waits.get(key)
        if wait is None:
            wait = self._waits[key] = _Wait(since=time.monotonic())
        self._waiting.add(key)
        self._recheck_when_parked_settle()
        if wait.announced:
            return
        message = waiting_message(demand=demand, crowded=crowded)
        await self._patch_meta(
            claim,
            finalizer=OPERATOR_FINALIZER in claim.metadata.finalizers,
            condition=condition_json(status="False", reason=WAITING_REASON, message=message),
        )
        wait.announced = True
        logger.info("claim %s waits for kube-scheduler: %s", key, message)
        self.events.post(
            involved=involved(claim, api_version=self.api.api_version),
            type_="Normal",
            reason=WAITING_REASON,
            message=message,
        )

    async def _fail(self, claim: ResourceClaim, why: Unallocatable) -> None:
        key = ClaimKey(claim.namespace, claim.name)
        self._waiting.discard(key)
        self.metrics.allocation_failures.labels(why.reason).inc()
        previous = self._failing.get(key)
        self._failing[key] = _Failure(why.reason, why.message)
        if (
            previous is not None
            and previous.message == why.message
            and (OPERATOR_FINALIZER not in claim.metadata.finalizers)
        ):
            return  # already said; no event storm while the cluster stays the same
        logger.info("claim %s cannot be allocated (%s): %s", key, why.reason, why.message)
        self.events.post(
            involved=involved(claim, api_version=self.api.api_version),
            type_="Warning",
            reason=why.reason,
            message=why.message,
        )
        await self._patch_meta(
            claim,
            finalizer=False,
            condition=condition_json(status="False", reason=why.reason, message=why.message),
        )
        await self._report_class_selector(why)

    async def _report_class_selector(self, why: Unallocatable) -> None:
        """A class selector that fails on devices (the API server only checks that it compiles)
        is the class's problem too: say so on the DeviceClass, once per class and error."""
        match = _CLASS_SELECTOR_ERROR.match(why.message)
        if match is None:
            return
        name, index = match.group(1), int(match.group(2))
        cls = self.model.classes.get(name)
        if cls is None or index >= len(cls.selectors):
            return
        error = why.message[match.end() :].strip()
        signature = (cls.metadata.resource_version, index, error)
        if self._class_reports.get(name) == signature:
            return
        self._class_reports[name] = signature
        self.events.post(
            involved={
                "apiVersion": self.api.api_version,
                "kind": "DeviceClass",
                "name": name,
                "uid": cls.metadata.uid,
            },
            type_="Warning",
            reason="InvalidSelector",
            message=f"DeviceClass {name}: spec.selectors[{index}].cel.expression "
            f"{cls.selectors[index].cel!r} fails on devices: {error}",
        )

    async def _report_invalid(self, invalid: InvalidClaim) -> None:
        if invalid.key in self._failing and self._failing[invalid.key].message == invalid.message:
            return
        self._failing[invalid.key] = _Failure("InvalidClaim", invalid.message)
        self.metrics.allocation_failures.labels("InvalidClaim").inc()
        self.events.post(
            involved={
                "apiVersion": self.api.api_version,
                "kind": "ResourceClaim",
                "name": invalid.key.name,
                "namespace": invalid.key.namespace,
                "uid": invalid.uid,
            },
            type_="Warning",
            reason="InvalidClaim",
            message=invalid.message,
        )

    async def _patch_meta(
        self, claim: ResourceClaim, *, finalizer: bool, condition: str | None
    ) -> ResourceClaim | None:
        """Set or drop our finalizer and the condition annotation, if they differ; precondition on
        the resourceVersion. Returns the claim as written (None if it is gone)."""
        finalizers = [f for f in claim.metadata.finalizers if f != OPERATOR_FINALIZER]
        if finalizer:
            finalizers.append(OPERATOR_FINALIZER)
        has_condition = claim.metadata.annotations.get(CONDITION_ANNOTATION)
        same_condition = (
            has_condition is None
            if condition is None
            else has_condition is not None and _same_condition(has_condition, condition)
        )
        if tuple(finalizers) == claim.metadata.finalizers and same_condition:
            return claim
        body: dict[str, Any] = {
            "metadata": {
                "resourceVersion": claim.metadata.resource_version,
                "finalizers": finalizers,
            }
        }
        if not same_condition:
            body["metadata"]["annotations"] = {CONDITION_ANNOTATION: condition}
        try:
            obj = await self.api.patch_claim(namespace=claim.namespace, name=claim.name, body=body)
        except Gone:
            self.on_claim_event(
                {"metadata": {"namespace": claim.namespace, "name": claim.name}}, deleted=True
            )
            return None
        self.on_claim_event(obj, deleted=False)
        return self.model.claims.get(ClaimKey(claim.namespace, claim.name))

    async def _clear_allocation(self, claim: ResourceClaim) -> ResourceClaim | None:
        obj = await self.api.patch_claim_status(
            namespace=claim.namespace,
            name=claim.name,
            body={
                "metadata": {"resourceVersion": claim.metadata.resource_version},
                "status": {"allocation": None, "devices": None, "reservedFor": None},
            },
        )
        self.on_claim_event(obj, deleted=False)
        self.metrics.deallocations.inc()
        return self.model.claims.get(ClaimKey(claim.namespace, claim.name))

    async def _release_deleted(self, claim: ResourceClaim) -> None:
        """A deleted claim we allocated: deallocate it once no pod uses it, then let it go."""
        reserved = [
            r
            for r in claim.status.reserved_for
            if not await self._consumer_gone(claim, r.name, r.uid, r.resource)
        ]
        if reserved:
            if len(reserved) != len(claim.status.reserved_for):
                await self._set_reserved_for(claim, [r.to_json() for r in reserved])
            return  # a pod still uses it: never pulled from under a running pod
        current: ResourceClaim | None = claim
        if claim.status.allocation is not None:
            current = await self._clear_allocation(claim)
            if current is None:
                return
            text = describe_allocation(claim.status.allocation, None).replace("allocated", "released", 1)
            self.events.post(
                involved=involved(claim, api_version=self.api.api_version),
                type_="Normal",
                reason="Deallocated",
                message=f"{text} (claim deleted)",
            )
        if current is not None:
            await self._patch_meta(current, finalizer=False, condition=None)

    async def _maintain_allocated(self, claim: ResourceClaim) -> None:
        """An allocated claim of ours: drop stale reservations; deallocate a template claim that
        its pod no longer uses."""
        key = ClaimKey(claim.namespace, claim.name)
        live = [
            r
            for r in claim.status.reserved_for
            if not await self._consumer_gone(claim, r.name, r.uid, r.resource)
        ]
        if len(live) != len(claim.status.reserved_for):
            logger.info("claim %s: removing reservations of pods that are gone", key)
            updated = await self._set_reserved_for(claim, [r.to_json() for r in live])
            if updated is None:
                return
            claim = updated
        if not claim.status.reserved_for and key in self._was_reserved and generated_from_template(claim):
            assert claim.status.allocation is not None
            allocation = claim.status.allocation
            current = await self._clear_allocation(claim)
            self._was_reserved.discard(key)
            if current is not None:
                await self._patch_meta(current, finalizer=False, condition=None)
            self.events.post(
                involved=involved(claim, api_version=self.api.api_version),
                type_="Normal",
                reason="Deallocated",
                message=describe_allocation(allocation, None).replace("allocated", "released", 1)
                + " (no pod uses the claim any more)",
            )

    async def _set_reserved_for(
        self, claim: ResourceClaim, entries: list[dict[str, Any]]
    ) -> ResourceClaim | None:
        obj = await self.api.patch_claim_status(
            namespace=claim.namespace,
            name=claim.name,
            body={
                "metadata": {"resourceVersion": claim.metadata.resource_version},
                "status": {"reservedFor": entries or None},
            },
        )
        self.on_claim_event(obj, deleted=False)
        return self.model.claims.get(ClaimKey(claim.namespace, claim.name))

    async def _consumer_gone(self, claim: ResourceClaim, name: str, uid: str, resource: str) -> bool:
        """Whether a reservedFor pod is gone, replaced (other UID) or finished. The pod watch may
        lag behind, so 'gone' is confirmed with the API server before acting on it."""
        if resource != "pods":
            return False  # other consumers (PodGroups) are left to their owners
        known = self.model.pods.get((claim.namespace, name))
        if known is not None and known.uid == uid and known.phase not in _TERMINAL_PHASES:
            return False
        pod = await self.api.get_pod(namespace=claim.namespace, name=name)
        if pod is None:
            return True
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase", "")
        return meta.get("uid") != uid or phase in _TERMINAL_PHASES

    async def _repair_double_bookings(self) -> None:
        """A device in two claims can only come from two allocators racing on different claims
        (the scheduler and this operator). Give up our copy if no pod uses it yet.

        kube-scheduler (1.36) keeps allocated devices in a set, adds a claim's devices when it sees
        the claim allocated and removes them when it sees it deallocated or deleted; an update that
        leaves the allocation as it was changes nothing. So after this release it counts the device
        free although the other claim still holds it, until it lists claims again: no write of ours
        can tell it otherwise. Avoiding the race (the scheduler grace period) is the real cure."""
        for device, holders in self.model.double_booked().items():
            for key in sorted(holders):
                claim = self.model.claims.get(key)
                if claim is None or not allocated_by_us(claim) or claim.status.reserved_for:
                    continue
                others = [k for k in holders if k != key]
                logger.warning("device %s is allocated to %s and %s; releasing ours", device, key, others)
                self.events.post(
                    involved=involved(claim, api_version=self.api.api_version),
                    type_="Warning",
                    reason="DeviceConflict",
                    message=f"device {'/'.join(device)} was also allocated to "
                    f"{', '.join(map(str, others))} by another allocator; allocating this claim again",
                )
                try:
                    await self._clear_allocation(claim)
                except (Conflict, Gone):
                    await self._refetch(key)
                self.mark(key)
                break


def _same_condition(old: str, new: str) -> bool:
    try:
        a, b = json.loads(old), json.loads(new)
    except ValueError:
        return False
    return bool(a.get("reason") == b.get("reason") and a.get("message") == b.get("message"))
