"""What devices use up of what they share: pools' counters and compatibility groups
(partitionable devices), and devices' consumable capacity.

:class:`PoolUsage` keeps, across runs, what other claims leave of each pool; :class:`Accounting`
adds one run's picks on top, and takes them off again when the search backs out of a branch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from dra_api.model import ResourceClaim
from dra_api.quantity import Quantity
from dra_operator.allocator import capacity as cap
from dra_operator.allocator.errors import AllocationError
from dra_operator.allocator.gates import FeatureGates
from dra_operator.allocator.pools import DeviceEntry, Pool, PoolID
from dra_operator.allocator.specs import Spec
from dra_operator.allocator.state import AllocatedState, DeviceID, device_id_text

_ZERO = Quantity.from_int(0)

Counters = dict[tuple[str, str], Quantity]  # (counter set, counter) -> amount
# DRADeviceCompatibilityGroups: what the devices placed on one counter set so far declare, as
# (all declared no groups, intersection of their groups); no entry = no device placed yet.
GroupState = tuple[bool, frozenset[str]]


def groups_admit(state: GroupState | None, groups: frozenset[str]) -> bool:
    """A device without groups shares a counter set only with other devices without groups."""
    if state is None:
        return True
    all_empty, common = state
    if not groups:
        return all_empty
    return not all_empty and not common.isdisjoint(groups)


def groups_join(state: GroupState | None, groups: frozenset[str]) -> GroupState:
    if state is None:
        return (not groups, groups)
    all_empty, common = state
    if all_empty or not groups:
        return state
    return (False, common & groups)


def counters_fit(available: Mapping[tuple[str, str], Quantity], entry: DeviceEntry) -> bool:
    return not short_counters(available, entry)


def short_counters(
    available: Mapping[tuple[str, str], Quantity], entry: DeviceEntry
) -> list[tuple[str, str]]:
    """The (counter set, counter) pairs the device needs more of than is left."""
    need: Counters = {}
    for consumption in entry.device.consumes_counters:
        for name, value in consumption.counters.items():
            key = (consumption.counter_set, name)
            need[key] = need[key] + value if key in need else value
    return [
        key for key, value in available.items() if (value - need[key] if key in need else value).sign() < 0
    ]


def _add_counters(consumed: Counters, entry: DeviceEntry, *, sign: int) -> None:
    for consumption in entry.device.consumes_counters:
        for name, value in consumption.counters.items():
            key = (consumption.counter_set, name)
            before = consumed.get(key, _ZERO)
            consumed[key] = before + value if sign > 0 else before - value


def _nothing() -> None:
    pass


class PoolUsage:
    """What other claims hold (``in_use``: every device some claim holds) and, per pool
    generation, what that leaves of the pool's counters and which compatibility groups it puts on
    them; an allocator's, kept across its runs until an allocation is noted or released."""

    __slots__ = ("_available", "_groups", "in_use")

    def __init__(self, in_use: set[DeviceID]) -> None:
        self.in_use = in_use
        self._available: dict[tuple[PoolID, int], Counters] = {}
        self._groups: dict[tuple[PoolID, int], dict[str, GroupState]] = {}

    def changed(self, in_use: set[DeviceID] | None = None) -> None:
        """Other claims hold other devices now (``in_use``, when it was replaced): forget the pools."""
        if in_use is not None:
            self.in_use = in_use
        self._available.clear()
        self._groups.clear()

    def available_counters(self, pool: Pool) -> Counters:
        """Counter values minus what allocated devices of the pool consume (may be negative)."""
        key = (pool.id, pool.generation)
        found = self._available.get(key)
        if found is None:
            found = {
                (set_name, name): value
                for set_name, counters in pool.counter_sets.items()
                for name, value in counters.items()
            }
            for s in pool.all_slices():
                for d in s.devices:
                    if d.consumes_counters and (s.driver, s.pool.name, d.name) in self.in_use:
                        for consumption in d.consumes_counters:
                            for name, value in consumption.counters.items():
                                k = (consumption.counter_set, name)
                                if k in found:
                                    found[k] = found[k] - value
            self._available[key] = found
        return found

    def group_baseline(self, pool: Pool) -> dict[str, GroupState]:
        """Per counter set, the compatibility groups of the pool's devices other claims hold
        (read from the slices, as their counters are)."""
        key = (pool.id, pool.generation)
        found = self._groups.get(key)
        if found is None:
            found = {}
            for s in pool.all_slices():
                for d in s.devices:
                    if d.consumes_counters and (s.driver, s.pool.name, d.name) in self.in_use:
                        for consumption in d.consumes_counters:
                            name = consumption.counter_set
                            found[name] = groups_join(
                                found.get(name), frozenset(consumption.compatibility_groups)
                            )
            self._groups[key] = found
        return found


class Accounting:
    """One run's picks on top of :class:`PoolUsage`: the counters and compatibility groups they
    take per pool, and the capacity they consume per multi-allocatable device."""

    __slots__ = (
        "_claims",
        "allocated",
        "allocating_capacity",
        "consumed_counters",
        "gates",
        "groups",
        "usage",
    )

    def __init__(
        self,
        *,
        usage: PoolUsage,
        allocated: AllocatedState,
        gates: FeatureGates,
        claims: Sequence[ResourceClaim],
    ) -> None:
        self.usage = usage
        self.allocated = allocated
        self.gates = gates
        self._claims = claims
        self.consumed_counters: dict[PoolID, Counters] = {}
        # DRADeviceCompatibilityGroups: per pool and counter set, the devices placed in this run.
        self.groups: dict[PoolID, dict[str, GroupState]] = {}
        # Capacity the run's picks consume, per multi-allocatable device.
        self.allocating_capacity: dict[DeviceID, dict[str, Quantity]] = {}

    # ---- consumable capacity ---------------------------------------------------------------------

    def capacity_fits(
        self, spec: Spec, entry: DeviceEntry, *, static: bool = False, in_flight: bool = True
    ) -> bool:
        """Whether the request fits the device's capacity: what is left of it (by other claims and,
        with ``in_flight``, by this search's own picks so far), or (``static``) all of it. A request
        the device's policy cannot represent, or a negative amount, is an error."""
        device = entry.device
        if not spec.capacity and (not device.capacity or not device.allow_multiple_allocations):
            # A dedicated device without capacity requests consumes all of its capacity: always fits.
            return True
        try:
            return cap.fits(
                device=device,
                driver=entry.id[0],
                requests=spec.capacity,
                consumed=None if static else self.allocated.capacity.get(entry.id),
                allocating=None if static or not in_flight else self.allocating_capacity.get(entry.id),
                fractional=self.gates.fractional_capacity_range,
            )
        except cap.CapacityError as exc:
            # Upstream names the device by its name in the "all" pre-scan, by its ID elsewhere.
            device_text = device.name if static else device_id_text(entry.id)
            raise AllocationError(
                f"claim {self._claims[spec.claim_index].ref}, request {spec.full}: "
                f"checking capacity for device {device_text}: {exc}"
            ) from exc

    def consume_capacity(self, spec: Spec, entry: DeviceEntry) -> dict[str, Quantity]:
        """What the request consumes of a multi-allocatable device that it fits, now in flight."""
        consumed = cap.consumption(
            device=entry.device,
            driver=entry.id[0],
            requests=spec.capacity,
            fractional=self.gates.fractional_capacity_range,
        )
        inflight = self.allocating_capacity.setdefault(entry.id, {})
        for name, value in consumed.items():
            inflight[name] = inflight[name] + value if name in inflight else value
        return consumed

    def return_capacity(self, did: DeviceID, consumed: dict[str, Quantity]) -> None:
        """Undo :meth:`consume_capacity`."""
        inflight = self.allocating_capacity[did]
        for name, value in consumed.items():
            inflight[name] = inflight[name] - value
        if all(v.is_zero() for v in inflight.values()):
            del self.allocating_capacity[did]

    # ---- counters and compatibility groups -----------------------------------------------------

    def take_counters(self, pool: Pool, entry: DeviceEntry, multi: bool) -> Callable[[], None] | None:
        """Place a device that consumes counters: on its counter sets' compatibility groups (with
        that gate on), then on the counters; how to take it off again, or None (and no change)
        when it does not fit. ``multi``: the device is multi-allocatable."""
        # Another share of a multi-allocatable device in use: its counters (and compatibility
        # groups) are accounted for already.
        if multi and (entry.id in self.usage.in_use or entry.id in self.allocating_capacity):
            return _nothing
        groups: Callable[[], None] | None = None
        if self.gates.compatibility_groups:
            groups = self._take_groups(pool, entry)
            if groups is None:
                return None
        available = self.usage.available_counters(pool)
        consumed = self.consumed_counters.setdefault(pool.id, {})
        _add_counters(consumed, entry, sign=1)
        for key, value in available.items():
            used = consumed.get(key)
            if (value if used is None else value - used).sign() < 0:
                _add_counters(consumed, entry, sign=-1)
                if groups is not None:
                    groups()
                return None

        def release() -> None:
            _add_counters(consumed, entry, sign=-1)
            if groups is not None:
                groups()

        return release

    def _take_groups(self, pool: Pool, entry: DeviceEntry) -> Callable[[], None] | None:
        """DRADeviceCompatibilityGroups: place the device on each counter set it consumes if its
        groups intersect those of every device already there (other claims' and this run's);
        returns how to take it off again, or None (and no change) if it does not fit."""
        running = self.groups.get(pool.id)
        if running is None:
            running = self.groups[pool.id] = {}
        baseline = self.usage.group_baseline(pool)
        saved: list[tuple[str, GroupState | None]] = []

        def restore() -> None:
            for name, before in reversed(saved):
                if before is None:
                    del running[name]
                else:
                    running[name] = before

        for consumption in entry.device.consumes_counters:
            name = consumption.counter_set
            before = running.get(name)
            state = before if before is not None else baseline.get(name)
            groups = frozenset(consumption.compatibility_groups)
            if not groups_admit(state, groups):
                restore()
                return None
            saved.append((name, before))
            running[name] = groups_join(state, groups)
        return restore
