"""The core functions: cel-python's own (size, conversions, string tests, time getters), declared
with the overloads upstream CEL gives them, and ``dyn``."""

from __future__ import annotations

from typing import Any

from ..declarations import DYN, function, member
from .registry import builtin, declare

builtin("size", function([1], "int"), member("string bytes list map", [0], "int"))
builtin("int", function([1], "int"))
builtin("uint", function([1], "uint"))
builtin("double", function([1], "double"))
builtin("string", function([1], "string"))
builtin("bool", function([1], "bool"))
builtin("bytes", function([1], "bytes"))
builtin("type", function([1], "type"))
builtin("duration", function([1], "duration"))
builtin("timestamp", function([1], "timestamp"))
builtin("matches", function([2], "bool"), member("string", [1], "bool"))
builtin("contains", member("string", [1], "bool"))
builtin("startsWith", member("string", [1], "bool"))
builtin("endsWith", member("string", [1], "bool"))
# A timestamp has all ten getters, each with an optional time zone; a duration only those of time
# units, without one. That is upstream CEL's declaration, and all that cel-python serves.
for _getter in ("getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getFullYear", "getMonth"):
    builtin(_getter, member("timestamp", [0, 1], "int"))
for _getter in ("getHours", "getMilliseconds", "getMinutes", "getSeconds"):
    builtin(_getter, member("timestamp", [0, 1], "int"), member("duration", [0], "int"))


@declare("dyn", function([1], DYN), pure=True)
def dyn(value: Any) -> Any:
    # dyn() only widens the static type; at run time it is the identity.
    return value
