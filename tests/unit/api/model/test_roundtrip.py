"""v1 / v1beta2 / v1beta1 parsing and serialisation of the resource.k8s.io kinds."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_api.attributes import UnsupportedAttribute, Version
from dra_api.model import (
    V1,
    V1BETA1,
    V1BETA2,
    AllocationResult,
    DeviceClass,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
    from_json,
)
from dra_api.quantity import Quantity

SLICE_V1: dict[str, Any] = {
    "apiVersion": V1,
    "kind": "ResourceSlice",
    "metadata": {"name": "node-1-gpu", "uid": "u1", "resourceVersion": "7"},
    "spec": {
        "driver": "gpu.nvidia.com",
        "pool": {"name": "node-1", "generation": 3, "resourceSliceCount": 1},
        "nodeName": "node-1",
        "devices": [
            {
                "name": "gpu-0",
                "attributes": {
                    "index": {"int": 0},
                    "productName": {"string": "NVIDIA H100"},
                    "driverVersion": {"version": "550.54.15"},
                    "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
                },
                "capacity": {
                    "memory": {"value": "80Gi"},
                    "cores": {
                        "value": "100",
                        "requestPolicy": {
                            "default": "10",
                            "validRange": {"min": "10", "max": "100", "step": "10"},
                        },
                    },
                },
                "taints": [{"key": "unhealthy", "value": "xid-79", "effect": "NoSchedule"}],
                "allowMultipleAllocations": True,
                "bindingConditions": ["Attached"],
                "bindingFailureConditions": ["AttachFailed"],
                "bindsToNode": True,
                "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}],
            },
            {"name": "gpu-1", "attributes": {"empty": {}}},
        ],
    },
}

CLAIM_V1: dict[str, Any] = {
    "apiVersion": V1,
    "kind": "ResourceClaim",
    "metadata": {"name": "c", "namespace": "ns", "uid": "u2", "finalizers": ["dra.accel.dev/allocation"]},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.nvidia.com",
                        "selectors": [
                            {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].index == 0'}}
                        ],
                        "allocationMode": "ExactCount",
                        "count": 2,
                        "adminAccess": False,
                        "tolerations": [{"key": "unhealthy", "operator": "Exists", "effect": "NoSchedule"}],
                        "capacity": {"requests": {"cores": "20"}},
                    },
                },
                {
                    "name": "any",
                    "firstAvailable": [
                        {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 1},
                        {"name": "all", "deviceClassName": "mig.nvidia.com", "allocationMode": "All"},
                    ],
                },
            ],
            "constraints": [{"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
            "config": [
                {"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"a": [1, 2]}}}
            ],
        }
    },
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": "gpu.nvidia.com",
                        "pool": "node-1",
                        "device": "gpu-0",
                        "shareID": "0b6c2a6e-43f3-4d53-9bd6-3d5f0b1c9a10",
                        "consumedCapacity": {"cores": "20"},
                    }
                ],
                "config": [{"source": "FromClass", "opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}],
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
                ]
            },
            "allocationTimestamp": "2026-01-01T00:00:00Z",
        },
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u3"}],
        "devices": [
            {
                "driver": "gpu.nvidia.com",
                "pool": "node-1",
                "device": "gpu-0",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        ],
    },
}


def _to_beta1_slice(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["apiVersion"] = V1BETA1
    out["spec"]["devices"] = [
        {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
        for d in out["spec"]["devices"]
    ]
    return out


def _to_beta1_claim(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["apiVersion"] = V1BETA1
    for request in out["spec"]["devices"]["requests"]:
        request.update(request.pop("exactly", {}))
    return out


def test_slice_v1_parse() -> None:
    s = ResourceSlice.from_json(SLICE_V1)
    assert s.driver == "gpu.nvidia.com"
    assert s.pool.generation == 3
    gpu = s.devices[0]
    assert gpu.attributes["index"] == 0
    assert gpu.attributes["driverVersion"] == Version("550.54.15")
    assert gpu.capacity["memory"].value == Quantity.parse("80Gi")
    policy = gpu.capacity["cores"].request_policy
    assert policy is not None
    assert policy.valid_range is not None
    assert policy.valid_range.step == Quantity.parse("10")
    assert gpu.taints[0].effect == "NoSchedule"
    assert gpu.allow_multiple_allocations
    assert gpu.binds_to_node
    assert gpu.consumes_counters[0].counter_set == "gpu-0"
    assert isinstance(s.devices[1].attributes["empty"], UnsupportedAttribute)


@pytest.mark.parametrize("version", [V1, V1BETA2, V1BETA1])
def test_slice_round_trip(version: str) -> None:
    s = ResourceSlice.from_json(SLICE_V1)
    encoded = s.to_json(version)
    assert encoded["apiVersion"] == version
    if version == V1BETA1:
        assert "basic" in encoded["spec"]["devices"][0]
        assert encoded == _to_beta1_slice(SLICE_V1) | {"metadata": encoded["metadata"]}
    else:
        assert encoded["spec"] == SLICE_V1["spec"]
    assert ResourceSlice.from_json(encoded) == s


def test_slice_v1beta1_parses_basic() -> None:
    assert ResourceSlice.from_json(_to_beta1_slice(SLICE_V1)) == ResourceSlice.from_json(SLICE_V1)


@pytest.mark.parametrize("version", [V1, V1BETA2, V1BETA1])
def test_claim_round_trip(version: str) -> None:
    claim = ResourceClaim.from_json(CLAIM_V1)
    encoded = claim.to_json(version)
    if version == V1BETA1:
        assert encoded["spec"]["devices"]["requests"][0]["deviceClassName"] == "gpu.nvidia.com"
        assert "exactly" not in encoded["spec"]["devices"]["requests"][0]
    else:
        assert encoded["spec"] == CLAIM_V1["spec"]
        assert encoded["status"] == CLAIM_V1["status"]
    assert ResourceClaim.from_json(encoded) == claim


def test_claim_v1beta1_flat_requests() -> None:
    beta = ResourceClaim.from_json(_to_beta1_claim(CLAIM_V1))
    assert beta == ResourceClaim.from_json(CLAIM_V1)
    request = beta.spec.requests[0]
    assert request.exactly is not None
    assert request.exactly.count == 2
    assert request.exactly.capacity == {"cores": Quantity.parse("20")}
    assert [s.name for s in beta.spec.requests[1].first_available] == ["big", "all"]


def test_claim_fields() -> None:
    claim = ResourceClaim.from_json(CLAIM_V1)
    assert claim.ref == "ns/c"
    allocation = claim.status.allocation
    assert allocation is not None
    assert allocation.devices[0].consumed_capacity == {"cores": Quantity.parse("20")}
    assert allocation.node_selector is not None
    assert claim.status.reserved_for[0].uid == "u3"
    assert claim.spec.config[0].opaque is not None
    assert claim.spec.config[0].opaque.parameters == {"a": [1, 2]}
    assert AllocationResult.from_json(allocation.to_json()) == allocation


def test_template_and_class_round_trip() -> None:
    template_json = {
        "apiVersion": V1BETA2,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"metadata": {"labels": {"a": "b"}}, "spec": copy.deepcopy(CLAIM_V1["spec"])},
    }
    template = ResourceClaimTemplate.from_json(template_json)
    assert template.claim_labels == {"a": "b"}
    assert template.to_json(V1BETA2) == template_json
    class_json = {
        "apiVersion": V1,
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {
            "selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}],
            "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"x": 1}}}],
        },
    }
    device_class = DeviceClass.from_json(class_json)
    assert device_class.selectors[0].cel == 'device.driver == "gpu.nvidia.com"'
    assert device_class.to_json() == class_json
    assert isinstance(from_json(class_json), DeviceClass)


def test_identical_maps_are_shared() -> None:
    body = copy.deepcopy(SLICE_V1)
    body["spec"]["devices"] = [
        {
            "name": f"gpu-{i}",
            "attributes": {"model": {"string": "H100"}},
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i in range(3)
    ]
    s = ResourceSlice.from_json(body)
    assert s.devices[0].attributes is s.devices[2].attributes
    assert s.devices[0].capacity is s.devices[1].capacity


def test_maps_are_not_shared_across_types() -> None:
    body = copy.deepcopy(SLICE_V1)
    body["spec"]["devices"] = [
        {"name": "a", "attributes": {"x": {"int": 1}}},
        {"name": "b", "attributes": {"x": {"bool": True}}},
        {"name": "c", "capacity": {"m": {"value": "1Gi"}}},
        {"name": "d", "capacity": {"m": {"value": "1073741824"}}},
    ]
    s = ResourceSlice.from_json(body)
    assert s.devices[0].attributes["x"] is not True
    assert s.devices[1].attributes["x"] is True
    assert s.to_json()["spec"]["devices"] == body["spec"]["devices"]


def test_list_values_keep_their_types() -> None:
    body = copy.deepcopy(SLICE_V1)
    body["spec"]["devices"] = [
        {"name": "a", "attributes": {"x": {"ints": [1]}, "y": {"string": "s"}}},
        {"name": "b", "attributes": {"x": {"bools": [True]}, "y": {"string": "s"}}},
    ]
    s = ResourceSlice.from_json(body)
    assert s.devices[1].attributes["x"][0] is True  # type: ignore[index]
    assert s.to_json()["spec"]["devices"] == body["spec"]["devices"]


def test_fields_of_1_37_round_trip() -> None:
    body = copy.deepcopy(SLICE_V1)
    body["spec"]["skipNodeOperations"] = ["*"]
    body["spec"]["devices"][0]["consumesCounters"][0]["compatibilityGroups"] = ["mig", "vgpu"]
    parsed = ResourceSlice.from_json(body)
    assert parsed.skip_node_operations == ("*",)
    assert parsed.devices[0].consumes_counters[0].compatibility_groups == ("mig", "vgpu")
    assert ResourceSlice.from_json(parsed.to_json()) == parsed
    assert parsed.to_json()["spec"]["skipNodeOperations"] == ["*"]
    claim = ResourceClaim.from_json(
        {
            "apiVersion": V1,
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "r",
                            "firstAvailable": [
                                {
                                    "name": "s",
                                    "deviceClassName": "gpu",
                                    "derivedAttributes": [{"name": "x/numa", "expression": "1"}],
                                }
                            ],
                        }
                    ]
                }
            },
        }
    )
    assert claim.spec.requests[0].first_available[0].spec.derived_attributes[0].expression == "1"
    assert ResourceClaim.from_json(claim.to_json()) == claim
    allocation = AllocationResult.from_json(
        {
            "devices": {
                "results": [
                    {"request": "r", "driver": "d", "pool": "p", "device": "x", "skipNodeOperations": ["*"]}
                ]
            }
        }
    )
    assert allocation.devices[0].skip_node_operations == ("*",)
    assert AllocationResult.from_json(allocation.to_json()) == allocation
