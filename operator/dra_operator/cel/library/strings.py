"""String functions: cel-go's strings extension (with ``format`` and ``strings.quote``) and the
Kubernetes regex library (``find``, ``findAll``, on RE2 as upstream)."""

from __future__ import annotations

import re
from typing import Any, Final

import re2
from celpy import celtypes

from ..declarations import function, member
from ..values import cel_kind, cel_values_equal
from .registry import Fail, cel_int, declare, overload_error, require_int, require_str

# ---- strings extension (cel-go ext.Strings) ----------------------------------------------------


@declare("charAt", member("string", [1], "string"))
def charAt(text: Any, index: Any) -> celtypes.StringType:
    require_str("charAt", text)
    require_int("charAt", index)
    if not 0 <= index <= len(text):
        raise Fail(f"index out of range: {index}")
    return celtypes.StringType(text[index : index + 1])


def _list_index(name: str, items: list[Any], value: Any, *, last: bool) -> celtypes.IntType:
    positions = range(len(items) - 1, -1, -1) if last else range(len(items))
    for i in positions:
        if cel_values_equal(items[i], value):
            return cel_int(i)
    return cel_int(-1)


@declare("indexOf", member("string", [1, 2], "int"), member("list", [1], "int"))
def indexOf(target: Any, needle: Any, offset: Any = None) -> celtypes.IntType:
    if isinstance(target, list) and offset is None:
        return _list_index("indexOf", target, needle, last=False)
    require_str("indexOf", target, needle)
    start = 0 if offset is None else offset
    require_int("indexOf", start)
    if not 0 <= start <= len(target):
        raise Fail(f"index out of range: {start}")
    return cel_int(str(target).find(str(needle), start))


@declare("lastIndexOf", member("string", [1, 2], "int"), member("list", [1], "int"))
def lastIndexOf(target: Any, needle: Any, offset: Any = None) -> celtypes.IntType:
    if isinstance(target, list) and offset is None:
        return _list_index("lastIndexOf", target, needle, last=True)
    require_str("lastIndexOf", target, needle)
    if offset is None:
        return cel_int(str(target).rfind(str(needle)))
    require_int("lastIndexOf", offset)
    if not 0 <= offset <= len(target):
        raise Fail(f"index out of range: {offset}")
    # The match may start at ``offset`` at the latest.
    return cel_int(str(target).rfind(str(needle), 0, offset + len(needle)))


def _ascii_map(text: str, upper: bool) -> str:
    if upper:
        return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in text)
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text)


@declare("lowerAscii", member("string", [0], "string"))
def lowerAscii(text: Any) -> celtypes.StringType:
    require_str("lowerAscii", text)
    return celtypes.StringType(_ascii_map(str(text), upper=False))


@declare("upperAscii", member("string", [0], "string"))
def upperAscii(text: Any) -> celtypes.StringType:
    require_str("upperAscii", text)
    return celtypes.StringType(_ascii_map(str(text), upper=True))


@declare("replace", member("string", [2, 3], "string"))
def replace(text: Any, old: Any, new: Any, count: Any = -1) -> celtypes.StringType:
    require_str("replace", text, old, new)
    require_int("replace", count)
    return celtypes.StringType(str(text).replace(str(old), str(new), int(count)))


@declare("split", member("string", [1, 2], "list"))
def split(text: Any, sep: Any, limit: Any = -1) -> celtypes.ListType:
    require_str("split", text, sep)
    require_int("split", limit)
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


@declare("substring", member("string", [1, 2], "string"))
def substring(text: Any, start: Any, end: Any = None) -> celtypes.StringType:
    require_str("substring", text)
    stop = len(text) if end is None else end
    require_int("substring", start, stop)
    if not 0 <= start <= len(text):
        raise Fail(f"index out of range: {start}")
    if not 0 <= stop <= len(text):
        raise Fail(f"index out of range: {stop}")
    if start > stop:
        raise Fail(f"invalid substring range. start: {start}, end: {stop}")
    return celtypes.StringType(text[start:stop])


@declare("trim", member("string", [0], "string"))
def trim(text: Any) -> celtypes.StringType:
    require_str("trim", text)
    return celtypes.StringType(str(text).strip())


@declare("join", member("list", [0, 1], "string"))
def join(items: Any, sep: Any = "") -> celtypes.StringType:
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise overload_error("join", items, sep)
    require_str("join", sep)
    return celtypes.StringType(str(sep).join(str(i) for i in items))


def _quote(text: str) -> str:
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
    escapes |= {"\\": "\\\\", '"': '\\"'}
    return '"' + "".join(escapes.get(c, c) for c in text) + '"'


@declare("reverse", member("string", [0], "string"), member("list", [0], "list"))
def reverse(target: Any) -> Any:
    if isinstance(target, str):
        return celtypes.StringType(str(target)[::-1])
    if isinstance(target, list):
        return celtypes.ListType(list(reversed(target)))
    raise overload_error("reverse", target)


_FORMAT_VERB: Final = re.compile(r"%(?:\.(\d+))?([sdfeboxX%])")


def _format_value(verb: str, precision: str | None, value: Any) -> str:
    kind = cel_kind(value)
    if verb == "s":
        return _to_display(value)
    if verb == "d":
        if kind not in ("int", "uint"):
            raise Fail(f"format: decimal clause can only be used on integers, was given {kind}")
        return str(int(value))
    if verb in "fe":
        if kind not in ("int", "uint", "double"):
            raise Fail(f"format: {verb} clause can only be used on numbers, was given {kind}")
        digits = 6 if precision is None else int(precision)
        return f"{float(value):.{digits}{verb}}"
    if kind not in ("int", "uint") and not (verb in "xX" and kind in ("string", "bytes")):
        raise Fail(f"format: {verb} clause can only be used on integers, was given {kind}")
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


@declare("format", member("string", [1], "string"))
def format_(template: Any, args: Any) -> celtypes.StringType:
    require_str("format", template)
    if not isinstance(args, list):
        raise overload_error("format", template, args)
    position = 0

    def substitute(match: re.Match[str]) -> str:
        nonlocal position
        precision, verb = match.groups()
        if verb == "%":
            return "%"
        if position >= len(args):
            raise Fail(f"format: index {position} out of range")
        value = args[position]
        position += 1
        return _format_value(verb, precision, value)

    return celtypes.StringType(_FORMAT_VERB.sub(substitute, str(template)))


@declare("strings.quote", function([1], "string"), pure=True)
def strings_quote(text: Any) -> celtypes.StringType:
    require_str("strings.quote", text)
    return celtypes.StringType(_quote(str(text)))


# ---- Kubernetes regex library ------------------------------------------------------------------


@declare("find", member("string", [1], "string"))
def find(text: Any, pattern: Any) -> celtypes.StringType:
    require_str("find", text, pattern)
    try:
        match = re2.search(str(pattern), str(text))
    except re2.error as exc:
        raise Fail(f"find: invalid regular expression: {exc}") from None
    return celtypes.StringType(match.group(0) if match else "")


@declare("findAll", member("string", [1, 2], "list"))
def findAll(text: Any, pattern: Any, limit: Any = -1) -> celtypes.ListType:
    require_str("findAll", text, pattern)
    require_int("findAll", limit)
    try:
        regex = re2.compile(str(pattern))
    except re2.error as exc:
        raise Fail(f"findAll: invalid regular expression: {exc}") from None
    found: list[Any] = []
    if limit == 0:
        return celtypes.ListType()
    for match in regex.finditer(str(text)):
        found.append(celtypes.StringType(match.group(0)))
        if 0 < limit <= len(found):
            break
    return celtypes.ListType(found)
