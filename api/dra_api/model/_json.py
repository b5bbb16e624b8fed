"""Typed access to JSON objects with error messages that name the object and the field path.

Also holds the interning helpers that keep a large cluster's slices small in memory.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Generic, NoReturn, TypeVar

from dra_api.model.errors import ModelError
from dra_api.quantity import Quantity

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

GROUP = "resource.k8s.io"
V1 = "resource.k8s.io/v1"
V1BETA2 = "resource.k8s.io/v1beta2"
V1BETA1 = "resource.k8s.io/v1beta1"
API_VERSIONS = (V1, V1BETA2, V1BETA1)

EMPTY_MAP: Mapping[Any, Any] = MappingProxyType({})

# Interning caches; bounded so a long-running process cannot grow them without limit.
_CACHE_LIMIT = 200_000
_quantities: dict[str, Quantity] = {}
_maps: dict[int, list[Mapping[Any, Any]]] = {}


def intern(text: str) -> str:
    return sys.intern(text)


def shared_map(items: dict[K, V]) -> Mapping[K, V]:
    """A read-only view of ``items``, shared with every other map of identical content.

    The cache is keyed by hash only (keys cost memory on big clusters); candidates are then compared
    strictly, so True and 1, or "1Gi" and "1073741824", never share a map.
    """
    if not items:
        return EMPTY_MAP
    try:
        key = hash(tuple(items.items()))
    except TypeError:  # unhashable values: do not share
        return MappingProxyType(items)
    bucket = _maps.get(key)
    if bucket is not None:
        for candidate in bucket:
            if _same(candidate, items):
                return candidate
    view: Mapping[K, V] = MappingProxyType(items)
    if bucket is None:
        if len(_maps) >= _CACHE_LIMIT:
            _maps.clear()
        _maps[key] = [view]
    elif len(bucket) < 8:
        bucket.append(view)
    return view


class KeyedTuple(Mapping[K, V], Generic[K, V]):
    """A read-only map that keeps only its values; the table of keys (in order) is shared with every
    other map of the same keys.

    A device's attributes are mostly shared with its siblings but not all (UUID, PCI address), so
    :func:`shared_map` cannot share them whole; a dict per device repeated the keys' hash table for
    every device (about 500 bytes for a GPU's 11 attributes, against 130 for the values alone).
    """

    __slots__ = ("_index", "_values")

    def __init__(self, index: Mapping[K, int], values: tuple[V, ...]) -> None:
        self._index = index
        self._values = values

    def __getitem__(self, key: K) -> V:
        return self._values[self._index[key]]

    def get(self, key: K, default: Any = None) -> Any:
        at = self._index.get(key)
        return default if at is None else self._values[at]

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __iter__(self) -> Iterator[K]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeyedTuple) and other._index is self._index:
            return self._values == other._values
        return Mapping.__eq__(self, other)

    __hash__ = None  # type: ignore[assignment]  # equal to dicts, which are unhashable

    def __repr__(self) -> str:
        return f"KeyedTuple({dict(self.items())!r})"


# Key order -> (the shared key table, the maps of those keys by values). A map whose values are all
# equal to an earlier one's is that map, as shared_map does: devices that differ in nothing share it.
_keyed: dict[tuple[Any, ...], tuple[Mapping[Any, int], dict[tuple[Any, ...], KeyedTuple[Any, Any]]]] = {}
_keyed_count = 0


def keyed_map(items: dict[K, V]) -> Mapping[K, V]:
    """A read-only copy of ``items`` as a :class:`KeyedTuple`: its key table shared by every map of
    the same keys in the same order, and the whole map shared with an identical one (compared as
    strictly as :func:`shared_map` does: True and 1 never share)."""
    global _keyed_count
    if not items:
        return EMPTY_MAP
    keys = tuple(items)
    found = _keyed.get(keys)
    if found is None or _keyed_count >= _CACHE_LIMIT:
        if _keyed_count >= _CACHE_LIMIT:
            _keyed.clear()
            _keyed_count = 0
        found = _keyed[keys] = (MappingProxyType({k: i for i, k in enumerate(keys)}), {})
    index, maps = found
    values = tuple(items.values())
    try:
        same = maps.get(values)
    except TypeError:  # an unhashable value: do not share
        return KeyedTuple(index, values)
    if same is not None:
        return same if _same(same, items) else KeyedTuple(index, values)
    view: KeyedTuple[K, V] = KeyedTuple(index, values)
    maps[values] = view
    _keyed_count += 1
    return view


_SIMPLE = (str, int, bool)
_MISSING = object()


def _same(a: Mapping[Any, Any], b: Mapping[Any, Any]) -> bool:
    if len(a) != len(b):
        return False
    for k, v in b.items():
        w = a.get(k, _MISSING)
        if w is v:
            continue  # the same (interned) object: equal, and its repr too
        if type(w) is not type(v) or w != v:
            return False
        if not isinstance(v, _SIMPLE) and repr(w) != repr(v):
            return False
    return True


class Ctx:
    """Where we are: the object being parsed (for messages) and its API version."""

    __slots__ = ("api_version", "what")

    def __init__(self, *, what: str, api_version: str) -> None:
        self.what = what
        self.api_version = api_version

    @property
    def beta1(self) -> bool:
        return self.api_version == V1BETA1

    def fail(self, path: str, message: str) -> NoReturn:
        raise ModelError(f"{self.what}: {path}: {message}" if path else f"{self.what}: {message}")

    def fail_raw(self, message: str) -> NoReturn:
        raise ModelError(f"{self.what}: {message}")

    # ---- typed getters -----------------------------------------------------------------------

    def get_obj(self, value: Any, path: str) -> Mapping[str, Any]:
        if value is None:
            return EMPTY_MAP
        if not isinstance(value, Mapping):
            self.fail(path, f"must be an object, not {_type_name(value)}")
        return value

    def get_list(self, value: Any, path: str) -> Sequence[Any]:
        if value is None:
            return ()
        if not isinstance(value, list | tuple):
            self.fail(path, f"must be a list, not {_type_name(value)}")
        return value

    def get_str(self, parent: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> str:
        value = parent.get(key)
        if value is None:
            if required:
                self.fail(f"{path}.{key}" if path else key, "is required")
            return ""
        if not isinstance(value, str):
            self.fail(f"{path}.{key}" if path else key, f"must be a string, not {_type_name(value)}")
        if required and not value:
            self.fail(f"{path}.{key}" if path else key, "must not be empty")
        return intern(value)

    def get_opt_str(self, parent: Mapping[str, Any], key: str, path: str) -> str | None:
        if parent.get(key) is None:
            return None
        return self.get_str(parent, key, path)

    def get_int(self, parent: Mapping[str, Any], key: str, path: str, *, default: int | None = None) -> int:
        value = parent.get(key)
        if value is None:
            if default is None:
                self.fail(f"{path}.{key}", "is required")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(f"{path}.{key}", f"must be an integer, not {_type_name(value)}")
        return value

    def get_opt_int(self, parent: Mapping[str, Any], key: str, path: str) -> int | None:
        if parent.get(key) is None:
            return None
        return self.get_int(parent, key, path)

    def get_opt_bool(self, parent: Mapping[str, Any], key: str, path: str) -> bool | None:
        value = parent.get(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            self.fail(f"{path}.{key}", f"must be a boolean, not {_type_name(value)}")
        return value

    def get_bool(self, parent: Mapping[str, Any], key: str, path: str) -> bool:
        return bool(self.get_opt_bool(parent, key, path))

    def str_list(self, parent: Mapping[str, Any], key: str, path: str) -> tuple[str, ...]:
        if parent.get(key) is None:
            return ()  # before building the path: most lists are absent, and slices hold many
        out = []
        for i, item in enumerate(self.get_list(parent.get(key), f"{path}.{key}")):
            if not isinstance(item, str):
                self.fail(f"{path}.{key}[{i}]", f"must be a string, not {_type_name(item)}")
            out.append(intern(item))
        return tuple(out)

    def str_map(self, parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, str]:
        raw = self.get_obj(parent.get(key), f"{path}.{key}")
        out: dict[str, str] = {}
        for k, v in raw.items():
            if not isinstance(v, str):
                self.fail(f"{path}.{key}[{k}]", f"must be a string, not {_type_name(v)}")
            out[intern(k)] = intern(v)
        return shared_map(out)

    def quantity(self, value: Any, path: str) -> Quantity:
        if isinstance(value, bool) or not isinstance(value, str | int):
            self.fail(path, f"must be a quantity string, not {_type_name(value)}")
        text = str(value)
        found = _quantities.get(text)
        if found is None:
            try:
                found = Quantity.parse(text)
            except ValueError as exc:
                self.fail(path, f"invalid quantity {text!r}: {exc}")
            if len(_quantities) >= _CACHE_LIMIT:
                _quantities.clear()
            _quantities[text] = found
        return found

    def items(
        self, parent: Mapping[str, Any], key: str, path: str, parse: Callable[[Mapping[str, Any], str], T]
    ) -> tuple[T, ...]:
        value = parent.get(key)
        if value is None:
            return ()  # before building the path: most lists are absent, and slices hold many
        base = f"{path}.{key}"
        out = []
        for i, item in enumerate(self.get_list(value, base)):
            where = f"{base}[{i}]"
            out.append(parse(self.get_obj(item, where), where))
        return tuple(out)


def _type_name(value: Any) -> str:
    return {
        dict: "object",
        list: "list",
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
    }.get(type(value), type(value).__name__)


def describe(obj: Mapping[str, Any], kind: str) -> str:
    """``Kind namespace/name`` for messages, from an object's metadata."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name: Any = ""
    ns: Any = ""
    if isinstance(meta, Mapping):
        name = meta.get("name") or meta.get("generateName") or ""
        ns = meta.get("namespace") or ""
    if not isinstance(name, str):
        name = "?"
    if not isinstance(ns, str):
        ns = "?"
    ref = f"{ns}/{name}" if ns else (name or "<unnamed>")
    return f"{kind} {ref}"


def check_version(obj: Mapping[str, Any], kind: str, *, default: str = V1) -> Ctx:
    """Validate ``apiVersion`` and ``kind`` of a top-level object and return a parsing context."""
    if not isinstance(obj, Mapping):
        raise ModelError(f"{kind}: must be a JSON object, not {_type_name(obj)}")
    ctx = Ctx(what=describe(obj, kind), api_version=default)
    version = obj.get("apiVersion")
    if version is None:
        version = default
    if version not in API_VERSIONS:
        ctx.fail("apiVersion", f"unsupported version {version!r}; expected one of {', '.join(API_VERSIONS)}")
    actual_kind = obj.get("kind")
    if actual_kind is not None and actual_kind != kind:
        ctx.fail("kind", f"expected {kind}, got {actual_kind!r}")
    ctx.api_version = version
    return ctx


def parameters_text(ctx: Ctx, value: Any, path: str) -> str:
    """Opaque parameters, kept as compact JSON text so the model stays immutable."""
    if not isinstance(value, Mapping):
        ctx.fail(path, f"must be a JSON object, not {_type_name(value)}")
    return json.dumps(value, separators=(",", ":"))


def drop_empty(obj: dict[str, Any]) -> dict[str, Any]:
    """Remove keys whose value is None, an empty list or an empty object (omitempty)."""
    return {k: v for k, v in obj.items() if v is not None and v != [] and v != {}}


def empty_map() -> Mapping[Any, Any]:
    """Default factory for map fields (a shared read-only empty map)."""
    return EMPTY_MAP
