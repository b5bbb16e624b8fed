"""Checks made on a claim before placement, for messages that name the field."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet

from dra_api.model import ResourceClaim
from dra_operator.cel import BudgetExhausted
from dra_operator.planner.placement import Unallocatable


def validate_claim(
    claim: ResourceClaim, *, known_drivers: AbstractSet[str], compiler: Callable[[str], object] | None = None
) -> Unallocatable | None:
    """Checks made before placement, for messages that name the field: request selectors that do
    not compile, and opaque configuration for drivers nobody runs."""
    if compiler is not None:
        for i, request in enumerate(claim.spec.requests):
            specs = [(f"spec.devices.requests[{i}].exactly", request.exactly)] if request.exactly else []
            specs += [
                (f"spec.devices.requests[{i}].firstAvailable[{j}]", sub.spec)
                for j, sub in enumerate(request.first_available)
            ]
            for path, spec in specs:
                assert spec is not None
                for k, selector in enumerate(spec.selectors):
                    expression = selector.cel
                    if expression is None:
                        continue
                    try:
                        compiler(expression)
                    except BudgetExhausted:
                        raise  # to be compiled off the event loop: not an answer about the selector
                    except Exception as exc:
                        return Unallocatable(
                            reason="InvalidSelector",
                            message=f"ResourceClaim {claim.ref}: {path}.selectors[{k}].cel.expression "
                            f"{expression!r} does not compile: {' '.join(str(exc).split())}",
                        )
    for i, config in enumerate(claim.spec.config):
        if config.opaque is not None and config.opaque.driver not in known_drivers:
            return Unallocatable(
                reason="UnknownConfigDriver",
                message=f"ResourceClaim {claim.ref}: spec.devices.config[{i}].opaque.driver "
                f"{config.opaque.driver!r} is not a driver in this cluster (known: "
                f"{', '.join(sorted(known_drivers)) or 'none'}); no node could apply this configuration",
            )
    return None
