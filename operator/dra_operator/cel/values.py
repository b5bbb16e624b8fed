"""CEL values used by the DRA environment: semver objects and conversion of device data.

Quantities are :class:`dra_api.quantity.Quantity` objects used as CEL values directly. Versions are
wrapped in :class:`CelSemver`, whose equality follows the Kubernetes semver library (precedence,
build metadata ignored) and which refuses ordering operators and comparison with other types, as
the upstream overloads do.
"""

from __future__ import annotations

import functools
from typing import Any, Final

from celpy import celtypes

from dra_api.attributes import AttributeScalar, AttributeValue, Version
from dra_api.quantity import Quantity

__all__ = ["CelOptional", "CelSemver", "attribute_to_cel", "cel_kind", "cel_values_equal"]


class CelSemver:
    """A semantic version as a CEL value (``semver("1.2.3")`` or a version attribute)."""

    __slots__ = ("version",)

    def __init__(self, version: Version) -> None:
        self.version = version

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CelSemver):
            raise TypeError(f"no such overload: Semver == {cel_kind(other)}")
        return self.version.compare(other.version) == 0

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self.version.precedence_key())

    def _no_ordering(self, other: object) -> bool:
        raise TypeError("no such overload: use compareTo, isGreaterThan or isLessThan on semver values")

    __lt__ = __le__ = __gt__ = __ge__ = _no_ordering

    def __repr__(self) -> str:
        return f"semver({self.version.text!r})"

    def __str__(self) -> str:
        return self.version.text


class CelOptional:
    """A CEL optional value (``optional.of(x)``, ``optional.none()``, the result of ``a.?b``)."""

    __slots__ = ("has_value", "value")

    def __init__(self, value: Any = None, *, has_value: bool) -> None:
        self.has_value = has_value
        self.value = value if has_value else None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CelOptional):
            raise TypeError(f"no such overload: optional == {cel_kind(other)}")
        if self.has_value != other.has_value:
            return False
        return not self.has_value or cel_values_equal(self.value, other.value)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"optional.of({self.value!r})" if self.has_value else "optional.none()"


NONE: Final = CelOptional(has_value=False)


def cel_kind(value: object) -> str:
    """The CEL type name of a value, for messages and type-strict comparisons."""
    if value is None:
        return "null"
    if isinstance(value, bool | celtypes.BoolType):
        return "bool"
    if isinstance(value, celtypes.UintType):
        return "uint"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, Quantity):
        return "Quantity"
    if isinstance(value, CelSemver):
        return "Semver"
    if isinstance(value, CelOptional):
        return "optional"
    return type(value).__name__


_NUMERIC = frozenset({"int", "uint", "double"})


def cel_values_equal(a: Any, b: Any) -> bool:
    """CEL runtime (heterogeneous) equality: different types are unequal, numbers compare by value."""
    ka, kb = cel_kind(a), cel_kind(b)
    if ka != kb:
        return ka in _NUMERIC and kb in _NUMERIC and float(a) == float(b) and int(a) == int(b)
    if ka == "list":
        return len(a) == len(b) and all(cel_values_equal(x, y) for x, y in zip(a, b, strict=True))
    if ka == "map":
        return a.keys() == b.keys() and all(cel_values_equal(a[k], b[k]) for k in a)
    return bool(a == b)


@functools.lru_cache(maxsize=8192)
def _cached_int(value: int) -> celtypes.IntType:
    # celtypes.IntType() is slow (it builds a checking wrapper on every call); values are immutable.
    return celtypes.IntType(value)


def _scalar_to_cel(value: AttributeScalar) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return _cached_int(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    return CelSemver(value)


def attribute_to_cel(value: AttributeValue) -> Any:
    """Convert a typed attribute value to the CEL value a selector sees."""
    if isinstance(value, tuple):
        return celtypes.ListType([_scalar_to_cel(item) for item in value])
    return _scalar_to_cel(value)
