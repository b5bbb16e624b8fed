"""Device attributes as KeyedTuple: one key table for many devices, values of their own, read-only."""

from __future__ import annotations

import copy
from types import MappingProxyType
from typing import Any

import pytest

from dra_api.model import KeyedTuple, ResourceSlice, keyed_map
from tests.unit.api.model.test_roundtrip import SLICE_V1


def gpus(count: int) -> ResourceSlice:
    body = copy.deepcopy(SLICE_V1)
    body["spec"]["devices"] = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "model": {"string": "H100"},
                "uuid": {"string": f"GPU-{i}"},
                "index": {"int": i},
            },
        }
        for i in range(count)
    ]
    return ResourceSlice.from_json(body)


def test_siblings_share_the_key_table_and_keep_their_own_values() -> None:
    s = gpus(3)
    a, b = s.devices[0].attributes, s.devices[1].attributes
    assert isinstance(a, KeyedTuple)
    assert isinstance(b, KeyedTuple)
    assert a._index is b._index
    assert a is not b
    assert dict(a) == {"model": "H100", "uuid": "GPU-0", "index": 0}
    assert dict(b) == {"model": "H100", "uuid": "GPU-1", "index": 1}
    assert list(s.devices[2].attributes) == ["model", "uuid", "index"]  # the slice's order
    assert s.to_json()["spec"]["devices"][1]["attributes"]["uuid"] == {"string": "GPU-1"}


def test_a_shared_map_cannot_be_changed_through_one_device() -> None:
    s = gpus(2)
    a: Any = s.devices[0].attributes
    with pytest.raises(TypeError):
        a["uuid"] = "GPU-9"
    with pytest.raises(TypeError):
        a._index["uuid"] = 0  # the shared key table is read-only too
    with pytest.raises(AttributeError):
        a.extra = 1  # slots: no other state to change
    assert s.devices[1].attributes["uuid"] == "GPU-1"


def test_reads_like_a_dict() -> None:
    m = keyed_map({"a": 1, "b": "x"})
    assert m["a"] == 1
    assert m.get("b") == "x"
    assert m.get("c") is None
    assert m.get("c", 5) == 5
    assert "a" in m
    assert "c" not in m
    assert len(m) == 2
    assert list(m.items()) == [("a", 1), ("b", "x")]
    with pytest.raises(KeyError):
        m["c"]
    assert m == {"a": 1, "b": "x"}
    assert m == MappingProxyType({"b": "x", "a": 1})  # order does not matter to equality
    plain = {"a": 1, "b": "x"}
    assert plain == m  # dict.__eq__ gives way to KeyedTuple.__eq__
    assert m != {"a": 1}
    assert m != keyed_map({"b": "x", "a": 2})
    assert keyed_map({}) == {}
    assert repr(m) == "KeyedTuple({'a': 1, 'b': 'x'})"


def test_equal_maps_are_one_but_true_and_one_stay_apart() -> None:
    assert keyed_map({"a": 1, "b": "x"}) is keyed_map({"a": 1, "b": "x"})
    one, true = keyed_map({"a": 1}), keyed_map({"a": True})
    assert one["a"] is not True
    assert true["a"] is True
    assert keyed_map({"a": [1]})["a"] == [1]  # unhashable values are kept, not shared
