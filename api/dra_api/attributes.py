"""Typed values of ResourceSlice device attributes (``resource.k8s.io/v1`` ``DeviceAttribute``).

A device attribute holds exactly one of ``int``, ``bool``, ``string`` or ``version`` (a semver 2.0.0
string), or, with ``DRAListTypeAttributes`` (1.36), a non-empty list ``ints``, ``bools``, ``strings`` or
``versions``. Scalars map to Python ``bool``/``int``/``str``/:class:`Version`; lists map to tuples.

Python treats ``True == 1``; use :func:`attribute_values_equal` to compare attribute values the way the
allocator must (type first, versions by semver precedence).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "AttributeScalar",
    "AttributeValue",
    "UnsupportedAttribute",
    "Version",
    "attribute_from_json",
    "attribute_to_json",
    "attribute_values_equal",
    "device_attribute_from_json",
]

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

# The regular expression semver.org publishes for SemVer 2.0.0 (no leading "v", no leading zeros).
_SEMVER_RE: Final = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$",
    re.ASCII,
)


@dataclass(frozen=True, slots=True)
class Version:
    """A semantic version (SemVer 2.0.0) attribute value; validated on construction."""

    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or _SEMVER_RE.fullmatch(self.text) is None:
            raise ValueError(f"invalid version {self.text!r}: must be a SemVer 2.0.0 string like 1.2.3")

    def _parts(self) -> re.Match[str]:
        match = _SEMVER_RE.fullmatch(self.text)
        assert match is not None  # validated in __post_init__
        return match

    @property
    def major(self) -> int:
        return int(self._parts().group(1))

    @property
    def minor(self) -> int:
        return int(self._parts().group(2))

    @property
    def patch(self) -> int:
        return int(self._parts().group(3))

    @property
    def prerelease(self) -> tuple[str, ...]:
        pre = self._parts().group(4)
        return tuple(pre.split(".")) if pre else ()

    @property
    def build(self) -> tuple[str, ...]:
        build = self._parts().group(5)
        return tuple(build.split(".")) if build else ()

    def compare(self, other: Version) -> int:
        """-1, 0 or 1 by SemVer precedence (build metadata ignored)."""
        return _cmp(self.precedence_key(), other.precedence_key())

    def precedence_key(self) -> tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]:
        """A sort key giving SemVer precedence: a release sorts after its pre-releases."""
        return _precedence_key(self.text)

    def __str__(self) -> str:
        return self.text


@functools.lru_cache(maxsize=4096)
def _precedence_key(text: str) -> tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]:
    match = _SEMVER_RE.fullmatch(text)
    assert match is not None  # only called for validated versions
    major, minor, patch, pre = match.group(1), match.group(2), match.group(3), match.group(4)
    # Numeric identifiers sort before alphanumeric ones, numerically among themselves.
    pre_key = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")) if pre else ()
    return (int(major), int(minor), int(patch), 0 if pre else 1, pre_key)


def _cmp(a: Any, b: Any) -> int:
    return int(a > b) - int(a < b)


AttributeScalar = bool | int | str | Version
AttributeValue = AttributeScalar | tuple[AttributeScalar, ...]


@dataclass(frozen=True, slots=True)
class UnsupportedAttribute:
    """An attribute that decodes but holds no usable value (no field set, or an unparsable version).

    Upstream turns such an attribute into an evaluation error ("unsupported attribute value") as soon
    as a CEL selector runs on the device, not when the slice is read.
    """

    reason: str


_SCALAR_FIELDS: Final = ("int", "bool", "string", "version")
_LIST_FIELDS: Final = {"ints": "int", "bools": "bool", "strings": "string", "versions": "version"}


def _scalar(kind: str, raw: object, *, where: str) -> AttributeScalar:
    if kind == "int":
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ValueError(f"attribute {where}: int value must be an integer, got {raw!r}")
        if not INT64_MIN <= raw <= INT64_MAX:
            raise ValueError(f"attribute {where}: int value {raw} does not fit in int64")
        return raw
    if kind == "bool":
        if not isinstance(raw, bool):
            raise ValueError(f"attribute {where}: bool value must be true or false, got {raw!r}")
        return raw
    if not isinstance(raw, str):
        raise ValueError(f"attribute {where}: {kind} value must be a string, got {raw!r}")
    if kind == "version":
        try:
            return Version(raw)
        except ValueError as exc:
            raise ValueError(f"attribute {where}: {exc}") from None
    return raw


def attribute_from_json(obj: Mapping[str, Any]) -> AttributeValue:
    """Decode a v1 ``DeviceAttribute`` JSON object; ValueError unless exactly one valid field is set."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"attribute must be an object, got {obj!r}")
    present = [key for key, val in obj.items() if val is not None]
    unknown = [key for key in present if key not in _SCALAR_FIELDS and key not in _LIST_FIELDS]
    if unknown:
        raise ValueError(f"attribute has unknown field(s) {', '.join(sorted(unknown))}")
    if len(present) != 1:
        what = "no value" if not present else f"several values ({', '.join(sorted(present))})"
        raise ValueError(
            f"attribute must set exactly one of int, bool, string, version (or a list), has {what}"
        )
    field = present[0]
    raw = obj[field]
    if field in _LIST_FIELDS:
        kind = _LIST_FIELDS[field]
        if not isinstance(raw, list | tuple) or not raw:
            raise ValueError(f"attribute {field}: must be a non-empty list, got {raw!r}")
        return tuple(_scalar(kind, item, where=f"{field}[{i}]") for i, item in enumerate(raw))
    return _scalar(field, raw, where=field)


def device_attribute_from_json(obj: Mapping[str, Any]) -> AttributeValue | UnsupportedAttribute:
    """Decode an attribute as stored in a ResourceSlice, keeping what upstream decodes but cannot use.

    An attribute with no value field, or with a version that is not SemVer, becomes
    :class:`UnsupportedAttribute` (upstream fails the selector evaluation, not the decoding).
    Values of the wrong JSON type still raise ValueError, as the API server would never store them.
    """
    if isinstance(obj, Mapping):
        present = [key for key, val in obj.items() if val is not None]
        if not present:
            return UnsupportedAttribute("unsupported attribute value")
        if present == ["version"] and isinstance(obj["version"], str):
            try:
                return Version(obj["version"])
            except ValueError as exc:
                return UnsupportedAttribute(str(exc))
        if present == ["versions"] and isinstance(obj["versions"], list) and obj["versions"]:
            items = obj["versions"]
            if all(isinstance(v, str) for v in items):
                bad = [v for v in items if _SEMVER_RE.fullmatch(v) is None]
                if bad:
                    return UnsupportedAttribute(f"invalid version {bad[0]!r}")
    return attribute_from_json(obj)


def _scalar_field(value: AttributeScalar) -> tuple[str, object]:
    if isinstance(value, bool):
        return "bool", value
    if isinstance(value, int):
        return "int", value
    if isinstance(value, str):
        return "string", value
    if isinstance(value, Version):
        return "version", value.text
    raise ValueError(f"not an attribute value: {value!r}")


def attribute_to_json(value: AttributeValue) -> dict[str, Any]:
    """Encode an attribute value as a v1 ``DeviceAttribute`` JSON object."""
    if isinstance(value, tuple):
        if not value:
            raise ValueError("a list attribute must not be empty")
        fields = [_scalar_field(item) for item in value]
        kinds = {kind for kind, _ in fields}
        if len(kinds) != 1:
            raise ValueError(f"a list attribute must hold one type, got {', '.join(sorted(kinds))}")
        return {f"{fields[0][0]}s": [raw for _, raw in fields]}
    kind, raw = _scalar_field(value)
    return {kind: raw}


def _scalar_equal(a: AttributeScalar, b: AttributeScalar) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, Version) and isinstance(b, Version):
        return a.compare(b) == 0
    return a == b


def attribute_values_equal(a: AttributeValue, b: AttributeValue) -> bool:
    """Type-strict equality (``True`` is not ``1``); versions compare by SemVer precedence."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        if not (isinstance(a, tuple) and isinstance(b, tuple)) or len(a) != len(b):
            return False
        return all(_scalar_equal(x, y) for x, y in zip(a, b, strict=True))
    return _scalar_equal(a, b)
