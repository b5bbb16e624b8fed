"""Allocating one claim: check it, place it, give way to kube-scheduler if it must, then write
the finalizer and ``status.allocation``; or find why it cannot be allocated.

1. place it on the model (the placer), and hold the chosen devices in the model (``assume``)
   before the first ``await``, so that no other placement can take them;
2. add the operator's finalizer with a merge patch carrying ``metadata.resourceVersion``;
3. write ``status.allocation`` the same way.

A write that fails forgets the claim's assumed devices. What came of it is returned as an outcome
(:mod:`dra_operator.claims.tell`), which the worker records and tells the claim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager

from dra_api.model import ResourceClaim
from dra_api.names import OPERATOR_FINALIZER
from dra_operator.base.settings import Settings
from dra_operator.cel import BudgetExhausted, WorkBudget, charged_to
from dra_operator.claims.backoff import SearchBackoff
from dra_operator.claims.claimchecks import validate_claim
from dra_operator.claims.placerindex import PlacerIndexCheck
from dra_operator.claims.status import CONDITION_ANNOTATION, ClaimInput, ClaimStatusWriter, now_stamp
from dra_operator.claims.tell import (
    Allocated,
    BudgetUsed,
    ClaimOutcome,
    GivingWay,
    Refused,
    Reserved,
    age_seconds,
)
from dra_operator.client.kubeapi import KubeApi
from dra_operator.model.book import ClaimBook
from dra_operator.model.cluster import ClaimKey, ClusterModel, DeviceID
from dra_operator.model.metrics import Metrics
from dra_operator.planner import SPREAD
from dra_operator.planner.placement import Outcome, OutOfBudget, Placement, Placer, Unallocatable
from dra_operator.scheduler.contention import Crowded, SchedulerDemand
from dra_operator.scheduler.reservation import NodeReservations, choose_target
from dra_operator.scheduler.waits import SchedulerWaits, reserved_message

logger = logging.getLogger(__name__)


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

    async def allocate(self, claim: ResourceClaim) -> ClaimOutcome | None:
        """Place the claim and write its allocation, or find why not; None when there is nothing to
        tell (its back-off runs, or it changed meanwhile)."""
        key = ClaimKey(claim.namespace, claim.name)
        if self.searches.waiting(key):
            return None  # its back-off brings it back; nothing in the cluster does sooner
        cooling = self.searches.defer(key)
        if cooling is not None:
            if cooling > 0:
                self.mark_later(cooling, key)  # once: whatever asked for it is seen to then
            return None
        assessed = await self.assess_fully(claim)
        if assessed is None:
            return None
        if isinstance(assessed, OutOfBudget):
            return BudgetUsed(claim=claim, found=assessed)
        outcome = assessed
        if isinstance(outcome, Unallocatable):
            # Every device it could use is held: while pods wait for kube-scheduler, each one freed
            # goes to one of them; a claim that has waited long enough gets a node reserved.
            demand = self.waits.demand()
            if outcome.reason == "NoFit" and not demand.empty:
                reserved = await self._reserve_if_due(claim, demand)
                if reserved is not None:
                    return reserved
            return Refused(claim=claim, why=outcome)
        demand = self.waits.demand()
        if not demand.empty:
            found = self._clear_of_scheduler(claim, outcome, demand)
            if isinstance(found, Crowded):
                reserved = await self._reserve_if_due(claim, demand)
                return reserved or GivingWay(claim=claim, demand=demand, crowded=found)
            outcome = found
        return await self._write(claim, outcome)

    async def _write(self, claim: ResourceClaim, outcome: Placement) -> ClaimOutcome | None:
        key = ClaimKey(claim.namespace, claim.name)
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
                return None
            # Pods may have come to kube-scheduler while the finalizer was being written, and it may
            # have taken one of the devices (its write shows up in the model through the watch).
            # Checking both again here shrinks the race to the status write itself.
            demand = self.waits.demand()
            crowded = self.waits.crowded(allocation, demand, reserved=self.reservations.settled_devices(key))
            if crowded is not None:
                self.model.forget_assumed(key)
                return GivingWay(claim=current, demand=demand, crowded=crowded)
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
        return Allocated(claim=claim, allocation=allocation, node=outcome.node)

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

    async def _reserve_if_due(self, claim: ResourceClaim, demand: SchedulerDemand) -> Reserved | None:
        """The claim waits on a node reserved for it (reserved now, with what to say, or before);
        None when it has not waited long enough, no node qualifies, or reservations are off or
        refused."""
        key = ClaimKey(claim.namespace, claim.name)
        for expired in self.reservations.expire():
            self.mark_later(0.0, expired)
        if self.reservations.of(key) is not None:
            return Reserved(claim=claim, message=None)
        waited = age_seconds(self.model.claim_created.get(key, ""), now=self.clock())
        if waited is None or not self.reservations.due(claim, waited_s=waited):
            return None
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
                ) or choose_target(claim=claim, model=self.model, index=index, in_use=in_use, excluded=busy)
        except BudgetExhausted:
            return None
        if target is None:
            return None
        reservation = await self.reservations.reserve(claim, target)
        if reservation is None:
            return None
        message = reserved_message(
            demand=demand, node=target.node, devices=[d[2] for d in target.devices], rules=reservation.rules
        )
        return Reserved(claim=claim, message=message)
