"""Consumable capacity: how much of a device's capacity a request consumes, and whether it fits.

As Kubernetes 1.37: a ``validRange`` with a ``step`` is evaluated in whole units (each of request,
min and step rounded up to an integer, as ``Quantity.Value()`` does), and the rounded result takes
the step's format. With DRAFractionalCapacityRange (``fractional``) it is evaluated in milli-units
instead, when min, max and step are all whole numbers of milli-units and the step is at least 1m
(otherwise in whole units still): 250m on a 200m/100m range consumes 300m, not 1. A request that
cannot be rounded (above int64 in whole units, not a whole number of milli-units, past int64
milli-units once rounded) and a negative amount are errors (:class:`CapacityError`) that abort the
allocation, not reasons to try another device.
"""

from __future__ import annotations

from collections.abc import Mapping

from dra_api.model import CapacityRequestPolicy, Device, DeviceCapacity, ValidRange
from dra_api.quantity import Quantity

_INT64_MAX = 2**63 - 1
_NANO = 10**9
_NANOS_PER_MILLI = 10**6
_NOT_REPRESENTABLE = "capacity request cannot be represented in the device's range arithmetic"


class CapacityError(ValueError):
    """A capacity request or amount the allocator must not act on (worded as upstream's)."""


def _whole(q: Quantity) -> int:
    """``Quantity.Value()``: the value rounded up to an integer."""
    return -((-q.nanos) // _NANO)


def _milli(q: Quantity) -> int | None:
    """The value in milli-units when it is a whole number of them within int64 (upstream's
    ``safeMilliValue``), else None."""
    milli, rest = divmod(q.nanos, _NANOS_PER_MILLI)
    if rest or not -_INT64_MAX - 1 <= milli <= _INT64_MAX:
        return None
    return milli


def _milli_grid(rng: ValidRange, fractional: bool) -> tuple[int, int] | None:
    """(min, step) in milli-units when a stepped range is worked in them: the gate is on, min, max
    and step are whole numbers of milli-units and the step is at least 1m; else None."""
    if not fractional or rng.step is None:
        return None
    minimum, size = _milli(rng.min), _milli(rng.step)
    if minimum is None or size is None or size < 1:
        return None
    if rng.max is not None and _milli(rng.max) is None:
        return None
    return minimum, size


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


def _round_up_milli(requested: Quantity, grid: tuple[int, int], step: Quantity) -> Quantity:
    want = _milli(requested)
    if want is None:
        raise CapacityError(f"{_NOT_REPRESENTABLE}: request {requested} is not a representable milli value")
    minimum, size = grid
    steps = -((minimum - want) // size)  # ceil((want - minimum) / size); want >= minimum here
    if steps > (_INT64_MAX - minimum) // size:
        raise CapacityError(
            f"{_NOT_REPRESENTABLE}: rounding request {requested} up to the next step passes the "
            "milli-value range"
        )
    return Quantity(nanos=(minimum + size * steps) * _NANOS_PER_MILLI, format=step.format)


def _round_up_range(requested: Quantity, rng: ValidRange, fractional: bool) -> Quantity:
    if requested < rng.min:
        return rng.min
    step = rng.step
    if step is None:
        return requested
    grid = _milli_grid(rng, fractional)
    if grid is not None:
        return _round_up_milli(requested, grid, step)
    if requested.nanos > _INT64_MAX * _NANO:
        raise CapacityError(f"{_NOT_REPRESENTABLE}: request {requested} exceeds MaxInt64")
    want, minimum, size = _whole(requested), _whole(rng.min), _whole(step)
    steps = -((minimum - want) // size)  # ceil((want - minimum) / size); want >= minimum here
    if minimum >= 0 and steps > (_INT64_MAX - minimum) // size:
        raise CapacityError(
            f"{_NOT_REPRESENTABLE}: rounding request {requested} up to the next step passes MaxInt64"
        )
    return Quantity.from_int(minimum + size * steps, format=step.format)


def consumed_amount(requested: Quantity | None, capacity: DeviceCapacity, *, fractional: bool) -> Quantity:
    """The amount consumed: the request rounded up to the policy, or the default, or everything.

    Raises :class:`CapacityError` when the request cannot be rounded."""
    policy = capacity.request_policy
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return capacity.value
    if policy is None:
        return requested
    if policy.valid_range is not None:
        return _round_up_range(requested, policy.valid_range, fractional)
    if policy.valid_values:
        for valid in policy.valid_values:
            if requested <= valid:
                return valid
    return requested


def violates_policy(amount: Quantity, policy: CapacityRequestPolicy | None, *, fractional: bool) -> bool:
    if policy is None:
        return False
    if policy.default is not None and amount == policy.default:
        return False
    rng = policy.valid_range
    if rng is not None:
        if rng.max is not None and amount > rng.max:
            return True
        if rng.step is None:
            return False
        # On the step grid counted from min, in milli-units or whole units as the rounding is
        # (Go's % keeps the dividend's sign: only "is it zero" matters).
        grid = _milli_grid(rng, fractional)
        if grid is not None:
            milli, (minimum, size) = _milli(amount), grid
            return milli is None or abs(milli - minimum) % size != 0
        return abs(_whole(amount) - _whole(rng.min)) % _whole(rng.step) != 0
    if policy.valid_values:
        return amount not in policy.valid_values
    return False


def _amounts(
    device: Device, driver: str, requests: Mapping[str, Quantity] | None, fractional: bool
) -> dict[str, Quantity]:
    out: dict[str, Quantity] = {}
    for name, capacity in device.capacity.items():
        try:
            requested = None if not requests else _lookup(requests, name, driver)
            amount = consumed_amount(requested, capacity, fractional=fractional)
        except CapacityError as exc:
            raise CapacityError(f'capacity "{name}": {exc}') from None
        if amount.sign() < 0:
            raise CapacityError(f'capacity "{name}": capacity value is negative')
        out[name] = amount
    return out


def fits(
    *,
    device: Device,
    driver: str,
    requests: Mapping[str, Quantity] | None,
    consumed: Mapping[str, Quantity] | None,
    allocating: Mapping[str, Quantity] | None,
    fractional: bool,
) -> bool:
    """Upstream ``CmpRequestOverCapacity``: every named capacity exists, no policy is violated and
    already consumed + in flight + this request stays within each capacity's value.

    Every amount is worked out before any is compared, so whether a bad request raises
    :class:`CapacityError` does not depend on the order of the device's capacities."""
    if requests:
        for name in requests:
            if not _has_capacity(device, name, driver):
                return False
    amounts = _amounts(device, driver, requests, fractional)
    for name, capacity in device.capacity.items():
        amount = amounts[name]
        if violates_policy(amount, capacity.request_policy, fractional=fractional):
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
    *, device: Device, driver: str, requests: Mapping[str, Quantity] | None, fractional: bool
) -> dict[str, Quantity]:
    """What one allocation of a multi-allocatable device consumes, for every capacity it has."""
    return _amounts(device, driver, requests, fractional)
