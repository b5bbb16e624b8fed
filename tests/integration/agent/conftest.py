"""Fixtures for the node agent against the real control plane: a Node, its folders, the agent process."""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_devcluster import LocalCluster

from .agentproc import GPU, TPU, AgentDirs, AgentProcess, agent_kubeconfig

GPU_CLASS = "agent-test-gpu"
TPU_CLASS = "agent-test-tpu"


@pytest.fixture(scope="session")
def agent_credentials(local_cluster: LocalCluster) -> Path:
    return agent_kubeconfig(local_cluster)


@pytest.fixture(scope="session")
def device_classes(local_cluster: LocalCluster) -> tuple[str, str]:
    local_cluster.apply(
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
            }
            for name, driver in ((GPU_CLASS, GPU), (TPU_CLASS, TPU))
        ]
    )
    return GPU_CLASS, TPU_CLASS


@pytest.fixture
def node(local_cluster: LocalCluster) -> Iterator[str]:
    name = f"agent-{secrets.token_hex(3)}"
    local_cluster.add_node(name)
    yield name
    local_cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")


@pytest.fixture
def namespace(local_cluster: LocalCluster) -> Iterator[str]:
    name = f"agent-{secrets.token_hex(3)}"
    local_cluster.create_namespace(name)
    yield name
    local_cluster.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")


@pytest.fixture
def dirs() -> Iterator[AgentDirs]:
    # pytest's tmp_path can exceed the 107-byte unix socket path limit; /tmp/<short> cannot.
    root = Path(tempfile.mkdtemp(prefix="dra-ag-", dir="/tmp"))
    folders = AgentDirs(root=root)
    folders.create()
    yield folders
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def agent(node: str, dirs: AgentDirs, agent_credentials: Path) -> Iterator[AgentProcess]:
    proc = AgentProcess(node=node, dirs=dirs, kubeconfig=agent_credentials)
    yield proc
    proc.kill()
    # Captured output is shown only when the test failed.
    print(f"agent log ({proc.log_path}):\n{proc.log_tail(200)}")


def node_slices(cluster: LocalCluster, node: str, driver: str = GPU) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json(
        "resourceslices", f"--field-selector=spec.nodeName={node},spec.driver={driver}"
    )["items"]
    return sorted(items, key=lambda s: s["metadata"]["name"])


def wait_slices(
    cluster: LocalCluster, node: str, *, driver: str = GPU, count: int = 1, timeout: float = 60
) -> list[dict[str, Any]]:
    def ready() -> list[dict[str, Any]] | None:
        items = node_slices(cluster, node, driver)
        return items if len(items) == count else None

    result: list[dict[str, Any]] = cluster.wait_for(
        ready, timeout=timeout, what=f"{count} ResourceSlices of {driver} on {node}"
    )
    return result


def gpu_pod(
    *, name: str, node: str, device_class: str = GPU_CLASS, count: int = 1, claim_name: str | None = None
) -> list[dict[str, Any]]:
    """A pod pinned to ``node`` with one claim of ``count`` devices (from a template unless named)."""
    template = f"{name}-tmpl"
    objects: list[dict[str, Any]] = []
    claim_ref: dict[str, Any]
    if claim_name is None:
        objects.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": template},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": count}}
                            ]
                        }
                    }
                },
            }
        )
        claim_ref = {"name": "gpu", "resourceClaimTemplateName": template}
    else:
        claim_ref = {"name": "gpu", "resourceClaimName": claim_name}
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/sleep:1",
                        "command": ["sleep", "infinity"],
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "resourceClaims": [claim_ref],
                # Nodes here have no kubelet: the node controller soon taints them not-ready or
                # unreachable. The pods only need to be scheduled, never run.
                "tolerations": [{"operator": "Exists"}],
            },
        }
    )
    return objects


def standalone_claim(*, name: str, device_class: str = GPU_CLASS, cel: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if cel is not None:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def apply_in(cluster: LocalCluster, namespace: str, objects: list[dict[str, Any]]) -> None:
    import yaml

    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(objects))


def wait_allocated_claim(
    cluster: LocalCluster, namespace: str, pod: str, *, timeout: float = 90
) -> dict[str, Any]:
    """The pod's claim once kube-scheduler allocated and reserved it and bound the pod."""

    def ready() -> dict[str, Any] | None:
        pod_obj = cluster.get_json("pod", pod, "-n", namespace)
        statuses = pod_obj.get("status", {}).get("resourceClaimStatuses") or []
        name = statuses[0].get("resourceClaimName") if statuses else None
        if name is None:
            claims = pod_obj["spec"].get("resourceClaims") or []
            name = claims[0].get("resourceClaimName") if claims else None
        if not name or not pod_obj["spec"].get("nodeName"):
            return None
        claim: dict[str, Any] = cluster.get_json("resourceclaim", name, "-n", namespace)
        status = claim.get("status", {})
        if not status.get("allocation") or not status.get("reservedFor"):
            return None
        return claim

    result: dict[str, Any] = cluster.wait_for(
        ready, timeout=timeout, what=f"pod {namespace}/{pod} bound with its claim allocated"
    )
    return result


def wait_until(predicate: Any, *, timeout: float = 30, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
