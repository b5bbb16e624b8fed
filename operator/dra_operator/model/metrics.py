"""Prometheus metrics of the operator, in base units, counters ending in ``_total``.

Gauges that describe the cluster (claims by state, devices per driver and class) are computed from
the model when scraped, so they can never drift from it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dra_api.names import OPERATOR_FINALIZER
from dra_operator.model.cluster import ClusterModel

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


WAIT_REASONS = ("none", "scheduler_busy", "unallocatable")
"""Reasons of ``dra_operator_allocation_wait_seconds``: what held the claim before its allocation."""


RESERVATION_OUTCOMES = ("allocated", "expired", "gone", "refused")
"""How a reservation of devices ends (``dra_operator_device_reservations_total``)."""


def claim_state(*, allocated: bool, deleting: bool, ours: bool, failing: bool, waiting: bool = False) -> str:
    if deleting:
        return "deleting"
    if allocated:
        return "allocated_by_operator" if ours else "allocated_by_others"
    if waiting:
        return "waiting_for_scheduler"
    return "unallocatable" if failing else "pending"


def devices_per_class(model: ClusterModel) -> dict[str, int]:
    """How many published devices each DeviceClass's selectors match (a selector failing on a
    device counts as no match, as in allocation). Classes whose selectors do not compile are left
    out: the DeviceClass keeper reports them."""
    from dra_operator.allocator import AllocationError, class_matches
    from dra_operator.allocator.pools import DeviceEntry
    from dra_operator.cel import CelCompileError, compile_selector

    valid = []
    for cls in model.classes.values():
        try:
            for selector in cls.selectors:
                if selector.cel is not None:
                    compile_selector(selector.cel)  # cached by expression text
        except CelCompileError:
            continue
        valid.append(cls)
    counts = {cls.name: 0 for cls in valid}
    for sl in model.slices.values():
        for device in sl.devices:
            entry = DeviceEntry(slice_=sl, device=device)
            for cls in valid:
                try:
                    if class_matches(cls, entry):
                        counts[cls.name] += 1
                except AllocationError:
                    continue
    return counts


class _ModelCollector(Collector):
    def __init__(
        self,
        model: ClusterModel,
        failing: Callable[[], frozenset[object]],
        waiting: Callable[[], frozenset[object]],
    ) -> None:
        self.model = model
        self.failing = failing
        self.waiting = waiting
        self._per_class: tuple[int, dict[str, int]] | None = None

    def _class_totals(self) -> dict[str, int]:
        # Recomputed only when classes, slices or nodes changed.
        if self._per_class is None or self._per_class[0] != self.model.generation:
            self._per_class = (self.model.generation, devices_per_class(self.model))
        return self._per_class[1]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        model = self.model
        failing = self.failing()
        waiting = self.waiting()
        states: Counter[str] = Counter()
        for key, claim in model.claims.items():
            states[
                claim_state(
                    allocated=claim.status.allocation is not None,
                    deleting=claim.metadata.deletion_timestamp is not None,
                    ours=OPERATOR_FINALIZER in claim.metadata.finalizers,
                    failing=key in failing,
                    waiting=key in waiting,
                )
            ] += 1
        claims = GaugeMetricFamily(
            "dra_operator_claims", "ResourceClaims the operator knows, by state.", labels=["state"]
        )
        for state in (
            "pending",
            "waiting_for_scheduler",
            "unallocatable",
            "allocated_by_operator",
            "allocated_by_others",
            "deleting",
        ):
            claims.add_metric([state], states[state])
        yield claims

        total: Counter[str] = Counter()
        for sl in model.slices.values():
            total[sl.driver] += len(sl.devices)
        allocated: Counter[str] = Counter()
        by_class: Counter[tuple[str, str]] = Counter()
        for claim in model.allocated_claims():
            assert claim.status.allocation is not None
            classes = _request_classes(claim)
            for result in claim.status.allocation.devices:
                allocated[result.driver] += 1
                by_class[(result.driver, classes.get(result.request, ""))] += 1
        devices = GaugeMetricFamily(
            "dra_operator_devices", "Devices published in ResourceSlices, by driver.", labels=["driver"]
        )
        for driver, n in sorted(total.items()):
            devices.add_metric([driver], n)
        yield devices
        per_class = GaugeMetricFamily(
            "dra_operator_class_devices",
            "Published devices that each DeviceClass's selectors match.",
            labels=["device_class"],
        )
        for cls, n in sorted(self._class_totals().items()):
            per_class.add_metric([cls], n)
        yield per_class
        used = GaugeMetricFamily(
            "dra_operator_devices_allocated",
            "Devices allocated to claims (by anyone), by driver and DeviceClass of the request.",
            labels=["driver", "device_class"],
        )
        for (driver, cls), n in sorted(by_class.items()):
            used.add_metric([driver, cls], n)
        yield used


def _request_classes(claim: object) -> dict[str, str]:
    from dra_api.model import ResourceClaim

    assert isinstance(claim, ResourceClaim)
    out: dict[str, str] = {}
    for r in claim.spec.requests:
        if r.exactly is not None:
            out[r.name] = r.exactly.device_class_name
        for s in r.first_available:
            out[f"{r.name}/{s.name}"] = s.spec.device_class_name
    return out


class Metrics:
    """The operator's metrics in their own registry (tests create as many as they like), grouped
    by what they count; their families are created (and exported) in this order."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._count_allocations()
        self._count_keeping_up()
        self._count_beside_allocation()
        self._count_watches()

    def _count_allocations(self) -> None:
        """Claims allocated and deallocated: how long they waited, and what failed."""
        self.allocation_latency = Histogram(
            "dra_operator_allocation_duration_seconds",
            "Time from a claim's creation to its allocation by the operator.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.allocation_wait = Histogram(
            "dra_operator_allocation_wait_seconds",
            "Time from a claim's creation to its allocation by the operator, by what held it: "
            "'scheduler_busy' (it gave way to pods kube-scheduler was placing), 'unallocatable' (no "
            "device fitted for a while) or 'none'.",
            ["reason"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        for reason in WAIT_REASONS:
            self.allocation_wait.labels(reason)  # every series exported from the start
        self.allocations = PromCounter(
            "dra_operator_allocations",
            "Claims the operator allocated.",
            registry=self.registry,
        )
        self.allocation_failures = PromCounter(
            "dra_operator_allocation_failures",
            "Attempts to allocate a claim that found no solution, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.searches_off_loop = PromCounter(
            "dra_operator_allocation_searches_off_loop",
            "Placements that did not finish within their slice of the event loop and were searched in a "
            "worker thread (--allocation-search-slice-seconds).",
            registry=self.registry,
        )
        self.deallocations = PromCounter(
            "dra_operator_deallocations", "Claims the operator deallocated.", registry=self.registry
        )

    def _count_keeping_up(self) -> None:
        """Keeping up with the cluster: writes refused and retried, errors, re-lists and the first listing,
        and repairs of the placer's index."""
        self.conflicts = PromCounter(
            "dra_operator_write_conflicts",
            "Writes refused with 409 Conflict (someone else changed the claim first), retried.",
            registry=self.registry,
        )
        self.reconcile_errors = PromCounter(
            "dra_operator_reconcile_errors",
            "Unexpected errors while reconciling an object, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.relists = PromCounter(
            "dra_operator_relists",
            "Re-lists of a resource into the model after a watch gap (410 Gone, reconnect), by resource.",
            ["resource"],
            registry=self.registry,
        )
        self.model_sync = Gauge(
            "dra_operator_model_sync_duration_seconds",
            "How long the first full listing of the cluster into the model took (at start, on the active "
            "instance and the standby alike; nothing is allocated before it ends), by phase: 'list' (the "
            "API requests and their decoding, all resources at once) and 'apply' (making the model "
            "match them).",
            ["phase"],
            registry=self.registry,
        )
        self.api_retries = PromCounter(
            "dra_operator_api_retries",
            "Claim reconciles retried after a transient API error (429, 5xx, connection), by cause.",
            ["cause"],
            registry=self.registry,
        )
        self.index_repairs = PromCounter(
            "dra_operator_placer_index_repairs",
            "Times the placer's free-device index disagreed with the cluster model and was rebuilt, by "
            "how it was found: 'placement' (it chose a device another claim holds) or 'check' "
            "(--verify-placer-index).",
            ["found_by"],
            registry=self.registry,
        )

    def _count_beside_allocation(self) -> None:
        """What the operator does beside allocating: device reservations, Events dropped, explanations
        of claims kube-scheduler leaves pending."""
        self.reservations = PromCounter(
            "dra_operator_device_reservations",
            "Devices reserved for claims that kube-scheduler's pods kept from every device they could "
            "use (DeviceTaintRules), by how the reservation ended: 'allocated', 'expired' (no device "
            "freed in time), 'gone' (the claim was deleted or no longer waits) or 'refused' (the API "
            "refused the rules).",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in RESERVATION_OUTCOMES:
            self.reservations.labels(outcome)
        self.events_dropped = PromCounter(
            "dra_operator_events_dropped",
            "Events not posted because the event queue was full.",
            registry=self.registry,
        )
        self.scheduler_claim_explanations = PromCounter(
            "dra_operator_scheduler_claim_explanations",
            "Warning Events posted on claims kube-scheduler owns and has left pending, saying why the "
            "operator's allocator cannot place them either.",
            registry=self.registry,
        )

    def _count_watches(self) -> None:
        """The watches: events received, and streams started again."""
        self.watch_events = PromCounter(
            "dra_operator_watch_events",
            "Watch events received, by resource.",
            ["resource"],
            registry=self.registry,
        )
        self.watch_restarts = PromCounter(
            "dra_operator_watch_restarts",
            "Watch streams that ended and were started again, by resource and reason: 'inactive' "
            "(nothing, not even a bookmark, for the inactivity timeout: a silent stall), 'expired' (410 "
            "Gone: listed again), 'error' (connection or API error), 'closed' (the server ended it; "
            "normal after timeoutSeconds). Kopf's watches count 'inactive' and 'expired' only.",
            ["resource", "reason"],
            registry=self.registry,
        )

    def attach_model(
        self,
        model: ClusterModel,
        failing: Callable[[], frozenset[object]],
        waiting: Callable[[], frozenset[object]] = frozenset,
    ) -> None:
        self.registry.register(_ModelCollector(model, failing, waiting))

    def attach_scheduler_wait(self, longest: Callable[[], float]) -> None:
        """``dra_operator_scheduler_wait_longest_seconds``: how long the claim that has waited
        longest for kube-scheduler has waited so far (a claim that waits for good is never observed
        by the histogram, which counts allocations)."""
        gauge = Gauge(
            "dra_operator_scheduler_wait_longest_seconds",
            "How long the claim that has waited longest for kube-scheduler (condition "
            "WaitingForScheduler) has waited so far; 0 when none waits.",
            registry=self.registry,
        )
        gauge.set_function(longest)

    def attach_search_threads(self, busy: Callable[[], int], queued: Callable[[], int]) -> None:
        """``dra_operator_allocation_searches{state}``: searches in worker threads now, running or
        waiting for a thread."""
        gauge = Gauge(
            "dra_operator_allocation_searches",
            "Placements being searched in worker threads now, by state: 'running' or 'queued' (waiting "
            "for a thread, or for their namespace's turn).",
            ["state"],
            registry=self.registry,
        )
        gauge.labels("running").set_function(busy)
        gauge.labels("queued").set_function(queued)

    def attach_synced(self, synced: Callable[[], bool]) -> None:
        """``dra_operator_model_synced``: 1 once the model holds a full listing of the cluster."""
        gauge = Gauge(
            "dra_operator_model_synced",
            "1 once this instance's model holds a full listing of the cluster (the watches keep it "
            "current from then on; a standby at 1 takes over without listing again), 0 before.",
            registry=self.registry,
        )
        gauge.set_function(lambda: 1.0 if synced() else 0.0)

    def attach_active(self, identity: str, active: Callable[[], bool]) -> None:
        """``dra_operator_active{identity}``: 1 on the instance that allocates, 0 on a standby."""
        gauge = Gauge(
            "dra_operator_active",
            "1 while this instance is the active one (it allocates and writes), 0 while it is a standby.",
            ["identity"],
            registry=self.registry,
        )
        gauge.labels(identity).set_function(lambda: 1.0 if active() else 0.0)
