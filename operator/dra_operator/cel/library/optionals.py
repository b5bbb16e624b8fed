"""Optional values: ``optional.of``, ``optional.none``, ``optional.ofNonZeroValue`` and the
methods of an optional."""

from __future__ import annotations

from typing import Any

from celpy import celtypes

from dra_api.quantity import Quantity

from ..declarations import DYN, OPTIONAL, function, member
from ..values import NONE, CelOptional, CelSemver
from .registry import Fail, cel_bool, declare, overload_error


def _require_optional(name: str, value: Any) -> CelOptional:
    if not isinstance(value, CelOptional):
        raise overload_error(name, value)
    return value


@declare("hasValue", member(OPTIONAL, [0], "bool"))
def hasValue(target: Any) -> celtypes.BoolType:
    return cel_bool(_require_optional("hasValue", target).has_value)


@declare("value", member(OPTIONAL, [0], DYN))
def value(target: Any) -> Any:
    opt = _require_optional("value", target)
    if not opt.has_value:
        raise Fail("optional.none() dereference")
    return opt.value


@declare("orValue", member(OPTIONAL, [1], DYN))
def orValue(target: Any, default: Any) -> Any:
    opt = _require_optional("orValue", target)
    return opt.value if opt.has_value else default


@declare("or", member(OPTIONAL, [1], OPTIONAL))
def or_(target: Any, other: Any) -> Any:
    opt = _require_optional("or", target)
    _require_optional("or", other)
    return opt if opt.has_value else other


@declare("optional.of", function([1], OPTIONAL))
def optional_of(item: Any) -> CelOptional:
    return CelOptional(item, has_value=True)


@declare("optional.none", function([0], OPTIONAL))
def optional_none() -> CelOptional:
    return NONE


@declare("optional.ofNonZeroValue", function([1], OPTIONAL))
def optional_of_non_zero_value(item: Any) -> CelOptional:
    zero = item is None or (not isinstance(item, CelOptional | CelSemver | Quantity) and not item)
    return NONE if zero else CelOptional(item, has_value=True)
