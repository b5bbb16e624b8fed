"""What a set of claims asks for, reduced to counts per CEL projection (class and request selectors).

A :class:`DemandKey` names the devices one (sub)request can use: its class (name and selectors) and
its own selectors. The free-device index counts, per node, the free devices of each key; the
:class:`Demand` of a set of claims says how many of each key a node must at least offer. These are
necessary conditions only: the allocator still decides (constraints, taints, counters, capacity).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dra_api.model import ALL, DeviceClass, DeviceRequest, DeviceSelector, ExactDeviceRequest, ResourceClaim


@dataclass(frozen=True, slots=True)
class DemandKey:
    """The devices a request can use: class name and selectors, then the request's selectors."""

    class_name: str
    class_selectors: tuple[DeviceSelector, ...]
    selectors: tuple[DeviceSelector, ...]


@dataclass(slots=True)
class Demand:
    """Lower bounds a node must meet for the claims to have a chance there.

    ``counts``: key -> devices needed (ExactCount requests, summed per key). ``all_keys``: keys of
    requests in All mode (every matching device must be free, and there must be one). ``choices``:
    one entry per firstAvailable request, satisfied when any alternative's count is met.
    Admin-access requests may use allocated devices and are not counted.
    """

    counts: dict[DemandKey, int] = field(default_factory=dict)
    all_keys: set[DemandKey] = field(default_factory=set)
    choices: list[tuple[tuple[DemandKey, int], ...]] = field(default_factory=list)

    def every_key(self) -> set[DemandKey]:
        out = set(self.counts) | self.all_keys
        for choice in self.choices:
            out.update(k for k, _ in choice)
        return out


def key_of(*, request: ExactDeviceRequest, device_class: DeviceClass) -> DemandKey:
    return DemandKey(
        class_name=device_class.name, class_selectors=device_class.selectors, selectors=request.selectors
    )


def request_specs(request: DeviceRequest) -> list[tuple[str, ExactDeviceRequest]]:
    """A request's ``exactly`` spec, or its subrequests named ``request/subrequest``."""
    if request.exactly is not None:
        return [(request.name, request.exactly)]
    return [(f"{request.name}/{sub.name}", sub.spec) for sub in request.first_available]


def demand_of(*, claims: Sequence[ResourceClaim], classes: dict[str, DeviceClass]) -> Demand:
    """The demand of claims allocated together. Requests naming a missing class are left out (the
    caller reports them as errors first)."""
    demand = Demand()
    for claim in claims:
        for request in claim.spec.requests:
            if request.exactly is not None:
                exact = request.exactly
                device_class = classes.get(exact.device_class_name)
                if device_class is None or exact.admin_access:
                    continue
                key = key_of(request=exact, device_class=device_class)
                if exact.mode == ALL:
                    demand.all_keys.add(key)
                else:
                    demand.counts[key] = demand.counts.get(key, 0) + exact.effective_count
                continue
            options: list[tuple[DemandKey, int]] = []
            unbounded = False
            for sub in request.first_available:
                device_class = classes.get(sub.spec.device_class_name)
                if device_class is None or sub.spec.admin_access:
                    unbounded = True
                    continue
                count = 1 if sub.spec.mode == ALL else sub.spec.effective_count
                options.append((key_of(request=sub.spec, device_class=device_class), count))
            if options and not unbounded:
                demand.choices.append(tuple(options))
    return demand


def request_keys(
    *, claims: Sequence[ResourceClaim], classes: dict[str, DeviceClass]
) -> list[tuple[str, str, DemandKey, int, str]]:
    """(claim ref, request name, key, count, mode) per request and subrequest (for explanations)."""
    out: list[tuple[str, str, DemandKey, int, str]] = []
    for claim in claims:
        for request in claim.spec.requests:
            for name, spec in request_specs(request):
                device_class = classes.get(spec.device_class_name)
                if device_class is None:
                    continue
                out.append(
                    (
                        claim.ref,
                        name,
                        key_of(request=spec, device_class=device_class),
                        spec.effective_count,
                        spec.mode,
                    )
                )
    return out
