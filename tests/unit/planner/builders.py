"""Small builders of resource.k8s.io JSON objects for the planner and simulate tests."""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.nvidia.com"
V1 = "resource.k8s.io/v1"


def device_class(name: str = DRIVER, *selectors: str) -> dict[str, Any]:
    exprs = selectors or (f'device.driver == "{DRIVER}"',)
    return {
        "apiVersion": V1,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in exprs]},
    }


def gpu(name: str, *, product: str = "H100", memory: str = "80Gi", root: str = "pci0") -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {
            "productName": {"string": product},
            "resource.kubernetes.io/pcieRoot": {"string": root},
        },
        "capacity": {"memory": {"value": memory}},
    }


def node_slice(node: str, devices: list[dict[str, Any]], *, generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def shared_slice(pool: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{pool}-shared"},
        "spec": {
            "driver": DRIVER,
            "allNodes": True,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def gpus(node: str, count: int, **kwargs: Any) -> list[dict[str, Any]]:
    return [gpu(f"gpu-{i}", **kwargs) for i in range(count)]


def claim(
    name: str,
    *requests: dict[str, Any],
    namespace: str = "default",
    constraints: list[dict[str, Any]] | None = None,
    allocation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": V1,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": list(requests) or [request()]}},
    }
    if constraints:
        obj["spec"]["devices"]["constraints"] = constraints
    if allocation is not None:
        obj["status"] = {"allocation": allocation}
    return obj


def request(
    name: str = "gpu",
    *,
    count: int | None = None,
    cls: str = DRIVER,
    selectors: tuple[str, ...] = (),
    mode: str | None = None,
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if count is not None:
        exactly["count"] = count
    if mode is not None:
        exactly["allocationMode"] = mode
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": exactly}


def allocation(node: str, *devices: str, request_name: str = "gpu") -> dict[str, Any]:
    return {
        "devices": {
            "results": [
                {"request": request_name, "driver": DRIVER, "pool": node, "device": d} for d in devices
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
