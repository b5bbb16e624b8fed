"""Resource pools as one node sees them: gathering, completeness, validation and order.

:class:`SliceIndex` is built once for a set of ResourceSlices and can serve many allocators and
many nodes: it splits slices into per-node and shared ones (as the incubating allocator does),
keeps one :class:`DeviceEntry` per device (with the CEL input built once, on first use), and
caches the gathered pools per node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from dra_api.attributes import UnsupportedAttribute
from dra_api.model import Device, DeviceSelector, Node, ResourceSlice, empty_map, shared_map
from dra_api.quantity import Quantity
from dra_operator.allocator.state import DeviceID
from dra_operator.cel import DeviceInput

PoolID = tuple[str, str]  # (driver, pool name)
_POOL_CACHE_LIMIT = 50_000


SELECTOR_RESULTS_PER_DEVICE = 16
"""Selector sets whose result a device keeps (its classes' and the requests' seen most lately)."""


class DeviceEntry:
    """One device of one slice, with what the allocator derives from it once."""

    __slots__ = ("_input", "class_matches", "device", "id", "slice", "unsupported_attribute")

    def __init__(self, *, slice_: ResourceSlice, device: Device) -> None:
        self.slice = slice_
        self.device = device
        self.id: DeviceID = (slice_.driver, slice_.pool.name, device.name)
        self._input: DeviceInput | None = None
        # Class selectors (by value) -> whether this device matches them all; a pure function of the
        # device and the selectors, so it stays valid for as long as this entry exists. Written
        # through :meth:`remember`, which bounds it.
        self.class_matches: dict[tuple[DeviceSelector, ...], bool] | None = None
        # Upstream fails every CEL evaluation on a device with an unusable attribute value.
        self.unsupported_attribute: str | None = next(
            (name for name, value in device.attributes.items() if isinstance(value, UnsupportedAttribute)),
            None,
        )

    def remember(self, selectors: tuple[DeviceSelector, ...], found: bool) -> None:
        """Cache whether the device matches ``selectors``, keeping at most
        :data:`SELECTOR_RESULTS_PER_DEVICE` results: the selectors come from claims, and every
        distinct set a tenant sends would otherwise stay on every device it was evaluated on."""
        cache = self.class_matches
        if cache is None:
            cache = self.class_matches = {}
        elif len(cache) >= SELECTOR_RESULTS_PER_DEVICE and selectors not in cache:
            # The oldest goes (evaluating it again is memoized per projection). Worker threads share
            # the entry: one of them may have changed the dict meanwhile, and then this one skips.
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                del cache[next(iter(cache))]
        cache[selectors] = found

    @property
    def cel_input(self) -> DeviceInput:
        if self._input is None:
            device = self.device
            self._input = DeviceInput(
                driver=self.slice.driver,
                attributes=device.attributes,
                capacity=shared_map({k: c.value for k, c in device.capacity.items()}),
                allow_multiple_allocations=device.allow_multiple_allocations,
            )
        return self._input

    def __repr__(self) -> str:
        return f"DeviceEntry({'/'.join(self.id)})"


@dataclass(frozen=True, slots=True)
class SliceEntry:
    """A slice that targets the node; ``node_ok`` is set for per-device node selection."""

    slice: ResourceSlice
    entries: tuple[DeviceEntry, ...]
    node_ok: tuple[bool, ...] | None = None


@dataclass(frozen=True, slots=True)
class Pool:
    id: PoolID
    generation: int
    slices: tuple[SliceEntry, ...] = ()
    other_slices: tuple[ResourceSlice, ...] = ()  # same pool, not targeting the node (counters only)
    counter_sets: Mapping[str, Mapping[str, Quantity]] = field(default_factory=empty_map)
    incomplete: bool = False
    invalid_reason: str | None = None
    has_binding_conditions: bool = False

    @property
    def invalid(self) -> bool:
        return self.invalid_reason is not None

    @property
    def unusable(self) -> bool:
        return self.incomplete or self.invalid_reason is not None

    @property
    def text(self) -> str:
        return f"{self.id[0]}/{self.id[1]}"

    def all_slices(self) -> Iterable[ResourceSlice]:
        for entry in self.slices:
            yield entry.slice
        yield from self.other_slices


def device_matches_node(device: Device, node: Node) -> bool:
    if device.node_name:
        return device.node_name == node.name
    if device.all_nodes:
        return True
    if device.node_selector is not None:
        return device.node_selector.matches(node)
    return False


def uses_compatibility_groups(slice_: ResourceSlice) -> bool:
    """Whether a device of the slice declares compatibility groups on a counter it consumes."""
    return any(c.compatibility_groups for d in slice_.devices for c in d.consumes_counters)


def slice_matches_node(slice_: ResourceSlice, node: Node) -> bool:
    if slice_.node_name:
        return slice_.node_name == node.name
    if slice_.all_nodes:
        return True
    if slice_.node_selector is not None:
        return slice_.node_selector.matches(node)
    if slice_.per_device_node_selection:
        return any(device_matches_node(d, node) for d in slice_.devices)
    return False  # a node selection field this code does not know: skip the slice


class SliceIndex:
    """ResourceSlices indexed by node and by pool; pools gathered per node are cached."""

    def __init__(self, slices: Iterable[ResourceSlice], *, previous: SliceIndex | None = None) -> None:
        """Index ``slices``. With ``previous`` (the index of an earlier set of slices), devices that
        did not change keep their CEL input and cached class-selector results, so a slice update
        does not re-run CEL over the whole cluster."""
        self.slices: tuple[ResourceSlice, ...] = tuple(slices)
        self.on_node: dict[str, list[ResourceSlice]] = {}
        self.shared: list[ResourceSlice] = []
        self.by_pool: dict[PoolID, list[ResourceSlice]] = {}
        self._entries: dict[int, tuple[DeviceEntry, ...]] = {}
        self._pools: dict[tuple[object, ...], tuple[Pool, ...]] = {}
        # Slices a DRADeviceCompatibilityGroups-off allocator ignores (by id).
        self._grouped: set[int] = set()
        for s in self.slices:
            if uses_compatibility_groups(s):
                self._grouped.add(id(s))
            if s.node_name:
                self.on_node.setdefault(s.node_name, []).append(s)
            else:
                self.shared.append(s)
            self.by_pool.setdefault((s.driver, s.pool.name), []).append(s)
            self._entries[id(s)] = tuple(DeviceEntry(slice_=s, device=d) for d in s.devices)
        if previous is not None:
            self._inherit(previous)

    def _inherit(self, previous: SliceIndex) -> None:
        before = {entry.id: entry for entry in previous.all_entries() if entry._input or entry.class_matches}
        if not before:
            return
        for entry in self.all_entries():
            old = before.get(entry.id)
            if old is not None and (old.device is entry.device or old.device == entry.device):
                entry._input = old._input
                entry.class_matches = old.class_matches

    def entries(self, slice_: ResourceSlice) -> tuple[DeviceEntry, ...]:
        return self._entries[id(slice_)]

    def all_entries(self) -> Iterable[DeviceEntry]:
        for s in self.slices:
            yield from self._entries[id(s)]

    def pools_for(
        self, node: Node, *, partitionable: bool, compatibility_groups: bool = False
    ) -> tuple[Pool, ...]:
        """The node's pools in allocation order: by (driver, pool), binding-condition pools last.

        Without ``compatibility_groups`` (the DRADeviceCompatibilityGroups gate), a slice whose
        devices declare compatibility groups is ignored, as upstream does: its pool is incomplete,
        so none of the pool's devices can be allocated."""
        key = (node.cache_key(), partitionable, compatibility_groups)
        found = self._pools.get(key)
        if found is None:
            if len(self._pools) >= _POOL_CACHE_LIMIT:  # label churn must not grow it without bound
                self._pools.clear()
            found = self._pools[key] = self._gather(
                node, partitionable=partitionable, compatibility_groups=compatibility_groups
            )
        return found

    def _gather(self, node: Node, *, partitionable: bool, compatibility_groups: bool) -> tuple[Pool, ...]:
        seen: dict[PoolID, list[ResourceSlice]] = {}
        grouped: set[int] = set() if compatibility_groups else self._grouped
        for s in (*self.on_node.get(node.name, ()), *self.shared):
            if not partitionable and (s.per_device_node_selection or s.shared_counters):
                continue
            if grouped and id(s) in grouped:
                continue
            if not slice_matches_node(s, node):
                continue
            pool_id = (s.driver, s.pool.name)
            current = seen.get(pool_id)
            if current is None or s.pool.generation > current[0].pool.generation:
                seen[pool_id] = [s]
            elif s.pool.generation == current[0].pool.generation:
                current.append(s)
        pools: list[Pool] = []
        for pool_id, slices in seen.items():
            generation = slices[0].pool.generation
            if len(slices) == slices[0].pool.resource_slice_count:
                pools.append(self._build(node, pool_id, generation, slices, (), partitionable=partitionable))
                continue
            # Looks incomplete from this node: consult the whole cluster for this pool. Whatever the
            # gate: a counter slice it hides still counts towards the pool (upstream's
            # checkSlicesInPool does not filter either).
            same_generation = []
            obsolete = False
            for s in self.by_pool.get(pool_id, ()):
                if s.pool.generation > generation:
                    obsolete = True
                    break
                if s.pool.generation == generation and not (grouped and id(s) in grouped):
                    same_generation.append(s)
            if obsolete:
                continue
            if len(same_generation) != slices[0].pool.resource_slice_count:
                pools.append(Pool(id=pool_id, generation=generation, incomplete=True))
                continue
            targeting = {id(s) for s in slices}
            others = tuple(s for s in same_generation if id(s) not in targeting)
            pools.append(self._build(node, pool_id, generation, slices, others, partitionable=partitionable))
        pools.sort(key=lambda p: (p.has_binding_conditions, p.id))
        return tuple(pools)

    def _build(
        self,
        node: Node,
        pool_id: PoolID,
        generation: int,
        slices: list[ResourceSlice],
        others: tuple[ResourceSlice, ...],
        *,
        partitionable: bool,
    ) -> Pool:
        slices = sorted(slices, key=lambda s: s.name)
        invalid: str | None = None
        names: set[str] = set()
        counter_sets: dict[str, Mapping[str, Quantity]] = {}
        binding = False
        if not partitionable:
            # Without DRAPartitionableDevices, counters are neither read nor validated (upstream's
            # buildPool returns before it looks at them): a device that consumes counters is skipped
            # when allocating, so the counter sets the gate hides must not make the pool invalid.
            others = ()
        for s in (*slices, *others):
            for cs in s.shared_counters:
                if cs.name in counter_sets and invalid is None:
                    invalid = f"duplicate counter set name {cs.name!r}"
                counter_sets[cs.name] = cs.counters
        entries: list[SliceEntry] = []
        for s in slices:
            for d in s.devices:
                if d.name in names and invalid is None:
                    invalid = f"duplicate device name {d.name!r}"
                names.add(d.name)
                if d.binding_conditions:
                    binding = True
            node_ok = (
                tuple(device_matches_node(d, node) for d in s.devices)
                if s.per_device_node_selection
                else None
            )
            entries.append(SliceEntry(slice=s, entries=self._entries[id(s)], node_ok=node_ok))
        if invalid is None and partitionable:
            invalid = _check_counter_references((*slices, *others), counter_sets)
        return Pool(
            id=pool_id,
            generation=generation,
            slices=tuple(entries),
            other_slices=others,
            counter_sets=MappingProxyType(counter_sets),
            invalid_reason=invalid,
            has_binding_conditions=binding,
        )


def _check_counter_references(
    slices: Iterable[ResourceSlice], counter_sets: Mapping[str, Mapping[str, Quantity]]
) -> str | None:
    for s in slices:
        for d in s.devices:
            for consumption in d.consumes_counters:
                counters = counter_sets.get(consumption.counter_set)
                if counters is None:
                    return f"device {d.name!r} consumes unknown counter set {consumption.counter_set!r}"
                for name in consumption.counters:
                    if name not in counters:
                        return (
                            f"device {d.name!r} consumes unknown counter {name!r} "
                            f"of counter set {consumption.counter_set!r}"
                        )
    return None
