"""Small builders of resource.k8s.io JSON objects for the planner and simulate tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dra_api.model import AllocationResult, DeviceClass, Node, ResourceClaim, ResourceSlice
from dra_operator.allocator import FeatureGates
from dra_operator.planner import NotPlaced, Planned, Planner

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


def make_planner(
    slices: Iterable[dict[str, Any]],
    *,
    nodes: Iterable[str] | None = None,
    classes: Iterable[dict[str, Any]] = (),
    allocated: Iterable[dict[str, Any]] = (),
    policy: str = "first-fit",
    labels: dict[str, dict[str, str]] | None = None,
    gates: FeatureGates | None = None,
    feasibility: bool = True,
) -> Planner:
    parsed = [ResourceSlice.from_json(s) for s in slices]
    names = list(nodes) if nodes is not None else sorted({s.node_name for s in parsed if s.node_name})
    return Planner(
        classes=[DeviceClass.from_json(c) for c in (list(classes) or [device_class()])],
        slices=parsed,
        nodes=[Node.make(n, (labels or {}).get(n)) for n in names],
        allocated=[AllocationResult.from_json(a) for a in allocated],
        policy=policy,
        gates=gates,
        feasibility=feasibility,
    )


def rc(name: str, *requests: dict[str, Any], **kwargs: Any) -> ResourceClaim:
    return ResourceClaim.from_json(claim(name, *requests, **kwargs))


def placed(outcome: object) -> Planned:
    assert isinstance(outcome, Planned), outcome
    return outcome


def not_placed(outcome: object) -> NotPlaced:
    assert isinstance(outcome, NotPlaced), outcome
    return outcome


def devices_of(outcome: Planned, i: int = 0) -> list[str]:
    return [f"{r.pool}/{r.device}" for r in outcome.allocations[i].devices]
