"""Claims, pods and nodes the operator tests publish."""

from __future__ import annotations

from typing import Any

from dra_devcluster import LocalCluster
from tests.integration.objects import gpu_devices, resource_slice

OPERATOR_FINALIZER = "dra.accel.dev/allocation"
CONDITION_ANNOTATION = "dra.accel.dev/condition"


def claim(
    name: str,
    namespace: str,
    *,
    cls: str,
    count: int = 1,
    selectors: list[str] | None = None,
    config_driver: str | None = None,
    extra_requests: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}, *(extra_requests or [])]}
    if config_driver:
        devices["config"] = [{"opaque": {"driver": config_driver, "parameters": {"mode": "x"}}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": devices},
    }


def claim_template(name: str, namespace: str, *, cls: str, count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": cls, "count": count}}]
                }
            }
        },
    }


def pod(
    name: str,
    namespace: str,
    *,
    claim_name: str | None = None,
    template: str | None = None,
    gated: bool = False,
) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": "gpu"}
    if claim_name:
        ref["resourceClaimName"] = claim_name
    if template:
        ref["resourceClaimTemplateName"] = template
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/sleep:1",
                    "command": ["sleep", "infinity"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [ref],
            "terminationGracePeriodSeconds": 0,
        },
    }
    if gated:
        # kube-scheduler leaves a gated pod alone (and so its claims); the claim controller does not.
        obj["spec"]["schedulingGates"] = [{"name": "dra.accel.dev/test-gate"}]
    return obj


def ungate(cluster: LocalCluster, namespace: str, name: str) -> None:
    cluster.kubectl(
        "patch",
        "pod",
        name,
        "-n",
        namespace,
        "--type=json",
        "-p",
        '[{"op": "remove", "path": "/spec/schedulingGates"}]',
    )


def add_gpu_node(cluster: LocalCluster, scratch: list[tuple[str, ...]], node: str, gpus: int) -> None:
    cluster.add_node(node)
    scratch.append(("node", node))
    cluster.apply([resource_slice(driver="gpu.nvidia.com", node=node, devices=gpu_devices(gpus, node=node))])
    scratch.append(("resourceslice", f"{node}-gpu.nvidia.com"))


def allocated_node(claim_obj: dict[str, Any]) -> str | None:
    allocation = (claim_obj.get("status") or {}).get("allocation")
    if not allocation:
        return None
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for f in term.get("matchFields") or []:
            if f["key"] == "metadata.name":
                return str(f["values"][0])
    return None
