"""Why a request finds no devices on a node: how many of the node's devices pass each check, in
the search's order (:class:`RequestFunnel`), and the values a matchAttribute constraint could
choose from among those that pass them all (:class:`MatchValues`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dra_api.quantity import Quantity
from dra_operator.allocator.accounting import Accounting, short_counters
from dra_operator.allocator.candidates import Candidates, class_matches, tolerated
from dra_operator.allocator.constraints import MatchAttribute, attribute_text
from dra_operator.allocator.errors import AllocationError
from dra_operator.allocator.pools import DeviceEntry, Pool, SliceEntry
from dra_operator.allocator.specs import PreparedClaim, Spec


@dataclass(frozen=True, slots=True)
class MatchValues:
    """The values of one matchAttribute constraint's attribute among a request's devices that pass
    every check of the funnel (``within_capacity``): what the constraint has to choose from.

    ``values`` pairs each value (as text) with how many such devices have it, most first;
    ``missing`` counts those without the attribute (the constraint never takes them).
    """

    constraint: int  # index in the claim's constraints
    attribute: str
    values: tuple[tuple[str, int], ...]
    missing: int = 0


@dataclass(frozen=True, slots=True)
class RequestFunnel:
    """How many of a node's devices survive each check, in order, for one (sub)request.

    Each count is a subset of the previous one: ``devices`` (in complete, valid pools, reachable from
    the node) -> ``class_matched`` -> ``selectors_kept`` (request selectors) -> ``free`` (not
    allocated to another claim) -> ``untainted`` -> ``within_counters`` -> ``within_capacity``.
    ``wanted`` is the count asked for (for All: the devices that qualify).
    """

    claim: str
    request: str
    device_class: str
    mode: str
    wanted: int
    devices: int
    class_matched: int
    selectors_kept: int
    free: int
    untainted: int
    within_counters: int
    within_capacity: int
    binding_excluded: int = 0  # devices with binding conditions while the feature is off
    # Devices of slices with skipNodeOperations that this node cannot take (DRAOptionalNodeOperations
    # off, or the node does not declare the feature).
    node_operations_excluded: int = 0
    # Devices that consume counters while DRAPartitionableDevices is off: they fail at
    # ``within_counters`` whatever the counters hold, because the gate makes the allocator skip them.
    counters_excluded: int = 0
    unavailable_pools: tuple[str, ...] = ()  # "driver/pool (reason)" for incomplete or invalid pools
    match_values: tuple[MatchValues, ...] = ()  # per matchAttribute constraint covering the request
    # The counters that turned devices away at ``within_counters``: ("<pool> <counter set>/<counter>",
    # devices short of it), most first.
    short_counters: tuple[tuple[str, int], ...] = ()


def request_funnel(
    *,
    spec: Spec,
    claim: PreparedClaim,
    pools: tuple[Pool, ...],
    candidates: Candidates,
    accounting: Accounting,
) -> RequestFunnel:
    """Count the node's devices (``pools``) through the checks for ``spec`` of ``claim``."""
    funnel = _Funnel(spec, claim=claim, candidates=candidates, accounting=accounting)
    unavailable: list[str] = []
    for pool in pools:
        if pool.unusable:
            unavailable.append(f"{pool.text} ({'incomplete' if pool.incomplete else pool.invalid_reason})")
            continue
        available = accounting.usage.available_counters(pool)
        for se in pool.slices:
            for i in range(len(se.entries)):
                if se.node_ok is not None and not se.node_ok[i]:
                    continue
                funnel.device(pool=pool, available=available, se=se, index=i)
    return funnel.result(unavailable)


def _most_first(counts: dict[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


class _Funnel:
    """The counts for one spec, device by device."""

    def __init__(
        self, spec: Spec, *, claim: PreparedClaim, candidates: Candidates, accounting: Accounting
    ) -> None:
        self.spec = spec
        self.claim = claim
        self.candidates = candidates
        self.accounting = accounting
        self.counts = [0] * 7
        self.matching = [
            k for k in claim.constraints if isinstance(k, MatchAttribute) and k.covers(spec.parent, spec.full)
        ]
        self.seen: dict[int, dict[str, int]] = {k.index: {} for k in self.matching}
        self.missing: dict[int, int] = dict.fromkeys(self.seen, 0)
        self.binding_excluded = 0
        self.node_operations_excluded = 0
        self.counters_excluded = 0
        self.short_counters: dict[str, int] = {}

    def device(
        self, *, pool: Pool, available: Mapping[tuple[str, str], Quantity], se: SliceEntry, index: int
    ) -> None:
        """Count one device through the checks, as far as it gets."""
        spec, counts, accounting = self.spec, self.counts, self.accounting
        gates = self.candidates.gates
        entry = se.entries[index]
        device = entry.device
        counts[0] += 1
        if device.binding_conditions and not gates.device_binding_and_status:
            self.binding_excluded += 1
            return
        if se.slice.skip_node_operations and not self.candidates.node_operations:
            self.node_operations_excluded += 1
            return
        if not class_matches(spec.device_class, entry):
            return
        counts[1] += 1
        if not self.candidates.is_selectable(spec, se, index):
            return
        counts[2] += 1
        cc = gates.consumable_capacity
        multi = cc and device.allow_multiple_allocations
        if not spec.admin and entry.id in accounting.allocated.devices:
            return
        counts[3] += 1
        if gates.device_taints and device.taints and not tolerated(device.taints, spec.tolerations):
            return
        counts[4] += 1
        if device.consumes_counters:
            if not gates.partitionable_devices:
                self.counters_excluded += 1
                return
            if not (multi and entry.id in accounting.usage.in_use):
                short = short_counters(available, entry)
                for set_name, counter in short:
                    key = f"{pool.text} {set_name}/{counter}"
                    self.short_counters[key] = self.short_counters.get(key, 0) + 1
                if short:
                    return
        counts[5] += 1
        if cc and not accounting.capacity_fits(spec, entry):
            return
        counts[6] += 1
        self._values(entry)

    def _values(self, entry: DeviceEntry) -> None:
        for k in self.matching:
            try:
                value = self.spec.lookup(entry, k.attribute)
            except AllocationError:
                value = None  # an explanation, not a placement: count it as missing
            text = attribute_text(value, lists=k.lists)
            if text is None:
                self.missing[k.index] += 1
            else:
                self.seen[k.index][text] = self.seen[k.index].get(text, 0) + 1

    def result(self, unavailable: list[str]) -> RequestFunnel:
        spec, counts = self.spec, self.counts
        return RequestFunnel(
            claim=self.claim.ref,
            request=spec.full,
            device_class=spec.device_class.name,
            mode=spec.mode,
            wanted=spec.num_devices,
            devices=counts[0],
            class_matched=counts[1],
            selectors_kept=counts[2],
            free=counts[3],
            untainted=counts[4],
            within_counters=counts[5],
            within_capacity=counts[6],
            binding_excluded=self.binding_excluded,
            node_operations_excluded=self.node_operations_excluded,
            counters_excluded=self.counters_excluded,
            unavailable_pools=tuple(unavailable),
            short_counters=_most_first(self.short_counters),
            match_values=tuple(
                MatchValues(
                    constraint=k.index,
                    attribute=k.attribute,
                    values=_most_first(self.seen[k.index]),
                    missing=self.missing[k.index],
                )
                for k in self.matching
            ),
        )
