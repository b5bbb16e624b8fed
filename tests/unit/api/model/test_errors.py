"""Bad input is rejected with a one-line message naming the object and the field path."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_api.model import V1, V1BETA1, DeviceClass, ModelError, Node, ResourceClaim, ResourceSlice, from_json


def _claim(requests: list[dict[str, Any]], version: str = V1) -> dict[str, Any]:
    return {
        "apiVersion": version,
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"requests": requests}},
    }


def _message(obj: dict[str, Any], parse: Any = ResourceClaim.from_json) -> str:
    with pytest.raises(ModelError) as info:
        parse(obj)
    text = str(info.value)
    assert "\n" not in text
    return text


def test_v1beta1_field_in_v1_claim() -> None:
    text = _message(_claim([{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]))
    assert text == (
        "ResourceClaim ns/c: spec.devices.requests[0].deviceClassName is a v1beta1 field; "
        "in resource.k8s.io/v1 it belongs under exactly"
    )


def test_v1_field_in_v1beta1_claim() -> None:
    text = _message(_claim([{"name": "gpu", "exactly": {"deviceClassName": "x"}}], V1BETA1))
    assert text.startswith(
        "ResourceClaim ns/c: spec.devices.requests[0].exactly is a resource.k8s.io/v1 field"
    )


def test_request_needs_exactly_or_first_available() -> None:
    assert "must set exactly one of exactly or firstAvailable" in _message(_claim([{"name": "gpu"}]))
    both = {
        "name": "gpu",
        "exactly": {"deviceClassName": "x"},
        "firstAvailable": [{"name": "a", "deviceClassName": "x"}],
    }
    assert "not both" in _message(_claim([both]))


def test_missing_class_name_and_bad_count() -> None:
    assert "spec.devices.requests[0].exactly.deviceClassName: is required" in _message(
        _claim([{"name": "gpu", "exactly": {}}])
    )
    text = _message(_claim([{"name": "gpu", "exactly": {"deviceClassName": "x", "count": 0}}]))
    assert "spec.devices.requests[0].exactly.count: must be greater than zero" in text
    text = _message(_claim([{"name": "gpu", "exactly": {"deviceClassName": "x", "count": "2"}}]))
    assert "count: must be an integer, not string" in text


def test_wrong_types_and_versions() -> None:
    assert "unsupported version" in _message(_claim([], "resource.k8s.io/v2"))
    bad_kind = _claim([]) | {"kind": "Pod"}
    assert "expected ResourceClaim" in _message(bad_kind)
    assert "spec.devices.requests: must be a list, not object" in _message(
        {**_claim([]), "spec": {"devices": {"requests": {}}}}
    )


def test_slice_errors() -> None:
    base: dict[str, Any] = {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {
            "driver": "d",
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "n",
        },
    }
    wrapped = copy.deepcopy(base)
    wrapped["spec"]["devices"] = [{"name": "dev", "basic": {}}]
    assert "ResourceSlice s: spec.devices[0].basic is a v1beta1 field" in _message(
        wrapped, ResourceSlice.from_json
    )
    flat = copy.deepcopy(base) | {"apiVersion": V1BETA1}
    flat["spec"]["devices"] = [{"name": "dev", "attributes": {}}]
    assert "spec.devices[0].attributes is a resource.k8s.io/v1 field" in _message(
        flat, ResourceSlice.from_json
    )
    bad_quantity = copy.deepcopy(base)
    bad_quantity["spec"]["devices"] = [{"name": "dev", "capacity": {"memory": {"value": "lots"}}}]
    assert "spec.devices[0].capacity[memory].value: invalid quantity 'lots'" in _message(
        bad_quantity, ResourceSlice.from_json
    )
    bad_attr = copy.deepcopy(base)
    bad_attr["spec"]["devices"] = [{"name": "dev", "attributes": {"a": {"int": "x"}}}]
    assert "spec.devices[0].attributes[a]" in _message(bad_attr, ResourceSlice.from_json)
    bad_selector = copy.deepcopy(base)
    bad_selector["spec"]["nodeSelector"] = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Near"}]}]
    }
    assert "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].operator" in _message(
        bad_selector, ResourceSlice.from_json
    )


def test_class_and_dispatch_errors() -> None:
    text = _message(
        {
            "apiVersion": V1,
            "kind": "DeviceClass",
            "metadata": {"name": "k"},
            "spec": {"selectors": [{"cel": {}}]},
        },
        DeviceClass.from_json,
    )
    assert text == "DeviceClass k: spec.selectors[0].cel.expression: is required"
    assert "unsupported kind" in _message({"kind": "Pod"}, from_json)


def test_node_selector_matching() -> None:
    from dra_api.model import NodeSelector

    selector = NodeSelector.from_json(
        {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]},
            ]
        }
    )
    assert selector.matches(Node.make("n1", {"zone": "a"}))
    assert selector.matches(Node.make("n2"))
    assert not selector.matches(Node.make("n3", {"zone": "b"}))
    assert not NodeSelector.from_json({"nodeSelectorTerms": [{}]}).matches(Node.make("n1"))


def test_template_paths_and_node() -> None:
    from dra_api.model import ResourceClaimTemplate

    template = {
        "apiVersion": V1,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "count": 1}]}}},
    }
    text = _message(template, ResourceClaimTemplate.from_json)
    assert text.startswith(
        "ResourceClaimTemplate ns/t: spec.spec.devices.requests[0].count is a v1beta1 field"
    )
    node = Node.from_json({"metadata": {"name": "n1", "labels": {"zone": "a"}}})
    assert node == Node.make("n1", {"zone": "a"})
    assert "Node <unnamed>: metadata.name: is required" in _message({"metadata": {}}, Node.from_json)
