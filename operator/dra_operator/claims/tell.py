"""What came of looking at a claim, and the one place that records it and tells the claim.

The parts of the claim path decide (:mod:`allocate` places a claim and writes its allocation,
reserves a node for it, or finds why it cannot have one) and return an outcome; the worker hands
the outcome to :class:`ClaimTeller`, which alone puts it in the claim book, counts it, and says it on
the claim: its condition, an Event, a log line, each once while it stays the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from dra_api import times
from dra_api.model import AllocationResult, ResourceClaim
from dra_api.names import OPERATOR_FINALIZER
from dra_operator.base.settings import Settings
from dra_operator.claims.backoff import SearchBackoff
from dra_operator.claims.status import ClaimStatusWriter, condition_json, describe_allocation, involved
from dra_operator.client.events import EventSink
from dra_operator.model.book import ClaimBook
from dra_operator.model.cluster import ClaimKey, ClusterModel, InvalidClaim
from dra_operator.model.metrics import Metrics
from dra_operator.planner import truncate
from dra_operator.planner.placement import OutOfBudget, Unallocatable
from dra_operator.scheduler.contention import Crowded, SchedulerDemand
from dra_operator.scheduler.reservation import NodeReservations
from dra_operator.scheduler.waits import (
    UNFINISHED_RECHECK_S,
    WAITING_REASON,
    SchedulerWaits,
    waiting_message,
)

logger = logging.getLogger(__name__)

RESERVED_REASON = "NodeReserved"
SEARCH_EXHAUSTED_REASON = "SearchBudgetExhausted"


@dataclass(frozen=True, slots=True)
class Allocated:
    """The allocation was written."""

    claim: ResourceClaim
    allocation: AllocationResult
    node: str | None


@dataclass(frozen=True, slots=True)
class Refused:
    """The claim cannot be allocated now, and why."""

    claim: ResourceClaim
    why: Unallocatable


@dataclass(frozen=True, slots=True)
class GivingWay:
    """The claim gives way to the pods kube-scheduler is placing."""

    claim: ResourceClaim
    demand: SchedulerDemand
    crowded: Crowded


@dataclass(frozen=True, slots=True)
class Reserved:
    """The claim waits on a node reserved for it; ``message`` when the reservation is new."""

    claim: ResourceClaim
    message: str | None


@dataclass(frozen=True, slots=True)
class BudgetUsed:
    """The claim's search used its whole budget; ``found`` is what it learnt."""

    claim: ResourceClaim
    found: OutOfBudget


@dataclass(frozen=True, slots=True)
class Released:
    """The claim's devices were given back, and why."""

    claim: ResourceClaim
    allocation: AllocationResult
    why: str


ClaimOutcome = Allocated | Refused | GivingWay | Reserved | BudgetUsed | Released


def age_seconds(created: str, *, now: float) -> float | None:
    """How old a creationTimestamp is at ``now`` (seconds since the epoch); None if unreadable."""
    stamp = times.parse(created)
    return None if stamp is None else max(0.0, now - stamp)


class ClaimTeller:
    """Applies outcomes: the claim book, the metrics, and what the claim is told."""

    def __init__(
        self,
        *,
        model: ClusterModel,
        book: ClaimBook,
        waits: SchedulerWaits,
        reservations: NodeReservations,
        searches: SearchBackoff,
        writer: ClaimStatusWriter,
        events: EventSink,
        metrics: Metrics,
        settings: Settings,
        api_version: Callable[[], str],
        clock: Callable[[], float],
        mark_later: Callable[[float, ClaimKey], None],
    ) -> None:
        self.model = model
        self.book = book
        self.waits = waits
        self.reservations = reservations
        self.searches = searches
        self.writer = writer
        self.events = events
        self.metrics = metrics
        self.settings = settings
        self.api_version = api_version
        self.clock = clock
        self.mark_later = mark_later
        self._class_reports: dict[str, tuple[str, int, str]] = {}

    async def apply(self, outcome: ClaimOutcome) -> None:
        match outcome:
            case Allocated():
                self._allocated(outcome)
            case Refused(claim=claim, why=why):
                await self.refused(claim, why)
            case GivingWay():
                await self._giving_way(outcome)
            case Reserved():
                await self._reserved(outcome)
            case BudgetUsed():
                await self._budget_used(outcome)
            case Released(claim=claim, allocation=allocation, why=why):
                text = describe_allocation(allocation, None).replace("allocated", "released", 1)
                self._post(claim, type_="Normal", reason="Deallocated", message=f"{text} ({why})")

    def _post(self, claim: ResourceClaim, *, type_: str, reason: str, message: str) -> None:
        self.events.post(
            involved=involved(claim, api_version=self.api_version()),
            type_=type_,
            reason=reason,
            message=message,
        )

    def _allocated(self, outcome: Allocated) -> None:
        claim = outcome.claim
        key = ClaimKey(claim.namespace, claim.name)
        self.searches.forget(key)
        self.reservations.allocated(key, {r.device_id for r in outcome.allocation.devices})
        waited = self.waits.forget(key)
        unallocatable = self.book.failures.pop(key, None)
        self.metrics.allocations.inc()
        age = age_seconds(self.model.claim_created.get(key, ""), now=self.clock())
        if age is not None:
            self.metrics.allocation_latency.observe(age)
            reason = "scheduler_busy" if waited else "unallocatable" if unallocatable else "none"
            self.metrics.allocation_wait.labels(reason).observe(age)
        text = describe_allocation(outcome.allocation, outcome.node)
        logger.info("claim %s: %s", key, text)
        self._post(claim, type_="Normal", reason="Allocated", message=text)

    async def refused(self, claim: ResourceClaim, why: Unallocatable) -> None:
        """The claim cannot be allocated now: recorded, counted, and said once while it stays so."""
        key = ClaimKey(claim.namespace, claim.name)
        self.waits.stop(key)
        if why.reason != "NoFit":
            self.reservations.gone(key)  # it cannot use the node either
        self.metrics.allocation_failures.labels(why.reason).inc()
        previous = self.book.failures.get(key)
        self.book.failures[key] = why
        if (
            previous is not None
            and previous.message == why.message
            and (OPERATOR_FINALIZER not in claim.metadata.finalizers)
        ):
            return  # already said; no event storm while the cluster stays the same
        logger.info("claim %s cannot be allocated (%s): %s", key, why.reason, why.message)
        self._post(claim, type_="Warning", reason=why.reason, message=why.message)
        await self.writer.patch_meta(
            claim,
            finalizer=False,
            condition=condition_json(status="False", reason=why.reason, message=why.message),
        )
        self._report_class_selector(why)

    async def _budget_used(self, outcome: BudgetUsed) -> None:
        """The search used its whole budget: say what it found and when it searches again."""
        claim = outcome.claim
        key = ClaimKey(claim.namespace, claim.name)
        count, delay = self.searches.exhausted(key)
        self.mark_later(delay, key)
        times = "once" if count == 1 else f"{count} times in a row"
        message = (
            f"{outcome.found.message.rstrip('.')}. The search has used its whole budget "
            f"({self.settings.allocation_search_budget_s:g} s of CPU) {times}; it searches again in "
            f"{delay:.0f} s"
        )
        await self.refused(claim, Unallocatable(reason=SEARCH_EXHAUSTED_REASON, message=truncate(message)))

    async def _giving_way(self, outcome: GivingWay) -> None:
        """Leave the claim until pods, claims or devices change; say why once per claim."""
        claim = outcome.claim
        key = ClaimKey(claim.namespace, claim.name)
        wait = self.waits.start(key)
        if outcome.crowded.unfinished:
            self.mark_later(UNFINISHED_RECHECK_S, key)
        if wait.announced:
            return
        message = waiting_message(demand=outcome.demand, crowded=outcome.crowded)
        await self.writer.patch_meta(
            claim,
            finalizer=OPERATOR_FINALIZER in claim.metadata.finalizers,
            condition=condition_json(status="False", reason=WAITING_REASON, message=message),
        )
        wait.announced = True
        logger.info("claim %s waits for kube-scheduler: %s", key, message)
        self._post(claim, type_="Normal", reason=WAITING_REASON, message=message)

    async def _reserved(self, outcome: Reserved) -> None:
        claim = outcome.claim
        key = ClaimKey(claim.namespace, claim.name)
        if outcome.message is not None:
            self._post(claim, type_="Normal", reason=RESERVED_REASON, message=outcome.message)
            self.waits.start(key).announced = True  # the Event says it; the condition follows
            await self.writer.patch_meta(
                claim,
                finalizer=OPERATOR_FINALIZER in claim.metadata.finalizers,
                condition=condition_json(status="False", reason=WAITING_REASON, message=outcome.message),
            )
        self.book.failures.pop(key, None)
        self.waits.start(key)

    def _report_class_selector(self, why: Unallocatable) -> None:
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
                "apiVersion": self.api_version(),
                "kind": "DeviceClass",
                "name": name,
                "uid": cls.metadata.uid,
            },
            type_="Warning",
            reason="InvalidSelector",
            message=f"DeviceClass {name}: spec.selectors[{index}].cel.expression "
            f"{cls.selectors[index].cel!r} fails on devices: {error}",
        )

    def invalid(self, invalid: InvalidClaim) -> None:
        """A claim the model could not read: said once while the reason stays the same."""
        known = self.book.failures.get(invalid.key)
        if known is not None and known.message == invalid.message:
            return
        self.book.failures[invalid.key] = Unallocatable(reason="InvalidClaim", message=invalid.message)
        self.metrics.allocation_failures.labels("InvalidClaim").inc()
        self.events.post(
            involved={
                "apiVersion": self.api_version(),
                "kind": "ResourceClaim",
                "name": invalid.key.name,
                "namespace": invalid.key.namespace,
                "uid": invalid.uid,
            },
            type_="Warning",
            reason="InvalidClaim",
            message=invalid.message,
        )
