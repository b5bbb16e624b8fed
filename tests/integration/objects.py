"""Builders for the plain API objects integration tests publish by hand (classes, slices, pods)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Obj = dict[str, Any]


def device_class(name: str, *, driver: str, extra_cel: Sequence[str] = ()) -> Obj:
    selectors = [{"cel": {"expression": f'device.driver == "{driver}"'}}]
    selectors += [{"cel": {"expression": e}} for e in extra_cel]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": selectors},
    }


def gpu_devices(count: int, *, node: str) -> list[Obj]:
    return [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "uuid": {"string": f"GPU-{node}-{i:04d}"},
                "index": {"int": i},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i in range(count)
    ]


def tpu_devices(count: int) -> list[Obj]:
    return [
        {
            "name": f"accel{i}",
            "attributes": {"index": {"int": i}, "tpuGen": {"string": "v6e"}},
            "capacity": {"hbm": {"value": "32Gi"}},
        }
        for i in range(count)
    ]


def resource_slice(*, driver: str, node: str, devices: list[Obj]) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def pod_spec(*, claim_name: str, template: str, tolerations: Sequence[Mapping[str, str]] = ()) -> Obj:
    return {
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/sleep:1",
                "command": ["sleep", "infinity"],
                "resources": {"claims": [{"name": claim_name}]},
            }
        ],
        "resourceClaims": [{"name": claim_name, "resourceClaimTemplateName": template}],
        "tolerations": [dict(t) for t in tolerations],
    }
