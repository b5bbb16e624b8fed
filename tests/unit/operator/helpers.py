"""Plain JSON builders for the operator's unit tests."""

from __future__ import annotations

from typing import Any

GPU = "gpu.nvidia.com"


def claim(
    name: str,
    *,
    count: int = 1,
    cls: str = GPU,
    namespace: str = "ns",
    rv: str = "1",
    owner_pod: bool = False,
    finalizers: list[str] | None = None,
    allocation: dict[str, Any] | None = None,
    config_driver: str | None = None,
    selector: str | None = None,
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "r", "exactly": exactly}]}}
    if config_driver:
        spec["devices"]["config"] = [{"opaque": {"driver": config_driver, "parameters": {"a": 1}}}]
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "resourceVersion": rv,
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "finalizers": finalizers or [],
    }
    if owner_pod:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pod-uid", "controller": True}
        ]
        meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": spec,
    }
    if allocation is not None:
        obj["status"] = {"allocation": allocation}
    return obj


def allocation(node: str, *devices: str, driver: str = GPU) -> dict[str, Any]:
    return {
        "devices": {
            "results": [{"request": "r", "driver": driver, "pool": node, "device": d} for d in devices]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def gpu_class(name: str = GPU, *, rv: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "resourceVersion": rv},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GPU}"'}}]},
    }


def gpu_slice(node: str, count: int, *, rv: str = "1", owner_node: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"{node}-gpu", "resourceVersion": rv, "uid": f"slice-{node}"}
    if owner_node:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": f"node-{node}"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": GPU,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "index": {"int": i}}}
                for i in range(count)
            ],
        },
    }


def node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
    }
