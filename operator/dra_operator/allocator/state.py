"""Devices already in use by other claims: the allocator's ``AllocatedState``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_api.model import AllocationResult, ResourceClaim
from dra_api.quantity import Quantity

# (driver, pool, device); strings are interned by the model so hashing and comparing is cheap.
DeviceID = tuple[str, str, str]
# (driver, pool, device, shareID)
SharedDeviceID = tuple[str, str, str, str]


def device_id_text(device_id: DeviceID) -> str:
    return "/".join(device_id)


def parse_device_id(text: str) -> DeviceID:
    """``driver/pool/device``; the pool name may itself contain slashes."""
    driver, _, rest = text.partition("/")
    pool, _, device = rest.rpartition("/")
    if not driver or not pool or not device:
        raise ValueError(f"invalid device ID {text!r}: expected driver/pool/device")
    return (driver, pool, device)


@dataclass(slots=True)
class AllocatedState:
    """What other claims hold.

    ``devices``: exclusively allocated devices. ``shared``: allocations of multi-allocatable devices
    (consumable capacity), by share ID. ``capacity``: capacity already consumed per device.

    Adding and removing allocations counts holders: a device two allocations hold (two allocators
    racing, or a holder the caller has not yet learnt is gone) stays in use until both are removed.
    A set would free it with the first removal, and the device would be handed out while held.
    """

    devices: set[DeviceID] = field(default_factory=set)
    shared: set[SharedDeviceID] = field(default_factory=set)
    capacity: dict[DeviceID, dict[str, Quantity]] = field(default_factory=dict)
    # Holders beyond one, per device or share: entries put straight into the sets count as one.
    _extra: dict[DeviceID | SharedDeviceID, int] = field(default_factory=dict, repr=False, compare=False)

    def in_use_ids(self) -> set[DeviceID]:
        """Every device some claim holds, exclusively or shared (upstream ``IsDeviceAllocated``)."""
        return self.devices | self.capacity.keys() | {(d, p, n) for d, p, n, _ in self.shared}

    @classmethod
    def from_claims(cls, claims: Iterable[ResourceClaim]) -> AllocatedState:
        """Collect the state from allocated claims, as the scheduler does (admin-access results
        do not block a device)."""
        state = cls()
        for claim in claims:
            state.add_claim(claim)
        return state

    def add_claim(self, claim: ResourceClaim) -> None:
        if claim.status.allocation is not None:
            self.add_allocation(claim.status.allocation)

    def remove_claim(self, claim: ResourceClaim) -> None:
        if claim.status.allocation is not None:
            self.remove_allocation(claim.status.allocation)

    def add_allocation(self, allocation: AllocationResult) -> None:
        """Record an allocation (admin-access results do not block a device)."""
        for result in allocation.devices:
            if result.admin_access:
                continue
            device_id = result.device_id
            if result.share_id is None:
                self._hold(self.devices, device_id)
                continue
            self._hold(self.shared, (*device_id, result.share_id))
            if result.consumed_capacity:
                self._add_capacity(device_id, result.consumed_capacity, sign=1)

    def remove_allocation(self, allocation: AllocationResult) -> None:
        for result in allocation.devices:
            if result.admin_access:
                continue
            device_id = result.device_id
            if result.share_id is None:
                self._let_go(self.devices, device_id)
                continue
            self._let_go(self.shared, (*device_id, result.share_id))
            if result.consumed_capacity:
                self._add_capacity(device_id, result.consumed_capacity, sign=-1)

    def _hold(self, held: set[Any], key: Any) -> None:
        if key in held:
            self._extra[key] = self._extra.get(key, 0) + 1
        else:
            held.add(key)

    def _let_go(self, held: set[Any], key: Any) -> None:
        extra = self._extra.get(key, 0)
        if extra > 1:
            self._extra[key] = extra - 1
        elif extra == 1:
            del self._extra[key]
        else:
            held.discard(key)

    def _add_capacity(self, device_id: DeviceID, amounts: Mapping[str, Quantity], *, sign: int) -> None:
        current = self.capacity.setdefault(device_id, {})
        for name, amount in amounts.items():
            before = current.get(name)
            if sign > 0:
                current[name] = amount if before is None else before + amount
            elif before is not None:
                after = before - amount
                if after.sign() <= 0:
                    del current[name]
                else:
                    current[name] = after
        if not current:
            del self.capacity[device_id]

    def copy(self) -> AllocatedState:
        return AllocatedState(
            devices=set(self.devices),
            shared=set(self.shared),
            capacity={k: dict(v) for k, v in self.capacity.items()},
            _extra=dict(self._extra),
        )
