"""Writes as the node agent's ServiceAccount, for the tests of its admission policies.

The agent's identity is the real one: a ServiceAccount token from the TokenRequest API bound to a
pod on a node, as the kubelet mounts it into the agent's pod, so the API server puts the node's name
into the caller's user info (``authentication.kubernetes.io/node-name``). The claims are allocated
by the cluster administrator (this test's kubeconfig), as kube-scheduler or the operator would.

On Kubernetes 1.36+ the API server checks claim status writes itself
(DRAResourceClaimGranularStatusAuthorization) before any admission policy runs, so a refused write
carries its message there and the policy's on 1.34 and 1.35; :func:`expected_claim_refusal` says
which to expect.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_devcluster import LocalCluster

GRANULAR_GATE = "DRAResourceClaimGranularStatusAuthorization"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
# What the 1.36+ API server says when its own check refuses a claim status write.
SERVER_DEVICES = 'changing status.devices requires resource="resourceclaims/driver"'
SERVER_BINDING = 'changing status.allocation or status.reservedFor requires resource="resourceclaims/binding"'

Obj = dict[str, Any]


def server_checks_claim_status(cluster: LocalCluster) -> bool:
    """Whether the API server authorizes claim status writes per field (1.36+, gate on)."""
    gates = cluster.feature_gates if cluster.feature_gates is not None else cluster.kubernetes.feature_gates
    return bool(gates.get(GRANULAR_GATE, False))


def probe_pod(*, name: str, namespace: str, account: str, node: str) -> Obj:
    """A pod of ``account`` bound to ``node`` (no kubelet runs it: it only anchors a token)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"accel-dra-test": "token-probe"}},
        "spec": {
            "serviceAccountName": account,
            "nodeName": node,
            "containers": [{"name": "probe", "image": "accel-dra:0.1.0", "command": ["sleep", "infinity"]}],
        },
    }


def pod_bound_kubeconfig(cluster: LocalCluster, *, account: str, namespace: str, pod: str, name: str) -> Path:
    """A kubeconfig with ``account``'s token bound to ``pod`` (and so to the pod's node)."""
    token = cluster.kubectl(
        "create", "token", account, "-n", namespace, "--bound-object-kind=Pod",
        f"--bound-object-name={pod}", "--duration=1h",
    ).stdout.strip()  # fmt: skip
    return cluster.kubeconfig_for_token(token, name=name)


def unbound_kubeconfig(cluster: LocalCluster, *, account: str, namespace: str, name: str) -> Path:
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    return cluster.kubeconfig_for_token(token, name=name)


def as_agent(
    cluster: LocalCluster, kubeconfig: Path, *args: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    # Client-side validation would list CRDs, which the agent may not; the server validates anyway.
    if args and args[0] in ("create", "replace"):
        args = (*args, "--validate=false")
    return cluster.kubectl(*args, input=input, check=False, kubeconfig=kubeconfig)


def resource_slice(name: str, *, node: str, driver: str = "gpu.nvidia.com", pool: str | None = None) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"accel-dra-test": "deploy"}},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        },
    }


def node_selector(node: str) -> Obj:
    """The allocation's node selector for node-local devices, as kube-scheduler writes it."""
    field = {"key": "metadata.name", "operator": "In", "values": [node]}
    return {"nodeSelectorTerms": [{"matchFields": [field]}]}


def allocated_claim(
    cluster: LocalCluster,
    *,
    namespace: str,
    name: str,
    results: Sequence[tuple[str, str, str, str]],
    selector: Obj | None,
    devices: Sequence[Obj] = (),
) -> Obj:
    """A claim with one request per result (request, driver, pool, device), allocated by the
    administrator with ``selector`` and carrying ``devices`` status entries; the claim as stored."""
    requests = [{"name": r[0], "exactly": {"deviceClassName": f"{r[1]}"}} for r in results]
    cluster.apply([{
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": requests}},
    }])  # fmt: skip
    claim: Obj = cluster.get_json("resourceclaim", name, "-n", namespace)
    allocation: Obj = {
        "devices": {
            "results": [{"request": r, "driver": d, "pool": p, "device": dev} for r, d, p, dev in results]
        }
    }
    if selector is not None:
        allocation["nodeSelector"] = selector
    claim["status"] = {"allocation": allocation, **({"devices": list(devices)} if devices else {})}
    written = cluster.kubectl(
        "replace", "--subresource=status", "-f", "-", "-o", "json", input=json.dumps(claim)
    ).stdout
    stored: Obj = json.loads(written)
    return stored


def with_status(claim: Obj, **status: Any) -> Obj:
    """A copy of ``claim`` with these status fields replaced (None removes one)."""
    changed = copy.deepcopy(claim)
    current = changed.setdefault("status", {})
    for key, value in status.items():
        if value is None:
            current.pop(key, None)
        else:
            current[key] = value
    return changed


def device_entry(driver: str, pool: str, device: str, *, ready: str = "True") -> Obj:
    condition = {
        "type": "Ready",
        "status": ready,
        "reason": "Prepared" if ready == "True" else "Unhealthy",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    return {"driver": driver, "pool": pool, "device": device, "conditions": [condition]}


def write_status(cluster: LocalCluster, kubeconfig: Path, claim: Obj) -> subprocess.CompletedProcess[str]:
    """PUT the claim's /status as the caller of ``kubeconfig`` (the agent's write)."""
    return as_agent(
        cluster, kubeconfig, "replace", "--subresource=status", "-f", "-", input=json.dumps(claim)
    )


def expected_claim_refusal(cluster: LocalCluster, *, policy: str, server: str) -> str:
    """What a refused claim status write says: the API server's own check (1.36+) runs first."""
    return server if server_checks_claim_status(cluster) else policy


def refused_once_in_effect(
    cluster: LocalCluster, kubeconfig: Path, args: Sequence[str], body: Obj, *, says: str
) -> subprocess.CompletedProcess[str]:
    """The write refused, saying ``says``. A policy takes effect shortly after it is created, so
    server-side dry runs are tried until one is refused so; then the write itself is made."""

    def refused_dry() -> bool:
        result = as_agent(cluster, kubeconfig, *args, "--dry-run=server", input=json.dumps(body))
        return result.returncode != 0 and says in result.stderr

    cluster.wait_for(refused_dry, timeout=30, interval=0.5, what=f"a refusal saying {says!r}")
    return as_agent(cluster, kubeconfig, *args, input=json.dumps(body))
