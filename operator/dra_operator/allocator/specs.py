"""One allocation run's claims as its search reads them: each request or subrequest prepared as a
:class:`Spec`, grouped by request and claim, and the devices the search picks (:class:`Pick`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from dra_api.model import DeviceClass, DeviceToleration, ExactDeviceRequest, ResourceClaim
from dra_api.quantity import Quantity
from dra_operator.allocator.constraints import Constraint, Lookup, lookup_attribute
from dra_operator.allocator.pools import DeviceEntry, Pool, SliceEntry


class Spec:
    """One request (``exactly``) or one subrequest, prepared for the search."""

    __slots__ = (
        "admin",
        "all_devices",
        "capacity",
        "claim_index",
        "derived",
        "device_class",
        "full",
        "key",
        "lookup",
        "mode",
        "num_devices",
        "parent",
        "request",
        "tolerations",
    )

    def __init__(
        self,
        *,
        key: int,
        claim_index: int,
        parent: str,
        full: str,
        request: ExactDeviceRequest,
        device_class: DeviceClass,
    ) -> None:
        self.key = key
        self.claim_index = claim_index
        self.parent = parent
        self.full = full  # "req" or "req/sub", as written into results
        self.request = request
        self.device_class = device_class
        self.mode = request.mode
        self.admin = bool(request.admin_access)
        self.tolerations: tuple[DeviceToleration, ...] = request.tolerations
        self.capacity: Mapping[str, Quantity] | None = request.capacity or None
        self.num_devices = 0
        self.all_devices: list[tuple[Pool, SliceEntry, int]] = []
        # DRADerivedAttributes: attribute name -> CEL expression, and how the request's constraints
        # see a device's attributes (the derived ones shadowing the device's own).
        self.derived: Mapping[str, str] = {}
        self.lookup: Lookup = lookup_attribute


@dataclass(slots=True)
class PreparedRequest:
    """A request: one spec (``single``), or its subrequests' in order (``subs``, firstAvailable)."""

    name: str
    single: Spec | None
    subs: tuple[Spec, ...]


@dataclass(slots=True)
class PreparedClaim:
    claim: ResourceClaim
    ref: str
    requests: list[PreparedRequest]
    constraints: list[Constraint]


@dataclass(slots=True)
class Pick:
    """A device the search placed for a spec, with its share ID and the capacity it consumes
    (multi-allocatable devices only)."""

    spec: Spec
    entry: DeviceEntry
    share_id: str | None
    consumed: dict[str, Quantity] | None


def all_specs(claims: list[PreparedClaim]) -> Iterator[Spec]:
    """Every request's spec, or each of its subrequests', claim by claim."""
    return (s for c in claims for r in c.requests for s in (r.subs or (r.single,)) if s)
