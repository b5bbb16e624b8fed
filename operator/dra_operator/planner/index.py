"""Free devices per node, per CEL projection, maintained incrementally.

For each :class:`~dra_operator.planner.demand.DemandKey` in use, :class:`FreeDeviceIndex` knows which
devices match it (class selectors, then request selectors, each evaluated once per device) and
keeps, per node, the number of matching devices and of free ones; nodes are also kept in buckets
by free count so that candidates come out in policy order without scanning every node. Devices
of slices without a ``nodeName`` (allNodes, node selectors, per-device selection) are "shared":
counted once and assumed reachable from every node, which keeps every bound an upper bound.

Node-local devices are evaluated lazily, node by node: first-fit visits nodes in order and only
evaluates those it reaches, so the first claim of a new shape does not pay for the whole cluster;
bin-pack, spread and explanations complete the key first (:meth:`FreeDeviceIndex.complete`).

A device whose selector evaluation fails (a CEL runtime error) counts as matching: the allocator
then evaluates it on that node and reports the error with upstream's wording.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain

from dra_api.model import AllocationResult, DeviceClass, Node, ObjectMeta, ResourceSlice
from dra_operator.allocator import (
    AllocationError,
    DeviceEntry,
    DeviceID,
    FeatureGates,
    SliceIndex,
    class_matches,
)
from dra_operator.planner.demand import DemandKey

_KEY_LIMIT = 128  # distinct projections kept; the least recently used one is dropped first


class KeyCounts:
    """Matching and free devices of one key, per node rank and for shared devices."""

    __slots__ = (
        "buckets",
        "class_",
        "free",
        "key",
        "local",
        "pending",
        "shared",
        "shared_free",
        "shared_total",
        "total",
    )

    def __init__(self, *, key: DemandKey, nodes: int, class_: DeviceClass) -> None:
        self.key = key
        self.class_ = class_
        # node ranks whose devices were not evaluated yet (sorted); their counts read 0 until then
        self.pending: list[int] = []
        self.local: dict[DeviceID, int] = {}  # matching node-local device -> node rank
        self.shared: set[DeviceID] = set()
        self.total = [0] * nodes
        self.free = [0] * nodes
        self.shared_total = 0
        self.shared_free = 0
        # free count (>= 1) -> node ranks with that many free matching devices, sorted
        self.buckets: dict[int, list[int]] = {}

    def set_free(self, rank: int, value: int) -> None:
        old = self.free[rank]
        if old == value:
            return
        self.free[rank] = value
        if old > 0:
            bucket = self.buckets[old]
            del bucket[bisect.bisect_left(bucket, rank)]
            if not bucket:
                del self.buckets[old]
        if value > 0:
            bisect.insort(self.buckets.setdefault(value, []), rank)

    def ranks_with_at_least(self, count: int, *, descending: bool = False) -> Iterator[int]:
        """Node ranks with at least ``count`` free matching devices: by free count ascending
        (or descending), then rank; see :meth:`ranks_in_order` for rank order."""
        levels = sorted((c for c in self.buckets if c >= count), reverse=descending)
        return chain.from_iterable(self.buckets[c] for c in levels)

    def ranks_in_order(self, count: int, *, with_pending: bool = False) -> Iterator[int]:
        """Node ranks with at least ``count`` free matching devices (and, with ``with_pending``,
        the ranks not evaluated yet), in rank order. Iterates over copies: evaluating a node on
        the way changes the buckets."""
        levels = [list(self.buckets[c]) for c in self.buckets if c >= count]
        if with_pending and self.pending:
            levels.append(list(self.pending))
        if len(levels) == 1:
            return iter(levels[0])
        return heapq.merge(*levels)

    # The cluster-wide figures are exact only once the key is complete.
    @property
    def cluster_total(self) -> int:
        return sum(self.total) + self.shared_total

    @property
    def cluster_free(self) -> int:
        return sum(self.free) + self.shared_free


class FreeDeviceIndex:
    """Per node and per key, how many devices match and how many are free."""

    def __init__(
        self,
        *,
        slices: SliceIndex,
        nodes: Iterable[Node],
        classes: Mapping[str, DeviceClass],
        gates: FeatureGates,
        in_use: Iterable[DeviceID] = (),
    ) -> None:
        self.slices = slices
        self.gates = gates
        self.classes = classes
        self.nodes: list[Node] = sorted(nodes, key=lambda n: n.name)
        self.rank: dict[str, int] = {n.name: i for i, n in enumerate(self.nodes)}
        # Devices held exclusively, and holders beyond the first of each: a device two allocations
        # hold stays taken until both are released (see AllocatedState).
        self.in_use: set[DeviceID] = set()
        self._extra_holders: dict[DeviceID, int] = {}
        for did in in_use:
            self._hold(did)
        self._keys: dict[DemandKey, KeyCounts] = {}
        # node-local slices per node rank (slices of nodes outside the cluster are left out)
        self._node_slices: list[list[ResourceSlice]] = [
            list(slices.on_node.get(n.name, ())) for n in self.nodes
        ]

    # ---- allocations ---------------------------------------------------------------------------

    def note_allocated(self, allocation: AllocationResult) -> None:
        for did in exclusive_devices(allocation):
            if self._hold(did):
                self._adjust(did, -1)

    def note_released(self, allocation: AllocationResult) -> None:
        for did in exclusive_devices(allocation):
            if self._let_go(did):
                self._adjust(did, +1)

    def _hold(self, did: DeviceID) -> bool:
        """Count one more holder of ``did``; True when it was free."""
        if did in self.in_use:
            self._extra_holders[did] = self._extra_holders.get(did, 0) + 1
            return False
        self.in_use.add(did)
        return True

    def _let_go(self, did: DeviceID) -> bool:
        """Count one holder less of ``did``; True when it is free now."""
        extra = self._extra_holders.get(did, 0)
        if extra:
            if extra == 1:
                del self._extra_holders[did]
            else:
                self._extra_holders[did] = extra - 1
            return False
        if did not in self.in_use:
            return False
        self.in_use.discard(did)
        return True

    def holder_counts(self) -> dict[DeviceID, int]:
        """How many allocations hold each device in use (for consistency checks)."""
        return {did: 1 + self._extra_holders.get(did, 0) for did in self.in_use}

    def _adjust(self, did: DeviceID, delta: int) -> None:
        for counts in self._keys.values():
            rank = counts.local.get(did)
            if rank is not None:
                counts.set_free(rank, counts.free[rank] + delta)
            elif did in counts.shared:
                counts.shared_free += delta

    def count_problems(self) -> list[str]:
        """Free counts that do not match the index's own devices and in-use set (empty: none)."""
        problems = []
        for key, counts in self._keys.items():
            pending = set(counts.pending)
            evaluated = [rank for rank in range(len(self.nodes)) if rank not in pending]
            free = dict.fromkeys(evaluated, 0)
            for did, rank in counts.local.items():
                if did not in self.in_use:
                    free[rank] += 1
            for rank in evaluated:
                if counts.free[rank] != free[rank]:
                    problems.append(
                        f"index key {key.class_name}: node {self.nodes[rank].name} counted "
                        f"{counts.free[rank]} free, its devices say {free[rank]}"
                    )
            shared_free = sum(1 for did in counts.shared if did not in self.in_use)
            if counts.shared_free != shared_free:
                problems.append(
                    f"index key {key.class_name}: {counts.shared_free} shared devices counted free, "
                    f"its devices say {shared_free}"
                )
        return problems

    # ---- keys ----------------------------------------------------------------------------------

    def counts(self, key: DemandKey, *, complete: bool = False) -> KeyCounts:
        """The counts of ``key``, built on first use: shared devices at once, node-local ones per
        node on demand (:meth:`ensure`), or all of them with ``complete``."""
        found = self._keys.pop(key, None)
        if found is None:
            found = self._build(key)
            if len(self._keys) >= _KEY_LIMIT:
                del self._keys[next(iter(self._keys))]
        self._keys[key] = found  # most recently used last
        if complete:
            self.complete(found)
        return found

    def complete(self, counts: KeyCounts) -> None:
        """Evaluate every node of ``counts`` not evaluated yet."""
        for rank in list(counts.pending):
            self.ensure(counts, rank)

    def ensure(self, counts: KeyCounts, rank: int) -> bool:
        """Evaluate the devices of node ``rank`` for ``counts`` if not done yet; True if it was."""
        pending = counts.pending
        at = bisect.bisect_left(pending, rank)
        if at == len(pending) or pending[at] != rank:
            return False
        binding = self.gates.device_binding_and_status
        matched: dict[DeviceID, None] = {}
        for s in self._node_slices[rank]:
            for entry in self.slices.entries(s):
                did = entry.id
                if did in counts.local or did in matched:
                    continue  # another generation of the same device: count it once
                if entry.device.binding_conditions and not binding:
                    continue
                # CEL may run out of the placement's budget here: nothing is changed until the
                # node is evaluated whole, so an interrupted evaluation is simply done again.
                if not _matches(key=counts.key, device_class=counts.class_, entry=entry):
                    continue
                matched[did] = None
        del pending[at]
        for did in matched:
            counts.local[did] = rank
        counts.total[rank] = len(matched)
        counts.set_free(rank, sum(1 for did in matched if did not in self.in_use))
        return True

    def _build(self, key: DemandKey) -> KeyCounts:
        device_class = self.classes.get(key.class_name)
        if device_class is None or device_class.selectors != key.class_selectors:
            device_class = DeviceClass(
                metadata=ObjectMeta(name=key.class_name), selectors=key.class_selectors
            )
        counts = KeyCounts(key=key, nodes=len(self.nodes), class_=device_class)
        binding = self.gates.device_binding_and_status
        for s in self.slices.shared:
            for entry in self.slices.entries(s):
                did = entry.id
                if did in counts.shared:
                    continue
                if entry.device.binding_conditions and not binding:
                    continue
                if not _matches(key=key, device_class=device_class, entry=entry):
                    continue
                counts.shared.add(did)
                counts.shared_total += 1
                counts.shared_free += did not in self.in_use
        counts.pending = [rank for rank, slices in enumerate(self._node_slices) if slices]
        return counts


def _matches(*, key: DemandKey, device_class: DeviceClass, entry: DeviceEntry) -> bool:
    try:
        if not class_matches(device_class, entry):
            return False
        if not key.selectors:
            return True
        # Class and request selectors together, cached on the device like a class's selectors: a
        # slice index built with ``previous=`` hands the results on to unchanged devices.
        combined = DeviceClass(metadata=device_class.metadata, selectors=key.class_selectors + key.selectors)
        return class_matches(combined, entry)
    except AllocationError:
        return True  # let the allocator meet (and report) the error on this device's node


def key_matches(*, key: DemandKey, entry: DeviceEntry) -> bool:
    """Whether a request of ``key`` could use the device: its class's and its own selectors (a CEL
    runtime error counts as a match, as in the index). Results are cached on the entry."""
    device_class = DeviceClass(metadata=ObjectMeta(name=key.class_name), selectors=key.class_selectors)
    return _matches(key=key, device_class=device_class, entry=entry)


def exclusive_devices(allocation: AllocationResult) -> Iterator[DeviceID]:
    """The devices ``allocation`` takes for itself (not admin access, not a share of a device)."""
    for result in allocation.devices:
        if result.admin_access or result.share_id is not None:
            continue
        yield result.device_id
