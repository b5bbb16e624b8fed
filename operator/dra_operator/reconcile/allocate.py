"""Allocating one claim: check it, place it, give way to kube-scheduler if it must, then write
the finalizer and ``status.allocation``; or say why it cannot be allocated.

1. place it on the model (the placer), and hold the chosen devices in the model (``assume``)
   before the first ``await``, so that no other placement can take them;
2. add the operator's finalizer with a merge patch carrying ``metadata.resourceVersion``;
3. write ``status.allocation`` the same way.

A write that fails forgets the claim's assumed devices. A claim that cannot be allocated gets a
Warning Event and a condition; our finalizer is not left behind on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager

from dra_api.model import ResourceClaim
from dra_api.names import OPERATOR_FINALIZER
from dra_operator.cel import BudgetExhausted, WorkBudget, charged_to
from dra_operator.clustermodel import ClaimKey, ClusterModel, DeviceID, InvalidClaim
from dra_operator.events import EventSink
from dra_operator.kubeapi import KubeApi
from dra_operator.metrics import Metrics
from dra_operator.placement import Outcome, OutOfBudget, Placement, Placer, Unallocatable
from dra_operator.planner import SPREAD, truncate
from dra_operator.reconcile.backoff import SearchBackoff
from dra_operator.reconcile.book import ClaimBook
from dra_operator.reconcile.claimchecks import validate_claim
from dra_operator.reconcile.contention import Crowded, SchedulerDemand
from dra_operator.reconcile.placerindex import PlacerIndexCheck
from dra_operator.reconcile.reservation import NodeReservations, choose_target
from dra_operator.reconcile.schedulerwait import (
    UNFINISHED_RECHECK_S,
    WAITING_REASON,
    SchedulerWaits,
    reserved_message,
    waiting_message,
)
from dra_operator.reconcile.status import (
    CONDITION_ANNOTATION,
    ClaimInput,
    ClaimStatusWriter,
    condition_json,
    describe_allocation,
    involved,
    now_stamp,
)
from dra_operator.settings import Settings

logger = logging.getLogger(__name__)

RESERVED_REASON = "NodeReserved"
SEARCH_EXHAUSTED_REASON = "SearchBudgetExhausted"


def _age_seconds(created: str, *, now: float) -> float | None:
    stamp = _stamp_seconds(created)
    return None if stamp is None else max(0.0, now - stamp)


@functools.lru_cache(maxsize=256)
def _stamp_seconds(created: str) -> float | None:
    """Seconds since the epoch of a creationTimestamp. Memoised: strptime is slow, and the claims
    of a burst were created within a few seconds of each other (stamps have whole seconds)."""
    try:
        stamp = datetime.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None
    return stamp.timestamp()


class DevicesTaken(Exception):
    """The devices placed for a claim are held by other claims (``taken``: device -> a holder): a
    race with another allocator, or a placer out of step with the model."""

    def __init__(self, taken: Mapping[DeviceID, ClaimKey]) -> None:
        self.taken = dict(taken)
        super().__init__(", ".join(f"{'/'.join(d)} (held by {k})" for d, k in sorted(self.taken.items())))


class ClaimAllocator:
    def __init__(
        self,
        *,
        model: ClusterModel,
        placer: Placer,
        api: KubeApi,
        settings: Settings,
        metrics: Metrics,
        events: EventSink,
        writer: ClaimStatusWriter,
        waits: SchedulerWaits,
        reservations: NodeReservations,
        index_check: PlacerIndexCheck,
        on_claim_event: ClaimInput,
        clock: Callable[[], float],
        compiler: Callable[[str], object] | None,
        book: ClaimBook | None = None,
        mark_later: Callable[[float, ClaimKey], None] | None = None,
        slot_released: Callable[[], AbstractAsyncContextManager[None]] | None = None,
    ) -> None:
        self.model = model
        self.placer = placer
        self.api = api
        self.settings = settings
        self.metrics = metrics
        self.events = events
        self.writer = writer
        self.waits = waits
        self.reservations = reservations
        self.index_check = index_check
        self.on_claim_event = on_claim_event
        self.clock = clock
        self.compiler = compiler
        book = book if book is not None else ClaimBook()
        self.searches = SearchBackoff(
            base=settings.allocation_search_backoff_s,
            cap=settings.allocation_search_backoff_max_s,
            searches=book.searches,
        )
        self.mark_later = mark_later or (lambda delay, key: None)
        # While a claim's search runs in a worker thread its task gives its write slot up, so that
        # hard claims waiting there do not hold back the writes of the others.
        self.slot_released = slot_released or contextlib.nullcontext
        # The claim book's claims that cannot be allocated now, with what they were last told.
        self.failing: dict[ClaimKey, Unallocatable] = book.failures
        self._class_reports: dict[str, tuple[str, int, str]] = {}
        self._known_drivers: tuple[int, frozenset[str]] = (-1, frozenset())

    def known_drivers(self) -> frozenset[str]:
        """The drivers a claim may name: ours and every driver with slices. Kept per model
        generation (every change of slices moves it), not gathered from every slice per claim."""
        generation, drivers = self._known_drivers
        if generation != self.model.generation:
            drivers = frozenset(self.settings.drivers) | {s.driver for s in self.model.slices.values()}
            self._known_drivers = (self.model.generation, drivers)
        return drivers

    def assess(self, claim: ResourceClaim) -> Outcome:
        """Where the claim would go on the model as it is now, or why it cannot go anywhere, as far
        as a slice of the event loop finds out (OutOfBudget: not that far). Holds nothing: the
        caller assumes the devices if it goes on to allocate."""
        budget = WorkBudget.loop_slice(self.settings.allocation_search_slice_s)
        try:
            with charged_to(budget):
                invalid = validate_claim(claim, known_drivers=self.known_drivers(), compiler=self.compiler)
                if invalid is not None:
                    return invalid
                return self.placer.place(claims=[claim], model=self.model, budget=budget)
        except BudgetExhausted:  # a selector too long to compile on the loop
            return OutOfBudget(message="its selectors are compiled in a worker thread", spent_s=budget.spent)

    async def assess_fully(self, claim: ResourceClaim, *, check_taken: bool = True) -> Outcome | None:
        """:meth:`assess`, continued in a worker thread when the loop's slice is not enough (and
        straight there for a claim that needed one before). OutOfBudget: the whole budget was
        used. None: the claim changed or went away meanwhile. Devices found in the thread are
        checked against the model as it is when the answer comes (DevicesTaken when held)."""
        key = ClaimKey(claim.namespace, claim.name)
        if not self.searches.off_loop(key):
            outcome = self.assess(claim)
            if not isinstance(outcome, OutOfBudget):
                return outcome
        self.searches.went_off_loop(key)
        self.metrics.searches_off_loop.inc()
        drivers, compiler = self.known_drivers(), self.compiler
        async with self.slot_released():
            outcome = await self.placer.place_off_loop(
                claims=[claim],
                model=self.model,
                namespace=claim.namespace,
                # In the thread: a long selector is compiled there, not on the loop.
                check=lambda: validate_claim(claim, known_drivers=drivers, compiler=compiler),
            )
        if isinstance(outcome, Unallocatable) and outcome.spent_s is not None:
            self.searches.found_no_room(key, spent_s=outcome.spent_s)
        current = self.model.claims.get(key)
        if (
            current is None
            or current.metadata.uid != claim.metadata.uid
            or current.status.allocation is not None
            or current.metadata.deletion_timestamp is not None
        ):
            return None
        if check_taken and isinstance(outcome, Placement):
            taken = self.model.taken_by_others(key, outcome.allocations[0])
            if taken:
                raise DevicesTaken(taken)  # placed on a snapshot: another claim got there first
        return outcome

    async def allocate(self, claim: ResourceClaim) -> None:
        key = ClaimKey(claim.namespace, claim.name)
        if self.searches.waiting(key):
            return  # its back-off brings it back; nothing in the cluster does sooner
        cooling = self.searches.defer(key)
        if cooling is not None:
            if cooling > 0:
                self.mark_later(cooling, key)  # once: whatever asked for it is seen to then
            return
        assessed = await self.assess_fully(claim)
        if assessed is None:
            return
        if isinstance(assessed, OutOfBudget):
            await self._out_of_budget(claim, assessed)
            return
        outcome = assessed
        if isinstance(outcome, Unallocatable):
            # Every device it could use is held: while pods wait for kube-scheduler, each one freed
            # goes to one of them; a claim that has waited long enough gets a node reserved.
            demand = self.waits.demand()
            if outcome.reason == "NoFit" and not demand.empty and await self._reserve_if_due(claim, demand):
                return
            await self.fail(claim, outcome)
            return
        demand = self.waits.demand()
        if not demand.empty:
            found = self._clear_of_scheduler(claim, outcome, demand)
            if isinstance(found, Crowded):
                if not await self._reserve_if_due(claim, demand):
                    await self._wait_for_scheduler(claim, demand, found)
                return
            outcome = found
        # kube-scheduler (1.34+ with DRADeviceBindingConditions and DRAResourceClaimDeviceStatus) stamps
        # allocationTimestamp when it reserves a claim whose allocation lacks one, which the API
        # server refuses (allocation is immutable): a pod could never use the claim. Set it here;
        # a server with those gates off drops the field.
        allocation = dataclasses.replace(outcome.allocations[0], allocation_timestamp=now_stamp())
        # No await between placement (or, for a placement found in a worker thread, the check that its
        # devices are still free) and this line: the devices are held before anyone else looks.
        self.model.assume(key, allocation)
        try:
            current: ResourceClaim | None = claim
            if (
                OPERATOR_FINALIZER not in claim.metadata.finalizers
                or CONDITION_ANNOTATION in claim.metadata.annotations
            ):
                current = await self.writer.patch_meta(claim, finalizer=True, condition=None)
            if current is None or current.status.allocation is not None:
                self.model.forget_assumed(key)
                return
            # Pods may have come to kube-scheduler while the finalizer was being written, and it may
            # have taken one of the devices (its write shows up in the model through the watch).
            # Checking both again here shrinks the race to the status write itself.
            demand = self.waits.demand()
            crowded = self.waits.crowded(allocation, demand, reserved=self.reservations.settled_devices(key))
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
                self.index_check.check(found_by="placement", claim=claim, taken=taken)
                raise DevicesTaken(taken)
            obj = await self.writer.write_allocation(
                claim, allocation, resource_version=current.metadata.resource_version
            )
        except BaseException:
            self.model.forget_assumed(key)
            raise
        self.on_claim_event(obj, deleted=False)
        self.model.forget_assumed(key)
        self.searches.forget(key)
        self.reservations.allocated(key, {r.device_id for r in allocation.devices})
        waited = self.waits.forget(key)
        unallocatable = self.failing.pop(key, None)
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

    async def _out_of_budget(self, claim: ResourceClaim, outcome: OutOfBudget) -> None:
        """The search used its whole budget: say what it found and when it searches again."""
        key = ClaimKey(claim.namespace, claim.name)
        count, delay = self.searches.exhausted(key)
        self.mark_later(delay, key)
        times = "once" if count == 1 else f"{count} times in a row"
        message = (
            f"{outcome.message.rstrip('.')}. The search has used its whole budget "
            f"({self.settings.allocation_search_budget_s:g} s of CPU) {times}; it searches again in "
            f"{delay:.0f} s"
        )
        await self.fail(claim, Unallocatable(reason=SEARCH_EXHAUSTED_REASON, message=truncate(message)))

    def _clear_of_scheduler(
        self, claim: ResourceClaim, placement: Placement, demand: SchedulerDemand
    ) -> Placement | Crowded:
        """``placement``, or one on other devices, that kube-scheduler cannot reach while it places
        the waiting pods (on the node reserved for the claim, if any); or why the best found is not
        clear."""
        key = ClaimKey(claim.namespace, claim.name)
        reserved = self.reservations.settled_devices(key)
        crowded = self.waits.crowded(placement.allocations[0], demand, reserved=reserved)
        if crowded is None:
            return placement
        # The node with the most free devices has the most of them ahead of its last one (within the
        # loop's slice: an alternative it cannot find in time is none).
        spread = self.placer.place(claims=[claim], model=self.model, policy=SPREAD)
        if isinstance(spread, Placement):
            again = self.waits.crowded(spread.allocations[0], demand, reserved=reserved)
            if again is None:
                return spread
            crowded = again
        reservation = self.reservations.of(key)
        if reserved and reservation is not None:
            there = self.placer.place(claims=[claim], model=self.model, node=reservation.target.node)
            if (
                isinstance(there, Placement)
                and self.waits.crowded(there.allocations[0], demand, reserved=reserved) is None
            ):
                return there
        return crowded

    async def _reserve_if_due(self, claim: ResourceClaim, demand: SchedulerDemand) -> bool:
        """Whether the claim waits on a node reserved for it (reserved now or before); False when
        it has not waited long enough, no node qualifies, or reservations are off or refused."""
        key = ClaimKey(claim.namespace, claim.name)
        for expired in self.reservations.expire():
            self.waits.queue.dirty[expired] = None
        reservation = self.reservations.of(key)
        if reservation is None:
            waited = _age_seconds(self.model.claim_created.get(key, ""), now=self.clock())
            if waited is None or not self.reservations.due(claim, waited_s=waited):
                return False
            index = self.waits.clearance.index(self.model)
            in_use = self.model.devices_in_use()
            busy = self.reservations.reserved_nodes()
            tried = self.reservations.tried_nodes(key)
            # The claim's selectors over every node: new CEL evaluations within the loop's slice (what
            # they found is kept, so a choice cut short gets further the next time).
            try:
                with charged_to(WorkBudget.loop_slice(self.settings.allocation_search_slice_s)):
                    target = choose_target(
                        claim=claim, model=self.model, index=index, in_use=in_use, excluded=busy | tried
                    ) or choose_target(
                        claim=claim, model=self.model, index=index, in_use=in_use, excluded=busy
                    )
            except BudgetExhausted:
                return False
            if target is None:
                return False
            reservation = await self.reservations.reserve(claim, target)
            if reservation is None:
                return False
            message = reserved_message(
                demand=demand,
                node=target.node,
                devices=[d[2] for d in target.devices],
                rules=reservation.rules,
            )
            self.events.post(
                involved=involved(claim, api_version=self.api.api_version),
                type_="Normal",
                reason=RESERVED_REASON,
                message=message,
            )
            self.waits.start(key).announced = True  # the Event says it; the condition follows
            await self.writer.patch_meta(
                claim,
                finalizer=OPERATOR_FINALIZER in claim.metadata.finalizers,
                condition=condition_json(status="False", reason=WAITING_REASON, message=message),
            )
        self.failing.pop(key, None)
        self.waits.start(key)
        return True

    async def _wait_for_scheduler(
        self, claim: ResourceClaim, demand: SchedulerDemand, crowded: Crowded
    ) -> None:
        """Leave the claim until pods, claims or devices change; say why once per claim."""
        key = ClaimKey(claim.namespace, claim.name)
        wait = self.waits.start(key)
        if crowded.unfinished:
            self.mark_later(UNFINISHED_RECHECK_S, key)
        if wait.announced:
            return
        message = waiting_message(demand=demand, crowded=crowded)
        await self.writer.patch_meta(
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

    async def fail(self, claim: ResourceClaim, why: Unallocatable) -> None:
        key = ClaimKey(claim.namespace, claim.name)
        self.waits.stop(key)
        if why.reason != "NoFit":
            self.reservations.gone(key)  # it cannot use the node either
        self.metrics.allocation_failures.labels(why.reason).inc()
        previous = self.failing.get(key)
        self.failing[key] = why
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
        await self.writer.patch_meta(
            claim,
            finalizer=False,
            condition=condition_json(status="False", reason=why.reason, message=why.message),
        )
        await self._report_class_selector(why)

    async def _report_class_selector(self, why: Unallocatable) -> None:
        """A class selector that fails on devices (the API server only checks that it compiles)
        is the class's problem too: say so on the DeviceClass, once per class and error."""
        fault = why.class_selector
        if fault is None:
            return
        name, index, error = fault.class_name, fault.index, fault.detail
        cls = self.model.classes.get(name)
        if cls is None or index >= len(cls.selectors):
            return
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

    async def report_invalid(self, invalid: InvalidClaim) -> None:
        if invalid.key in self.failing and self.failing[invalid.key].message == invalid.message:
            return
        self.failing[invalid.key] = Unallocatable(reason="InvalidClaim", message=invalid.message)
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
