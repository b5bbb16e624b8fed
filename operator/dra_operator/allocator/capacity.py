"""Consumable capacity: how much of a device's capacity a request consumes, and whether it fits."""

from __future__ import annotations

from collections.abc import Mapping

from dra_api.model import CapacityRequestPolicy, Device, DeviceCapacity
from dra_api.quantity import Quantity, is_on_step, round_up_to_step


def _lookup(requests: Mapping[str, Quantity], name: str, driver: str) -> Quantity | None:
    found = requests.get(name)
    if found is None and "/" not in name:
        found = requests.get(f"{driver}/{name}")
    return found


def _has_capacity(device: Device, name: str, driver: str) -> bool:
    if name in device.capacity:
        return True
    domain, sep, ident = name.partition("/")
    return bool(sep) and domain == driver and ident in device.capacity


def consumed_amount(requested: Quantity | None, capacity: DeviceCapacity) -> Quantity:
    """The amount consumed: the request rounded up to the policy, or the default, or everything."""
    policy = capacity.request_policy
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return capacity.value
    if policy is None:
        return requested
    if policy.valid_range is not None:
        return round_up_to_step(value=requested, minimum=policy.valid_range.min, step=policy.valid_range.step)
    if policy.valid_values:
        for valid in policy.valid_values:
            if requested <= valid:
                return valid
    return requested


def violates_policy(amount: Quantity, policy: CapacityRequestPolicy | None) -> bool:
    if policy is None:
        return False
    if policy.default is not None and amount == policy.default:
        return False
    rng = policy.valid_range
    if rng is not None:
        if rng.max is not None and amount > rng.max:
            return True
        return rng.step is not None and not is_on_step(value=amount, minimum=rng.min, step=rng.step)
    if policy.valid_values:
        return amount not in policy.valid_values
    return False


def fits(
    *,
    device: Device,
    driver: str,
    requests: Mapping[str, Quantity] | None,
    consumed: Mapping[str, Quantity] | None,
    allocating: Mapping[str, Quantity] | None,
) -> bool:
    """Upstream ``CmpRequestOverCapacity``: every named capacity exists, no policy is violated and
    already consumed + in flight + this request stays within each capacity's value."""
    if requests:
        for name in requests:
            if not _has_capacity(device, name, driver):
                return False
    for name, capacity in device.capacity.items():
        amount = consumed_amount(None if not requests else _lookup(requests, name, driver), capacity)
        if violates_policy(amount, capacity.request_policy):
            return False
        total = amount
        if consumed and name in consumed:
            total = total + consumed[name]
        if allocating and name in allocating:
            total = total + allocating[name]
        if total > capacity.value:
            return False
    return True


def consumption(
    *, device: Device, driver: str, requests: Mapping[str, Quantity] | None
) -> dict[str, Quantity]:
    """What one allocation of a multi-allocatable device consumes, for every capacity it has."""
    return {
        name: consumed_amount(None if not requests else _lookup(requests, name, driver), capacity)
        for name, capacity in device.capacity.items()
    }
