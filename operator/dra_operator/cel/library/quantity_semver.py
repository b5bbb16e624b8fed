"""The Kubernetes quantity and semver libraries; ``compareTo``, ``isGreaterThan`` and
``isLessThan`` serve both."""

from __future__ import annotations

import re
from typing import Any, Final

from celpy import celtypes

from dra_api.attributes import Version
from dra_api.quantity import Quantity

from ..declarations import function, member
from ..values import CelSemver
from .registry import Fail, cel_bool, cel_int, declare, overload_error, require_str

# ---- quantity library --------------------------------------------------------------------------


@declare("quantity", function([1], "Quantity"), pure=True)
def quantity(text: Any) -> Quantity:
    require_str("quantity", text)
    try:
        return Quantity.parse(str(text))
    except ValueError as exc:
        raise Fail(f"quantity: {exc}") from None


@declare("isQuantity", function([1], "bool"), pure=True)
def isQuantity(text: Any) -> celtypes.BoolType:
    require_str("isQuantity", text)
    try:
        Quantity.parse(str(text))
    except ValueError:
        return cel_bool(False)
    return cel_bool(True)


def _as_quantity(name: str, receiver: Any, other: Any) -> Quantity:
    if isinstance(other, Quantity):
        return other
    if isinstance(other, int) and not isinstance(other, celtypes.BoolType | bool):
        return Quantity.from_int(int(other))
    raise overload_error(name, receiver, other)


@declare("add", member("Quantity", [1], "Quantity"))
def add(receiver: Any, other: Any) -> Quantity:
    if not isinstance(receiver, Quantity):
        raise overload_error("add", receiver, other)
    return receiver + _as_quantity("add", receiver, other)


@declare("sub", member("Quantity", [1], "Quantity"))
def sub(receiver: Any, other: Any) -> Quantity:
    if not isinstance(receiver, Quantity):
        raise overload_error("sub", receiver, other)
    return receiver - _as_quantity("sub", receiver, other)


@declare("sign", member("Quantity", [0], "int"))
def sign(receiver: Any) -> celtypes.IntType:
    if not isinstance(receiver, Quantity):
        raise overload_error("sign", receiver)
    return cel_int(receiver.sign())


@declare("isInteger", member("Quantity", [0], "bool"))
def isInteger(receiver: Any) -> celtypes.BoolType:
    if not isinstance(receiver, Quantity):
        raise overload_error("isInteger", receiver)
    return cel_bool(receiver.is_integer())


@declare("asInteger", member("Quantity", [0], "int"))
def asInteger(receiver: Any) -> celtypes.IntType:
    if not isinstance(receiver, Quantity):
        raise overload_error("asInteger", receiver)
    value = receiver.as_int()
    if value is None:
        raise Fail(f"cannot convert value {receiver} to integer")
    return cel_int(value)


@declare("asApproximateFloat", member("Quantity", [0], "double"))
def asApproximateFloat(receiver: Any) -> celtypes.DoubleType:
    if not isinstance(receiver, Quantity):
        raise overload_error("asApproximateFloat", receiver)
    return celtypes.DoubleType(receiver.as_approximate_float())


def _compare(name: str, receiver: Any, other: Any) -> int:
    if isinstance(receiver, Quantity) and isinstance(other, Quantity):
        return receiver.compare(other)
    if isinstance(receiver, CelSemver) and isinstance(other, CelSemver):
        return receiver.version.compare(other.version)
    raise overload_error(name, receiver, other)


@declare("compareTo", member("Quantity Semver", [1], "int"))
def compareTo(receiver: Any, other: Any) -> celtypes.IntType:
    return cel_int(_compare("compareTo", receiver, other))


@declare("isGreaterThan", member("Quantity Semver", [1], "bool"))
def isGreaterThan(receiver: Any, other: Any) -> celtypes.BoolType:
    return cel_bool(_compare("isGreaterThan", receiver, other) > 0)


@declare("isLessThan", member("Quantity Semver", [1], "bool"))
def isLessThan(receiver: Any, other: Any) -> celtypes.BoolType:
    return cel_bool(_compare("isLessThan", receiver, other) < 0)


# ---- semver library ----------------------------------------------------------------------------

_NORMALIZE_CORE: Final = re.compile(r"v?([0-9]+)(?:\.([0-9]+))?(?:\.([0-9]+))?(.*)", re.ASCII | re.DOTALL)


def _normalize_semver(text: str) -> str:
    """Lenient form accepted with normalize=true: a leading "v", missing minor/patch, leading zeros."""
    match = _NORMALIZE_CORE.fullmatch(text)
    if match is None:
        return text
    major, minor, patch, rest = match.groups()
    parts = [str(int(p)) if p is not None else "0" for p in (major, minor, patch)]
    return ".".join(parts) + rest


def _parse_semver(text: str, normalize: bool) -> Version:
    return Version(_normalize_semver(text) if normalize else text)


@declare("semver", function([1, 2], "Semver"), pure=True)
def semver(text: Any, normalize: Any = False) -> CelSemver:
    require_str("semver", text)
    try:
        return CelSemver(_parse_semver(str(text), bool(normalize)))
    except ValueError as exc:
        raise Fail(f"semver: {exc}") from None


@declare("isSemver", function([1, 2], "bool"), pure=True)
def isSemver(text: Any, normalize: Any = False) -> celtypes.BoolType:
    require_str("isSemver", text)
    try:
        _parse_semver(str(text), bool(normalize))
    except ValueError:
        return cel_bool(False)
    return cel_bool(True)


@declare("major", member("Semver", [0], "int"))
def major(receiver: Any) -> celtypes.IntType:
    if not isinstance(receiver, CelSemver):
        raise overload_error("major", receiver)
    return cel_int(receiver.version.major)


@declare("minor", member("Semver", [0], "int"))
def minor(receiver: Any) -> celtypes.IntType:
    if not isinstance(receiver, CelSemver):
        raise overload_error("minor", receiver)
    return cel_int(receiver.version.minor)


@declare("patch", member("Semver", [0], "int"))
def patch(receiver: Any) -> celtypes.IntType:
    if not isinstance(receiver, CelSemver):
        raise overload_error("patch", receiver)
    return cel_int(receiver.version.patch)
