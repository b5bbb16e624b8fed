"""The functions of the Kubernetes DRA CEL environment, each declared once with its overloads.

Each function here carries its declaration (``@_declare``: name, overloads, purity): the checker
accepts exactly those overloads and the compiler calls the function beneath. Functions cel-python
already implements are declared in the first section, with cel-python's implementation.

cel-python calls a function ``f`` the same way for ``f(x, y)`` and ``x.f(y)``: with the receiver as
first argument. Several names are shared by different libraries (``indexOf`` for strings and lists,
``compareTo`` for quantities and semvers), so each function dispatches on the argument types; the
overloads only tell the checker which call styles and arities to allow.

Errors are returned as ``CELEvalError`` values with a clear message (cel-python would turn a raised
ValueError into a misleading "return error for overflow").
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, TypeVar

import re2
from celpy import celtypes
from celpy.evaluation import CELEvalError, base_functions

from dra_api.attributes import Version
from dra_api.quantity import Quantity

from .declarations import ANY_RECEIVER, DYN, OPTIONAL, Declaration, Overload, function, member
from .values import NONE, CelOptional, CelSemver, cel_kind, cel_values_equal

__all__ = ["DECLARATIONS", "MAX_INCLUDES_LIST"]

# includes() refuses longer lists, as upstream (ResourceSliceMaxAttributeValuesPerDevice).
MAX_INCLUDES_LIST: Final = 48

# lists.range() beyond this would exceed upstream's runtime cost limit anyway.
MAX_RANGE: Final = 1_000_000

CelFunction = Callable[..., Any]
_F = TypeVar("_F", bound=CelFunction)

_DECLARED: dict[str, Declaration] = {}


def _add(declaration: Declaration) -> None:
    if declaration.name in _DECLARED:
        raise RuntimeError(f"CEL function {declaration.name!r} is declared twice")
    _DECLARED[declaration.name] = declaration


def _declare(name: str, *overloads: Overload, pure: bool = False) -> Callable[[_F], _F]:
    """Declare the function below as the CEL function ``name`` with these overloads."""

    def register(fn: _F) -> _F:
        _add(Declaration(name, overloads, _cel_function(fn), pure))
        return fn

    return register


def _builtin(name: str, *overloads: Overload) -> None:
    # cel-python's own implementation; a name it lacks fails here, at import, not in a selector.
    _add(Declaration(name, overloads, base_functions[name]))


class _Fail(Exception):
    """Raised inside a library function; becomes a CEL evaluation error with this message."""


def _cel_function(fn: CelFunction) -> CelFunction:
    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        for arg in args:
            if isinstance(arg, CELEvalError):
                return arg
        try:
            return fn(*args)
        except _Fail as exc:
            return CELEvalError(str(exc))
        except (ValueError, OverflowError) as exc:
            return CELEvalError(f"{fn.__name__.rstrip('_')}: {exc}")

    return wrapper


def _overload_error(name: str, *args: Any) -> _Fail:
    kinds = ", ".join(cel_kind(a) for a in args)
    return _Fail(f"no such overload: {name}({kinds})")


def _bool(value: bool) -> celtypes.BoolType:
    return celtypes.BoolType(value)


def _int(value: int) -> celtypes.IntType:
    return celtypes.IntType(value)


def _require_str(name: str, *args: Any) -> None:
    if not all(isinstance(a, str) for a in args):
        raise _overload_error(name, *args)


def _require_int(name: str, *args: Any) -> None:
    if not all(isinstance(a, int) and not isinstance(a, celtypes.BoolType | bool) for a in args):
        raise _overload_error(name, *args)


# ---- core functions, implemented by cel-python ---------------------------------------------------

_builtin("size", function([1], "int"), member("string bytes list map", [0], "int"))
_builtin("int", function([1], "int"))
_builtin("uint", function([1], "uint"))
_builtin("double", function([1], "double"))
_builtin("string", function([1], "string"))
_builtin("bool", function([1], "bool"))
_builtin("bytes", function([1], "bytes"))
_builtin("type", function([1], "type"))
_builtin("duration", function([1], "duration"))
_builtin("timestamp", function([1], "timestamp"))
_builtin("matches", function([2], "bool"), member("string", [1], "bool"))
_builtin("contains", member("string", [1], "bool"))
_builtin("startsWith", member("string", [1], "bool"))
_builtin("endsWith", member("string", [1], "bool"))
# A timestamp has all ten getters, each with an optional time zone; a duration only those of time
# units, without one. That is upstream CEL's declaration, and all that cel-python serves.
for _getter in ("getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getFullYear", "getMonth"):
    _builtin(_getter, member("timestamp", [0, 1], "int"))
for _getter in ("getHours", "getMilliseconds", "getMinutes", "getSeconds"):
    _builtin(_getter, member("timestamp", [0, 1], "int"), member("duration", [0], "int"))


@_declare("dyn", function([1], DYN), pure=True)
def dyn(value: Any) -> Any:
    # dyn() only widens the static type; at run time it is the identity.
    return value


# ---- quantity library --------------------------------------------------------------------------


@_declare("quantity", function([1], "Quantity"), pure=True)
def quantity(text: Any) -> Quantity:
    _require_str("quantity", text)
    try:
        return Quantity.parse(str(text))
    except ValueError as exc:
        raise _Fail(f"quantity: {exc}") from None


@_declare("isQuantity", function([1], "bool"), pure=True)
def isQuantity(text: Any) -> celtypes.BoolType:
    _require_str("isQuantity", text)
    try:
        Quantity.parse(str(text))
    except ValueError:
        return _bool(False)
    return _bool(True)


def _as_quantity(name: str, receiver: Any, other: Any) -> Quantity:
    if isinstance(other, Quantity):
        return other
    if isinstance(other, int) and not isinstance(other, celtypes.BoolType | bool):
        return Quantity.from_int(int(other))
    raise _overload_error(name, receiver, other)


@_declare("add", member("Quantity", [1], "Quantity"))
def add(receiver: Any, other: Any) -> Quantity:
    if not isinstance(receiver, Quantity):
        raise _overload_error("add", receiver, other)
    return receiver + _as_quantity("add", receiver, other)


@_declare("sub", member("Quantity", [1], "Quantity"))
def sub(receiver: Any, other: Any) -> Quantity:
    if not isinstance(receiver, Quantity):
        raise _overload_error("sub", receiver, other)
    return receiver - _as_quantity("sub", receiver, other)


@_declare("sign", member("Quantity", [0], "int"))
def sign(receiver: Any) -> celtypes.IntType:
    if not isinstance(receiver, Quantity):
        raise _overload_error("sign", receiver)
    return _int(receiver.sign())


@_declare("isInteger", member("Quantity", [0], "bool"))
def isInteger(receiver: Any) -> celtypes.BoolType:
    if not isinstance(receiver, Quantity):
        raise _overload_error("isInteger", receiver)
    return _bool(receiver.is_integer())


@_declare("asInteger", member("Quantity", [0], "int"))
def asInteger(receiver: Any) -> celtypes.IntType:
    if not isinstance(receiver, Quantity):
        raise _overload_error("asInteger", receiver)
    value = receiver.as_int()
    if value is None:
        raise _Fail(f"cannot convert value {receiver} to integer")
    return _int(value)


@_declare("asApproximateFloat", member("Quantity", [0], "double"))
def asApproximateFloat(receiver: Any) -> celtypes.DoubleType:
    if not isinstance(receiver, Quantity):
        raise _overload_error("asApproximateFloat", receiver)
    return celtypes.DoubleType(receiver.as_approximate_float())


def _compare(name: str, receiver: Any, other: Any) -> int:
    if isinstance(receiver, Quantity) and isinstance(other, Quantity):
        return receiver.compare(other)
    if isinstance(receiver, CelSemver) and isinstance(other, CelSemver):
        return receiver.version.compare(other.version)
    raise _overload_error(name, receiver, other)


@_declare("compareTo", member("Quantity Semver", [1], "int"))
def compareTo(receiver: Any, other: Any) -> celtypes.IntType:
    return _int(_compare("compareTo", receiver, other))


@_declare("isGreaterThan", member("Quantity Semver", [1], "bool"))
def isGreaterThan(receiver: Any, other: Any) -> celtypes.BoolType:
    return _bool(_compare("isGreaterThan", receiver, other) > 0)


@_declare("isLessThan", member("Quantity Semver", [1], "bool"))
def isLessThan(receiver: Any, other: Any) -> celtypes.BoolType:
    return _bool(_compare("isLessThan", receiver, other) < 0)


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


@_declare("semver", function([1, 2], "Semver"), pure=True)
def semver(text: Any, normalize: Any = False) -> CelSemver:
    _require_str("semver", text)
    try:
        return CelSemver(_parse_semver(str(text), bool(normalize)))
    except ValueError as exc:
        raise _Fail(f"semver: {exc}") from None


@_declare("isSemver", function([1, 2], "bool"), pure=True)
def isSemver(text: Any, normalize: Any = False) -> celtypes.BoolType:
    _require_str("isSemver", text)
    try:
        _parse_semver(str(text), bool(normalize))
    except ValueError:
        return _bool(False)
    return _bool(True)


@_declare("major", member("Semver", [0], "int"))
def major(receiver: Any) -> celtypes.IntType:
    if not isinstance(receiver, CelSemver):
        raise _overload_error("major", receiver)
    return _int(receiver.version.major)


@_declare("minor", member("Semver", [0], "int"))
def minor(receiver: Any) -> celtypes.IntType:
    if not isinstance(receiver, CelSemver):
        raise _overload_error("minor", receiver)
    return _int(receiver.version.minor)


@_declare("patch", member("Semver", [0], "int"))
def patch(receiver: Any) -> celtypes.IntType:
    if not isinstance(receiver, CelSemver):
        raise _overload_error("patch", receiver)
    return _int(receiver.version.patch)


# ---- strings extension (cel-go ext.Strings) ----------------------------------------------------


@_declare("charAt", member("string", [1], "string"))
def charAt(text: Any, index: Any) -> celtypes.StringType:
    _require_str("charAt", text)
    _require_int("charAt", index)
    if not 0 <= index <= len(text):
        raise _Fail(f"index out of range: {index}")
    return celtypes.StringType(text[index : index + 1])


def _list_index(name: str, items: list[Any], value: Any, *, last: bool) -> celtypes.IntType:
    positions = range(len(items) - 1, -1, -1) if last else range(len(items))
    for i in positions:
        if cel_values_equal(items[i], value):
            return _int(i)
    return _int(-1)


@_declare("indexOf", member("string", [1, 2], "int"), member("list", [1], "int"))
def indexOf(target: Any, needle: Any, offset: Any = None) -> celtypes.IntType:
    if isinstance(target, list) and offset is None:
        return _list_index("indexOf", target, needle, last=False)
    _require_str("indexOf", target, needle)
    start = 0 if offset is None else offset
    _require_int("indexOf", start)
    if not 0 <= start <= len(target):
        raise _Fail(f"index out of range: {start}")
    return _int(str(target).find(str(needle), start))


@_declare("lastIndexOf", member("string", [1, 2], "int"), member("list", [1], "int"))
def lastIndexOf(target: Any, needle: Any, offset: Any = None) -> celtypes.IntType:
    if isinstance(target, list) and offset is None:
        return _list_index("lastIndexOf", target, needle, last=True)
    _require_str("lastIndexOf", target, needle)
    if offset is None:
        return _int(str(target).rfind(str(needle)))
    _require_int("lastIndexOf", offset)
    if not 0 <= offset <= len(target):
        raise _Fail(f"index out of range: {offset}")
    # The match may start at ``offset`` at the latest.
    return _int(str(target).rfind(str(needle), 0, offset + len(needle)))


def _ascii_map(text: str, upper: bool) -> str:
    if upper:
        return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in text)
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text)


@_declare("lowerAscii", member("string", [0], "string"))
def lowerAscii(text: Any) -> celtypes.StringType:
    _require_str("lowerAscii", text)
    return celtypes.StringType(_ascii_map(str(text), upper=False))


@_declare("upperAscii", member("string", [0], "string"))
def upperAscii(text: Any) -> celtypes.StringType:
    _require_str("upperAscii", text)
    return celtypes.StringType(_ascii_map(str(text), upper=True))


@_declare("replace", member("string", [2, 3], "string"))
def replace(text: Any, old: Any, new: Any, count: Any = -1) -> celtypes.StringType:
    _require_str("replace", text, old, new)
    _require_int("replace", count)
    return celtypes.StringType(str(text).replace(str(old), str(new), int(count)))


@_declare("split", member("string", [1, 2], "list"))
def split(text: Any, sep: Any, limit: Any = -1) -> celtypes.ListType:
    _require_str("split", text, sep)
    _require_int("split", limit)
    s, d, n = str(text), str(sep), int(limit)
    if n == 0:
        return celtypes.ListType()
    if d == "":
        chars = list(s)
        if 0 < n < len(chars):
            chars = [*chars[: n - 1], "".join(chars[n - 1 :])]
        parts = chars
    else:
        parts = s.split(d, n - 1) if n > 0 else s.split(d)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


@_declare("substring", member("string", [1, 2], "string"))
def substring(text: Any, start: Any, end: Any = None) -> celtypes.StringType:
    _require_str("substring", text)
    stop = len(text) if end is None else end
    _require_int("substring", start, stop)
    if not 0 <= start <= len(text):
        raise _Fail(f"index out of range: {start}")
    if not 0 <= stop <= len(text):
        raise _Fail(f"index out of range: {stop}")
    if start > stop:
        raise _Fail(f"invalid substring range. start: {start}, end: {stop}")
    return celtypes.StringType(text[start:stop])


@_declare("trim", member("string", [0], "string"))
def trim(text: Any) -> celtypes.StringType:
    _require_str("trim", text)
    return celtypes.StringType(str(text).strip())


@_declare("join", member("list", [0, 1], "string"))
def join(items: Any, sep: Any = "") -> celtypes.StringType:
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise _overload_error("join", items, sep)
    _require_str("join", sep)
    return celtypes.StringType(str(sep).join(str(i) for i in items))


def _quote(text: str) -> str:
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
    escapes |= {"\\": "\\\\", '"': '\\"'}
    return '"' + "".join(escapes.get(c, c) for c in text) + '"'


@_declare("reverse", member("string", [0], "string"), member("list", [0], "list"))
def reverse(target: Any) -> Any:
    if isinstance(target, str):
        return celtypes.StringType(str(target)[::-1])
    if isinstance(target, list):
        return celtypes.ListType(list(reversed(target)))
    raise _overload_error("reverse", target)


_FORMAT_VERB: Final = re.compile(r"%(?:\.(\d+))?([sdfeboxX%])")


def _format_value(verb: str, precision: str | None, value: Any) -> str:
    kind = cel_kind(value)
    if verb == "s":
        return _to_display(value)
    if verb == "d":
        if kind not in ("int", "uint"):
            raise _Fail(f"format: decimal clause can only be used on integers, was given {kind}")
        return str(int(value))
    if verb in "fe":
        if kind not in ("int", "uint", "double"):
            raise _Fail(f"format: {verb} clause can only be used on numbers, was given {kind}")
        digits = 6 if precision is None else int(precision)
        return f"{float(value):.{digits}{verb}}"
    if kind not in ("int", "uint") and not (verb in "xX" and kind in ("string", "bytes")):
        raise _Fail(f"format: {verb} clause can only be used on integers, was given {kind}")
    if kind in ("string", "bytes"):
        raw = value.encode() if isinstance(value, str) else bytes(value)
        out = raw.hex()
        return out.upper() if verb == "X" else out
    spec = {"b": "b", "o": "o", "x": "x", "X": "X"}[verb]
    return format(int(value), spec)


def _to_display(value: Any) -> str:
    kind = cel_kind(value)
    if kind == "bool":
        return "true" if value else "false"
    if kind == "null":
        return "null"
    if kind == "list":
        return "[" + ", ".join(_to_display(v) for v in value) + "]"
    if kind == "map":
        return "{" + ", ".join(f"{_to_display(k)}: {_to_display(v)}" for k, v in value.items()) + "}"
    if kind == "double":
        return repr(float(value))
    return str(value)


@_declare("format", member("string", [1], "string"))
def format_(template: Any, args: Any) -> celtypes.StringType:
    _require_str("format", template)
    if not isinstance(args, list):
        raise _overload_error("format", template, args)
    position = 0

    def substitute(match: re.Match[str]) -> str:
        nonlocal position
        precision, verb = match.groups()
        if verb == "%":
            return "%"
        if position >= len(args):
            raise _Fail(f"format: index {position} out of range")
        value = args[position]
        position += 1
        return _format_value(verb, precision, value)

    return celtypes.StringType(_FORMAT_VERB.sub(substitute, str(template)))


# ---- Kubernetes regex library ------------------------------------------------------------------


@_declare("find", member("string", [1], "string"))
def find(text: Any, pattern: Any) -> celtypes.StringType:
    _require_str("find", text, pattern)
    try:
        match = re2.search(str(pattern), str(text))
    except re2.error as exc:
        raise _Fail(f"find: invalid regular expression: {exc}") from None
    return celtypes.StringType(match.group(0) if match else "")


@_declare("findAll", member("string", [1, 2], "list"))
def findAll(text: Any, pattern: Any, limit: Any = -1) -> celtypes.ListType:
    _require_str("findAll", text, pattern)
    _require_int("findAll", limit)
    try:
        regex = re2.compile(str(pattern))
    except re2.error as exc:
        raise _Fail(f"findAll: invalid regular expression: {exc}") from None
    found: list[Any] = []
    if limit == 0:
        return celtypes.ListType()
    for match in regex.finditer(str(text)):
        found.append(celtypes.StringType(match.group(0)))
        if 0 < limit <= len(found):
            break
    return celtypes.ListType(found)


# ---- Kubernetes lists library, cel-go ext.Lists and ext.Sets -----------------------------------


def _require_list(name: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise _overload_error(name, value)
    return value


def _order_key(name: str, items: list[Any]) -> Callable[[Any], Any]:
    kinds = {cel_kind(i) for i in items}
    if len(kinds) > 1 and not kinds <= {"int", "uint", "double"}:
        raise _Fail(f"{name}: list elements must be of one comparable type, got {', '.join(sorted(kinds))}")
    kind = next(iter(kinds), "int")
    if kind in ("list", "map", "null"):
        raise _Fail(f"{name}: {kind} values cannot be ordered")
    if kind == "Semver":
        return lambda v: v.version.precedence_key()
    if kind == "Quantity":
        return lambda v: v.nanos
    return lambda v: v


@_declare("isSorted", member("list", [0], "bool"))
def isSorted(items: Any) -> celtypes.BoolType:
    values = _require_list("isSorted", items)
    key = _order_key("isSorted", values)
    return _bool(all(key(a) <= key(b) for a, b in itertools.pairwise(values)))


@_declare("sum", member("list", [0], DYN))
def sum_(items: Any) -> Any:
    values = _require_list("sum", items)
    kinds = {cel_kind(v) for v in values}
    if not values:
        return _int(0)
    if len(kinds) != 1 or not kinds <= {"int", "uint", "double"}:
        raise _Fail(f"sum: list elements must be numbers of one type, got {', '.join(sorted(kinds))}")
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total


@_declare("min", member("list", [0], DYN))
def min_(items: Any) -> Any:
    values = _require_list("min", items)
    if not values:
        raise _Fail("min called on empty list")
    return min(values, key=_order_key("min", values))


@_declare("max", member("list", [0], DYN))
def max_(items: Any) -> Any:
    values = _require_list("max", items)
    if not values:
        raise _Fail("max called on empty list")
    return max(values, key=_order_key("max", values))


@_declare("distinct", member("list", [0], "list"))
def distinct(items: Any) -> celtypes.ListType:
    values = _require_list("distinct", items)
    out: list[Any] = []
    for v in values:
        if not any(cel_values_equal(v, seen) for seen in out):
            out.append(v)
    return celtypes.ListType(out)


@_declare("flatten", member("list", [0, 1], "list"))
def flatten(items: Any, depth: Any = 1) -> celtypes.ListType:
    values = _require_list("flatten", items)
    _require_int("flatten", depth)
    if depth < 0:
        raise _Fail("flatten: level must be non-negative")

    def walk(seq: list[Any], level: int) -> list[Any]:
        out: list[Any] = []
        for v in seq:
            if isinstance(v, list) and level > 0:
                out.extend(walk(v, level - 1))
            else:
                out.append(v)
        return out

    return celtypes.ListType(walk(values, int(depth)))


@_declare("lists.range", function([1], "list"), pure=True)
def lists_range(count: Any) -> celtypes.ListType:
    _require_int("lists.range", count)
    if count > MAX_RANGE:
        raise _Fail(f"lists.range({count}): operation cancelled: actual cost limit exceeded")
    return celtypes.ListType([_int(i) for i in range(max(0, int(count)))])


@_declare("slice", member("list", [2], "list"))
def slice_(items: Any, start: Any, end: Any) -> celtypes.ListType:
    values = _require_list("slice", items)
    _require_int("slice", start, end)
    if start < 0 or end < 0:
        raise _Fail(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        raise _Fail(f"cannot slice({start}, {end}), start index must be less than or equal to end index")
    if end > len(values):
        raise _Fail(f"cannot slice({start}, {end}), list is length {len(values)}")
    return celtypes.ListType(values[start:end])


@_declare("sort", member("list", [0], "list"))
def sort(items: Any) -> celtypes.ListType:
    values = _require_list("sort", items)
    return celtypes.ListType(sorted(values, key=_order_key("sort", values)))


def _contains_all(name: str, a: Any, b: Any) -> bool:
    first, second = _require_list(name, a), _require_list(name, b)
    return all(any(cel_values_equal(x, y) for x in first) for y in second)


@_declare("sets.contains", function([2], "bool"))
def sets_contains(a: Any, b: Any) -> celtypes.BoolType:
    return _bool(_contains_all("sets.contains", a, b))


@_declare("sets.equivalent", function([2], "bool"))
def sets_equivalent(a: Any, b: Any) -> celtypes.BoolType:
    return _bool(_contains_all("sets.equivalent", a, b) and _contains_all("sets.equivalent", b, a))


@_declare("sets.intersects", function([2], "bool"))
def sets_intersects(a: Any, b: Any) -> celtypes.BoolType:
    first, second = _require_list("sets.intersects", a), _require_list("sets.intersects", b)
    return _bool(any(cel_values_equal(x, y) for x in first for y in second))


# ---- DRA: includes() for list-type attributes ---------------------------------------------------


@_declare("includes", member(ANY_RECEIVER, [1], "bool"))
def includes(target: Any, value: Any) -> celtypes.BoolType:
    if isinstance(target, list):
        if len(target) > MAX_INCLUDES_LIST:
            raise _Fail(
                f"includes: list has {len(target)} elements, more than the limit of {MAX_INCLUDES_LIST}"
            )
        return _bool(any(cel_values_equal(item, value) for item in target))
    return _bool(cel_values_equal(target, value))


@_declare("strings.quote", function([1], "string"), pure=True)
def strings_quote(text: Any) -> celtypes.StringType:
    _require_str("strings.quote", text)
    return celtypes.StringType(_quote(str(text)))


# ---- optional types ----------------------------------------------------------------------------


def _require_optional(name: str, value: Any) -> CelOptional:
    if not isinstance(value, CelOptional):
        raise _overload_error(name, value)
    return value


@_declare("hasValue", member(OPTIONAL, [0], "bool"))
def hasValue(target: Any) -> celtypes.BoolType:
    return _bool(_require_optional("hasValue", target).has_value)


@_declare("value", member(OPTIONAL, [0], DYN))
def value(target: Any) -> Any:
    opt = _require_optional("value", target)
    if not opt.has_value:
        raise _Fail("optional.none() dereference")
    return opt.value


@_declare("orValue", member(OPTIONAL, [1], DYN))
def orValue(target: Any, default: Any) -> Any:
    opt = _require_optional("orValue", target)
    return opt.value if opt.has_value else default


@_declare("or", member(OPTIONAL, [1], OPTIONAL))
def or_(target: Any, other: Any) -> Any:
    opt = _require_optional("or", target)
    _require_optional("or", other)
    return opt if opt.has_value else other


@_declare("optional.of", function([1], OPTIONAL))
def optional_of(item: Any) -> CelOptional:
    return CelOptional(item, has_value=True)


@_declare("optional.none", function([0], OPTIONAL))
def optional_none() -> CelOptional:
    return NONE


@_declare("optional.ofNonZeroValue", function([1], OPTIONAL))
def optional_of_non_zero_value(item: Any) -> CelOptional:
    zero = item is None or (not isinstance(item, CelOptional | CelSemver | Quantity) and not item)
    return NONE if zero else CelOptional(item, has_value=True)


DECLARATIONS: Final[Mapping[str, Declaration]] = MappingProxyType(_DECLARED)
