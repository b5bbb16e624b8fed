"""The ResourceClaim lifecycle: allocate the claims the operator owns, deallocate and clean up.

One worker drains a queue of claims that need attention. Claims are queued by watch events (the
claim's own, and - for claims that could not be allocated - any change of slices, classes, nodes or
of other claims' allocations), never by polling.

Claims are reconciled in tasks of their own, up to ``Settings.max_concurrent_writes`` at once, so
the API round trips of different claims overlap. Placement has no ``await`` in it, so placements
still happen one at a time against a model that holds every claim in flight's devices: claims
written together never share a device.

A 409 Conflict means someone changed the claim first (kube-scheduler allocating it, a user editing
it): the claim is read again and reconsidered; a device is never written into two claims by this
operator.

``ClaimReconciler`` is the coordinator: it takes the inputs (watch events, cluster changes), runs
the worker and sends each claim to the part that handles it:

- :mod:`~dra_operator.model.workqueue`: the queue of claims and the worker's wake-up;
- :mod:`~dra_operator.claims.relist`: listing whole resources into the model;
- :mod:`~dra_operator.claims.allocate`: placing a claim and writing its allocation (with
  :mod:`~dra_operator.claims.claimchecks` and :mod:`~dra_operator.claims.placerindex`);
- :mod:`~dra_operator.scheduler.waits`: claims giving way to kube-scheduler;
- :mod:`~dra_operator.claims.status`: finalizer, condition and status writes, Event texts;
- :mod:`~dra_operator.claims.release`: deallocation and finalizer removal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from dra_api.aiotasks import BackgroundTasks
from dra_api.model import ResourceClaim
from dra_api.names import OPERATOR_FINALIZER
from dra_operator.base.logthrottle import LogThrottle, held_back
from dra_operator.base.settings import Settings
from dra_operator.claims.allocate import ClaimAllocator, DevicesTaken
from dra_operator.claims.backoff import Backoff
from dra_operator.claims.placerindex import PlacerIndexCheck
from dra_operator.claims.release import ClaimReleaser
from dra_operator.claims.relist import Relister
from dra_operator.claims.status import ClaimStatusWriter
from dra_operator.claims.tell import ClaimTeller
from dra_operator.client.errors import (
    Conflict,
    Gone,
    NotActive,
    error_cause,
    error_text,
    retry_after,
    transient,
)
from dra_operator.client.events import EventSink
from dra_operator.client.kubeapi import KubeApi
from dra_operator.model.book import ClaimBook
from dra_operator.model.cluster import ClaimKey, ClusterModel, claim_key_of
from dra_operator.model.metrics import Metrics
from dra_operator.model.ownership import allocated_by_us, is_ours
from dra_operator.model.workqueue import ClaimQueue
from dra_operator.planner.placement import Outcome, Placer
from dra_operator.scheduler.reservation import NodeReservations
from dra_operator.scheduler.waits import SchedulerWaits

logger = logging.getLogger(__name__)


class ClaimReconciler:
    """Owns the claim worker; the queue and the Event sink may be shared (the runner builds them:
    the sink posts freely while the queue is idle), and are made here when not given."""

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
        queue: ClaimQueue | None = None,
        events: EventSink | None = None,
    ) -> None:
        self.model = model
        self.placer = placer
        self.api = api
        self.settings = settings
        self.metrics = metrics
        self.classes = settings.managed_class_names()
        self.queue = queue if queue is not None else ClaimQueue()
        self.events = (
            events
            if events is not None
            else EventSink(api, idle=self.queue.idle, dropped=metrics.events_dropped)
        )
        # Claims are reconciled in tasks of their own so that their API writes overlap; this bounds
        # how many run at once. Placement needs no lock: a task places and assumes before its first
        # await, and the event loop runs one task at a time.
        self._writes = asyncio.Semaphore(settings.max_concurrent_writes)
        self._tasks = BackgroundTasks()
        # What the operator keeps about each claim beyond the model: its parts below keep theirs here.
        self.book = ClaimBook()
        self.backoff = Backoff(failures=self.book.retries)
        self._log_throttle = LogThrottle()
        self.waits = SchedulerWaits(
            model=model, settings=settings, classes=self.classes, queue=self.queue, book=self.book
        )
        self.reservations = NodeReservations(
            api=api,
            model=model,
            queue=self.queue,
            after_s=settings.scheduler_reserve_after_s,
            ended=lambda outcome: metrics.reservations.labels(outcome).inc(),
            book=self.book,
        )
        self._build_parts(clock=clock, compiler=compiler)
        self.relister = Relister(model=model, api=api, metrics=metrics, inputs=self)
        self.synced = self.relister.synced
        """Set once the model holds a full listing; nothing is allocated before."""

    def _build_parts(self, *, clock: Callable[[], float], compiler: Callable[[str], object] | None) -> None:
        """The parts that handle one claim (status writes, the placer's index check, allocation,
        telling outcomes, release), each handed what it needs of what the coordinator shares."""
        model, placer, api, settings, metrics = self.model, self.placer, self.api, self.settings, self.metrics
        writer = ClaimStatusWriter(api=api, model=model, on_claim_event=self.took_own_write)
        self.writer = writer
        self.index_check = PlacerIndexCheck(
            model=model, placer=placer, metrics=metrics, events=self.events, api=api
        )
        self.allocator = ClaimAllocator(
            model=model,
            placer=placer,
            api=api,
            settings=settings,
            metrics=metrics,
            writer=writer,
            waits=self.waits,
            reservations=self.reservations,
            index_check=self.index_check,
            on_claim_event=self.took_own_write,
            clock=clock,
            compiler=compiler,
            mark_later=lambda delay, key: self.queue.mark_later(delay, key),
            slot_released=self._slot_released,
            book=self.book,
        )
        self.teller = ClaimTeller(
            model=model,
            book=self.book,
            waits=self.waits,
            reservations=self.reservations,
            searches=self.allocator.searches,
            writer=writer,
            events=self.events,
            metrics=metrics,
            settings=settings,
            api_version=lambda: api.api_version,
            clock=clock,
            mark_later=lambda delay, key: self.queue.mark_later(delay, key),
        )
        self.releaser = ClaimReleaser(
            model=model,
            api=api,
            metrics=metrics,
            events=self.events,
            writer=writer,
            queue=self.queue,
            refetch=self._refetch,
            book=self.book,
        )

    # -- inputs ---------------------------------------------------------------------------------

    def idle(self) -> bool:
        """No claim queued or being written."""
        return self.queue.idle()

    def failing(self) -> frozenset[object]:
        """Claims that cannot be allocated now (waiting for kube-scheduler is not failing)."""
        return frozenset(k for k in self.book.failures if k not in self.book.waiting)

    def waiting(self) -> frozenset[object]:
        """Claims giving way to kube-scheduler now."""
        return frozenset(self.book.waiting)

    def longest_wait(self) -> float:
        """Seconds the claim that has waited longest for kube-scheduler has waited so far; 0 if none."""
        return self.waits.longest_wait()

    def mark(self, key: ClaimKey) -> None:
        self.queue.mark(key)

    def on_claim_event(self, obj: Mapping[str, Any], *, deleted: bool) -> None:
        """A claim as a watch or a listing brings it: into the model, and queued for a look."""
        self._take(obj, deleted=deleted, requeue=True)

    def took_own_write(self, obj: Mapping[str, Any], *, deleted: bool) -> None:
        """A claim as the server answered one of our own writes: into the model (so that it never
        lags what we wrote), but not queued again: the task that wrote it has done its look, and
        the watch's copy of the same version is then not news."""
        self._take(obj, deleted=deleted, requeue=False)

    def _take(self, obj: Mapping[str, Any], *, deleted: bool, requeue: bool) -> None:
        key = claim_key_of(obj)
        before = self.model.claims.get(key)
        held_before = before is not None and before.status.allocation is not None
        if deleted:
            self.model.remove_claim(
                key, resource_version=str((obj.get("metadata") or {}).get("resourceVersion", ""))
            )
            self.reservations.gone(key)  # its rules deleted, then everything about it forgotten
            self.book.forget(key)
            if held_before:
                self.waits.parked_helped()
                self.retry_failing()
            self.waits.recheck()
            self._verify_after_event()
            return
        result = self.model.upsert_claim(obj)
        if result is None:
            return  # older than what we have
        if isinstance(result, ResourceClaim):
            if result.status.allocation is not None or result.metadata.deletion_timestamp is not None:
                self.waits.stop(key)
            if result.status.reserved_for:
                self.book.reserved_by_pods.add(key)
            if held_before and result.status.allocation is None:
                self.waits.parked_helped()
                self.retry_failing()  # devices were freed
        if requeue:
            self.mark(key)
        self.waits.recheck()
        self._verify_after_event()

    def on_cluster_change(self) -> None:
        """Slices, classes or nodes changed: claims that could not be allocated get another try."""
        self.waits.parked_helped()
        self.retry_failing()
        for claim in self.model.pending_claims():
            if is_ours(claim, ownership=self.settings.ownership, classes=self.classes):
                self.queue.dirty[ClaimKey(claim.namespace, claim.name)] = None
        self.queue.wake.set()
        self._verify_after_event()

    def _verify_after_event(self) -> None:
        if self.settings.verify_placer_index:
            self.index_check.check(found_by="check")

    def retry_failing(self) -> None:
        self.queue.mark_all(list(self.book.failures))

    def on_pod_change(self) -> None:
        """A pod changed (created, bound, deleted, ...): what kube-scheduler has yet to place may
        have changed, so claims waiting for it get another try."""
        self.waits.pods_changed()
        self.waits.recheck()

    def on_pod_gone(self, *, namespace: str, name: str) -> None:
        """A pod vanished: claims we allocated that it reserved need their reservedFor cleaned."""
        for key, claim in self.model.claims.items():
            if (
                allocated_by_us(claim)
                and any(r.resource == "pods" and r.name == name for r in claim.status.reserved_for)
                and key.namespace == namespace
            ):
                self.mark(key)

    def assess(self, claim: ResourceClaim) -> Outcome:
        """Where the claim would go on the model as it is now, or why it cannot go anywhere, as far
        as the event loop's slice finds out."""
        return self.allocator.assess(claim)

    async def assess_fully(self, claim: ResourceClaim) -> Outcome | None:
        """The same, searched on in a worker thread when the slice is not enough (None: the claim
        changed meanwhile). Nothing is held: for explanations."""
        return await self.allocator.assess_fully(claim, check_taken=False)

    # -- re-listing (see relist.py) -------------------------------------------------------------

    async def resync(self) -> None:
        await self.relister.resync()

    async def take_over(self) -> None:
        """This instance became the active one: every claim is queued, from the model the watches
        kept current while it stood by (listed first only if it never was). A re-list in flight,
        after a gap in a watch, is waited for; a fresh one follows in the background, to catch
        what a watch may have missed, without holding the first allocation back."""
        if not self.synced.is_set():
            await self.resync()
            return
        await self.relister.settle()
        keys = [*self.model.claims, *self.model.invalid_claims]
        self.queue.mark_all(keys)
        logger.info(
            "taking over with the model kept current while standing by (listed %s): %d claims queued; "
            "re-listing in the background",
            self.relister.describe_age(),
            len(keys),
        )
        self.relister.request_relist()

    async def relist(self, kinds: Iterable[str], *, mark_all: bool = False) -> dict[str, int]:
        return await self.relister.relist(kinds, mark_all=mark_all)

    async def list_for_watch(self, kind: str) -> str:
        return await self.relister.list_for_watch(kind)

    def watch_relisted(self, kind: str) -> None:
        self.relister.watch_relisted(kind)

    def watch_event(self, kind: str) -> None:
        self.relister.watch_event(kind)

    def request_relist(self) -> None:
        self.relister.request_relist()

    @property
    def _relist_task(self) -> asyncio.Task[None] | None:
        """The re-list in progress, if any (tests cancel it)."""
        return self.relister.task

    @contextlib.asynccontextmanager
    async def _slot_released(self) -> AsyncIterator[None]:
        """Give the calling claim task's write slot up for the block (a search in a worker thread),
        and take one again after it."""
        self._writes.release()
        try:
            yield
        finally:
            await self._writes.acquire()

    # -- the worker -----------------------------------------------------------------------------

    async def run(self, *, active: Callable[[], bool] = lambda: True) -> None:
        """Drain the queue forever. ``active`` is False while another instance is the active one."""
        queue = self.queue
        while True:
            if not queue.turns:
                await queue.wake.wait()
                queue.wake.clear()
            if not active():
                queue.hold_back()
                await asyncio.sleep(1.0)
                queue.wake.set()
                continue
            if not self.synced.is_set():
                await self.resync()
            if not queue.dirty and not queue.turns:
                continue
            # A slot first, then the claim: claims marked while the worker waited for a slot take
            # their namespace's turn instead of waiting behind everything taken before them.
            await self._writes.acquire()
            key = queue.next(order=self._urgency, tier=self._tier)
            if key is None:
                self._writes.release()
                continue
            queue.start(key)
            self._tasks.spawn(self._reconcile_guarded(key), name=f"claim {key}")
            if not queue.turns:
                await self.releaser.repair_double_bookings()

    def _tier(self, key: ClaimKey) -> int:
        return self._urgency(key)[0]

    def _urgency(self, key: ClaimKey) -> tuple[int, str]:
        """Claims waiting for devices, and claims being deleted (which free devices), before claims
        that hold theirs; oldest first within each. After a takeover every claim is queued, and at
        scale the allocated ones (checks that rarely find anything) would otherwise hold new claims
        back for seconds."""
        claim = self.model.claims.get(key)
        created = self.model.claim_created.get(key, "")
        if claim is None or claim.status.allocation is None or claim.metadata.deletion_timestamp is not None:
            return (0, created)
        return (1, created)

    async def drain(self, *, within: float = 30.0) -> None:
        """Wait until the queue is empty and no claim is being written (tests)."""
        await self.queue.drain(within=within)

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
            self.queue.dirty[key] = None
        except (Conflict, Gone):
            self.metrics.conflicts.inc()
            try:
                await self._refetch(key)
            except Exception as exc:
                self._retry_later(key, exc)
        except Exception as exc:
            self._retry_later(key, exc)
        finally:
            self._writes.release()
            self.queue.done(key)

    def _retry_later(self, key: ClaimKey, exc: Exception) -> None:
        """Queue the claim again after its backoff (and after the server's Retry-After, if any)."""
        self.model.forget_assumed(key)
        attempt, delay = self.backoff.failed(key, retry_after=retry_after(exc))
        # One line per claim and kind of failure every 30 s at most: a failure that keeps coming
        # back is counted in the next line logged, not repeated.
        held = self._log_throttle.allow((key, type(exc)))
        _count_and_say_retry(key=key, exc=exc, attempt=attempt, delay=delay, held=held, metrics=self.metrics)
        self.queue.mark_later(delay, key)

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
            self.teller.invalid(invalid)
            return
        claim = self.model.claims.get(key)
        if claim is None:
            return
        ours_by_finalizer = OPERATOR_FINALIZER in claim.metadata.finalizers
        if claim.metadata.deletion_timestamp is not None:
            if ours_by_finalizer and (released := await self.releaser.release_deleted(claim)):
                await self.teller.apply(released)
            return
        if claim.status.allocation is not None:
            if ours_by_finalizer and (released := await self.releaser.maintain_allocated(claim)):
                await self.teller.apply(released)
            return
        if not is_ours(claim, ownership=self.settings.ownership, classes=self.classes):
            self.waits.stop(key)
            self.reservations.gone(key)
            if ours_by_finalizer:
                await self.writer.patch_meta(claim, finalizer=False, condition=None)
            return
        outcome = await self.allocator.allocate(claim)
        if outcome is not None:
            await self.teller.apply(outcome)


def _count_and_say_retry(
    *, key: ClaimKey, exc: Exception, attempt: int, delay: float, held: int | None, metrics: Metrics
) -> None:
    """Count a failed attempt at a claim, and log it unless the throttle holds it back (``held``:
    None; else how many were held back since the last line)."""
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
        metrics.api_retries.labels(error_cause(exc)).inc()
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
        metrics.reconcile_errors.labels("ResourceClaim").inc()
        if held is not None:
            logger.exception(
                "claim %s: attempt #%d failed; will retry in %.1f s%s",
                key,
                attempt,
                delay,
                held_back(held),
            )
