"""List functions: the Kubernetes lists library, cel-go's ext.Lists and ext.Sets, and DRA's
``includes`` for list-type attributes."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Final

from celpy import celtypes

from ..declarations import ANY_RECEIVER, DYN, function, member
from ..values import cel_kind, cel_values_equal
from .registry import Fail, cel_bool, cel_int, declare, overload_error, require_int

# includes() refuses longer lists, as upstream (ResourceSliceMaxAttributeValuesPerDevice).
MAX_INCLUDES_LIST: Final = 48

# lists.range() beyond this would exceed upstream's runtime cost limit anyway.
MAX_RANGE: Final = 1_000_000


# ---- Kubernetes lists library, cel-go ext.Lists and ext.Sets -----------------------------------


def _require_list(name: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise overload_error(name, value)
    return value


def _order_key(name: str, items: list[Any]) -> Callable[[Any], Any]:
    kinds = {cel_kind(i) for i in items}
    if len(kinds) > 1 and not kinds <= {"int", "uint", "double"}:
        raise Fail(f"{name}: list elements must be of one comparable type, got {', '.join(sorted(kinds))}")
    kind = next(iter(kinds), "int")
    if kind in ("list", "map", "null"):
        raise Fail(f"{name}: {kind} values cannot be ordered")
    if kind == "Semver":
        return lambda v: v.version.precedence_key()
    if kind == "Quantity":
        return lambda v: v.nanos
    return lambda v: v


@declare("isSorted", member("list", [0], "bool"))
def isSorted(items: Any) -> celtypes.BoolType:
    values = _require_list("isSorted", items)
    key = _order_key("isSorted", values)
    return cel_bool(all(key(a) <= key(b) for a, b in itertools.pairwise(values)))


@declare("sum", member("list", [0], DYN))
def sum_(items: Any) -> Any:
    values = _require_list("sum", items)
    kinds = {cel_kind(v) for v in values}
    if not values:
        return cel_int(0)
    if len(kinds) != 1 or not kinds <= {"int", "uint", "double"}:
        raise Fail(f"sum: list elements must be numbers of one type, got {', '.join(sorted(kinds))}")
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total


@declare("min", member("list", [0], DYN))
def min_(items: Any) -> Any:
    values = _require_list("min", items)
    if not values:
        raise Fail("min called on empty list")
    return min(values, key=_order_key("min", values))


@declare("max", member("list", [0], DYN))
def max_(items: Any) -> Any:
    values = _require_list("max", items)
    if not values:
        raise Fail("max called on empty list")
    return max(values, key=_order_key("max", values))


@declare("distinct", member("list", [0], "list"))
def distinct(items: Any) -> celtypes.ListType:
    values = _require_list("distinct", items)
    out: list[Any] = []
    for v in values:
        if not any(cel_values_equal(v, seen) for seen in out):
            out.append(v)
    return celtypes.ListType(out)


@declare("flatten", member("list", [0, 1], "list"))
def flatten(items: Any, depth: Any = 1) -> celtypes.ListType:
    values = _require_list("flatten", items)
    require_int("flatten", depth)
    if depth < 0:
        raise Fail("flatten: level must be non-negative")

    def walk(seq: list[Any], level: int) -> list[Any]:
        out: list[Any] = []
        for v in seq:
            if isinstance(v, list) and level > 0:
                out.extend(walk(v, level - 1))
            else:
                out.append(v)
        return out

    return celtypes.ListType(walk(values, int(depth)))


@declare("lists.range", function([1], "list"), pure=True)
def lists_range(count: Any) -> celtypes.ListType:
    require_int("lists.range", count)
    if count > MAX_RANGE:
        raise Fail(f"lists.range({count}): operation cancelled: actual cost limit exceeded")
    return celtypes.ListType([cel_int(i) for i in range(max(0, int(count)))])


@declare("slice", member("list", [2], "list"))
def slice_(items: Any, start: Any, end: Any) -> celtypes.ListType:
    values = _require_list("slice", items)
    require_int("slice", start, end)
    if start < 0 or end < 0:
        raise Fail(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        raise Fail(f"cannot slice({start}, {end}), start index must be less than or equal to end index")
    if end > len(values):
        raise Fail(f"cannot slice({start}, {end}), list is length {len(values)}")
    return celtypes.ListType(values[start:end])


@declare("sort", member("list", [0], "list"))
def sort(items: Any) -> celtypes.ListType:
    values = _require_list("sort", items)
    return celtypes.ListType(sorted(values, key=_order_key("sort", values)))


def _contains_all(name: str, a: Any, b: Any) -> bool:
    first, second = _require_list(name, a), _require_list(name, b)
    return all(any(cel_values_equal(x, y) for x in first) for y in second)


@declare("sets.contains", function([2], "bool"))
def sets_contains(a: Any, b: Any) -> celtypes.BoolType:
    return cel_bool(_contains_all("sets.contains", a, b))


@declare("sets.equivalent", function([2], "bool"))
def sets_equivalent(a: Any, b: Any) -> celtypes.BoolType:
    return cel_bool(_contains_all("sets.equivalent", a, b) and _contains_all("sets.equivalent", b, a))


@declare("sets.intersects", function([2], "bool"))
def sets_intersects(a: Any, b: Any) -> celtypes.BoolType:
    first, second = _require_list("sets.intersects", a), _require_list("sets.intersects", b)
    return cel_bool(any(cel_values_equal(x, y) for x in first for y in second))


# ---- DRA: includes() for list-type attributes ---------------------------------------------------


@declare("includes", member(ANY_RECEIVER, [1], "bool"))
def includes(target: Any, value: Any) -> celtypes.BoolType:
    if isinstance(target, list):
        if len(target) > MAX_INCLUDES_LIST:
            raise Fail(
                f"includes: list has {len(target)} elements, more than the limit of {MAX_INCLUDES_LIST}"
            )
        return cel_bool(any(cel_values_equal(item, value) for item in target))
    return cel_bool(cel_values_equal(target, value))
