"""Shares of a device (consumable capacity, ``allowMultipleAllocations``) booked beyond its capacity.

Each allocator checks a new share against the shares it sees; two allocators (kube-scheduler and
this operator) that place shares on one device at the same moment each see room for their own, and
together may pass what the device has. The model's holdings tell afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping

from dra_api.model import AllocationResult
from dra_api.quantity import Quantity
from dra_operator.model.cluster import ClaimKey, ClusterModel, DeviceID

_ZERO = Quantity.parse(0)
_NO_ALLOCATION = AllocationResult()


class ShareLedger:
    """Measures the shares the model holds on each device against the device's capacity."""

    def __init__(self, model: ClusterModel) -> None:
        self.model = model
        # The capacities of the devices that take shares, by device, as of the model generation
        # ``_generation`` (slices change far less often than this is asked).
        self._capacities: dict[DeviceID, Mapping[str, Quantity]] = {}
        self._generation = -1

    def overbooked(self) -> dict[DeviceID, frozenset[ClaimKey]]:
        """Devices whose shares, held by two claims or more, together consume more of a capacity
        than the device has, with the claims holding those shares."""
        holding = self.model.holding_allocations()
        out: dict[DeviceID, frozenset[ClaimKey]] = {}
        # Only devices that take shares can hold shares: none to look at when no GPU is published so.
        for device, capacity in self._shared_devices().items():
            holders = self.model.holders(device)
            if len(holders) < 2:
                continue
            totals: dict[str, Quantity] = {}
            sharing: set[ClaimKey] = set()
            for key in holders:
                for result in holding.get(key, _NO_ALLOCATION).devices:
                    if result.device_id != device or result.share_id is None or result.admin_access:
                        continue
                    sharing.add(key)
                    for name, amount in result.consumed_capacity.items():
                        totals[name] = totals.get(name, _ZERO) + amount
            if len(sharing) < 2:
                continue  # one claim's own shares: one allocator placed them together
            if any(name in capacity and total > capacity[name] for name, total in totals.items()):
                out[device] = frozenset(sharing)
        return out

    def _shared_devices(self) -> Mapping[DeviceID, Mapping[str, Quantity]]:
        if self._generation != self.model.generation:
            self._capacities = {
                (s.driver, s.pool.name, d.name): {name: c.value for name, c in d.capacity.items()}
                for s in self.model.slices.values()
                for d in s.devices
                if d.allow_multiple_allocations
            }
            self._generation = self.model.generation
        return self._capacities
