"""A GPU and a NIC of another driver under one PCIe root, on a real kubelet (issue 16).

The agent runs the simulated H100s and the simulated NIC driver (``nic-sim-h100-x4``: NICs under the
roots of GPUs 0, 2, 4 and 6 only). A claim asks for one GPU and one NIC with ``matchAttribute:
resource.kubernetes.io/pcieRoot``: kube-scheduler allocates it for a pod, the operator for a
standalone claim, and both pairs must share a root, as the ResourceSlices and the container's
environment say. A claim no root can satisfy gets the operator's explanation naming the constraint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_devcluster import LocalCluster
from dra_devcluster.images import WORKLOAD_IMAGE
from tests.integration.agent.agentproc import GPU, NIC
from tests.integration.objects import device_class
from tests.integration.operator.conftest import Operators, events_for, install_peering
from tests.integration.operator.objects import CONDITION_ANNOTATION, OPERATOR_FINALIZER

from .conftest import CLASS, NAMESPACE, NODE, NodeWithAgent

AGENT_PROFILES = ("h100-80gb-x8", "nic-sim-h100-x4")  # read by the node_with_agent fixture
NIC_CLASS = "real-node-nic"
ROOT = "resource.kubernetes.io/pcieRoot"
CONSTRAINT = f"constraint (matchAttribute {ROOT} on gpu, nic)"
# GPU 1's root has no NIC (the profile's comment says so); the first root kube-scheduler would try
# after GPU 0's, so a pair that skipped it shows the constraint at work.
NO_NIC_ROOT = "pci0000:3a"
# The GPUs as the container lists them (the driver root's nvidia-smi, which the spec mounts).
COMMAND = "env | grep -E '^DRA_SIM_NIC_' | sort; nvidia-smi -L; echo done; sleep 3600"


@pytest.fixture(scope="module")
def nic_class(node_with_agent: NodeWithAgent) -> Iterator[str]:
    cluster = node_with_agent.cluster
    cluster.apply([device_class(NIC_CLASS, driver=NIC)])
    yield NIC_CLASS
    cluster.kubectl("delete", "deviceclass", NIC_CLASS, "--ignore-not-found", check=False)


def _pair_spec(*, gpu_class: str, gpu_selectors: tuple[str, ...] = ()) -> dict[str, Any]:
    gpu: dict[str, Any] = {"deviceClassName": gpu_class}
    if gpu_selectors:
        gpu["selectors"] = [{"cel": {"expression": e}} for e in gpu_selectors]
    return {
        "devices": {
            "requests": [
                {"name": "gpu", "exactly": gpu},
                {"name": "nic", "exactly": {"deviceClassName": NIC_CLASS}},
            ],
            "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": ROOT}],
        }
    }


def _root_is_not(root: str) -> str:
    domain = 'device.attributes["resource.kubernetes.io"]'
    return f'has({domain}.pcieRoot) && {domain}.pcieRoot != "{root}"'


def _root_is(root: str) -> str:
    domain = 'device.attributes["resource.kubernetes.io"]'
    return f'has({domain}.pcieRoot) && {domain}.pcieRoot == "{root}"'


def _pod(name: str, *, claim: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": WORKLOAD_IMAGE,
                    "command": ["sh", "-c", COMMAND],
                    "resources": {"claims": [{"name": "pair"}]},
                }
            ],
            "resourceClaims": [{"name": "pair", **claim}],
        },
    }


def _slice_attributes(cluster: LocalCluster, driver: str) -> dict[str, dict[str, Any]]:
    """Device name -> attributes, from the node's ResourceSlices of ``driver``."""
    out: dict[str, dict[str, Any]] = {}
    for item in cluster.get_json("resourceslices")["items"]:
        spec = item["spec"]
        if spec.get("nodeName") == NODE and spec["driver"] == driver:
            for device in spec.get("devices") or []:
                out[device["name"]] = device.get("attributes") or {}
    return out


def _allocated_roots(cluster: LocalCluster, claim: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Request -> (device, its pcieRoot in the ResourceSlices) of an allocated claim."""
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["request"] for r in results} == {"gpu", "nic"}, results
    out = {}
    for r in results:
        assert r["driver"] == (GPU if r["request"] == "gpu" else NIC), r
        attributes = _slice_attributes(cluster, r["driver"])[r["device"]]
        out[r["request"]] = (r["device"], attributes[ROOT]["string"])
    return out


def _assert_container_got(log: str, *, nic: str, root: str, gpus: int = 1) -> None:
    lines = log.splitlines()
    assert len([line for line in lines if line.startswith("GPU ")]) == gpus, log
    index = nic.removeprefix("nic-")
    assert f"DRA_SIM_NIC_{index}_PCIE_ROOT={root}" in lines, log
    assert any(line.startswith(f"DRA_SIM_NIC_{index}_IFNAME=") for line in lines), log


def _delete(cluster: LocalCluster, kind: str, name: str) -> None:
    cluster.kubectl(
        "delete", kind, name, "-n", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=90s"
    )


def test_the_agent_publishes_nics_whose_roots_match_some_gpus(node_with_agent: NodeWithAgent) -> None:
    cluster = node_with_agent.cluster
    gpus = cluster.wait_for(lambda: _slice_attributes(cluster, GPU) or None, timeout=60, what="GPU slices")
    nics = cluster.wait_for(lambda: _slice_attributes(cluster, NIC) or None, timeout=60, what="NIC slices")
    gpu_roots = {name: a[ROOT]["string"] for name, a in gpus.items()}
    nic_roots = {a[ROOT]["string"] for a in nics.values()}
    assert sorted(g for g, root in gpu_roots.items() if root in nic_roots) == [
        "gpu-0",
        "gpu-2",
        "gpu-4",
        "gpu-6",
    ]
    assert gpu_roots["gpu-1"] == NO_NIC_ROOT
    # The standard NUMA attribute on both drivers' devices, so numaNode alignment works the same way.
    assert all("resource.kubernetes.io/numaNode" in a for a in [*gpus.values(), *nics.values()])


def test_kube_scheduler_gives_a_pod_a_gpu_and_a_nic_under_one_root(
    node_with_agent: NodeWithAgent, nic_class: str
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    name = "gpu-nic-pair"
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        # Not GPU 0: the first GPU left (GPU 1) has no NIC under its root, so the pair must skip it.
        "spec": {"spec": _pair_spec(gpu_class=CLASS, gpu_selectors=(_root_is_not("pci0000:15"),))},
    }
    cluster.apply([template, _pod(name, claim={"resourceClaimTemplateName": name})])
    try:
        log = setup.wait_log(name, "done", timeout=180)
        claim = setup.claim_of(name)
        roots = _allocated_roots(cluster, claim)
        (gpu, gpu_root), (nic, nic_root) = roots["gpu"], roots["nic"]
        assert gpu_root == nic_root, roots
        assert gpu != "gpu-1", roots
        _assert_container_got(log, nic=nic, root=gpu_root)
        uid = claim["metadata"]["uid"]
        # Each driver prepared its own device: its checkpoint and its CDI spec.
        assert uid in setup.agent.dirs.checkpoint_claims(GPU)
        assert uid in setup.agent.dirs.checkpoint_claims(NIC)
        assert setup.agent.dirs.cdi_spec(uid, NIC).exists()
    finally:
        _delete(cluster, "pod", name)
        _delete(cluster, "resourceclaimtemplate", name)


NUMA = "resource.kubernetes.io/numaNode"


def test_kube_scheduler_puts_four_gpus_and_a_nic_on_one_numa_node(
    node_with_agent: NodeWithAgent, nic_class: str
) -> None:
    """numaNode alignment the same way: the NIC is held to NUMA node 1, so the four GPUs must come
    from node 1 too (GPUs 4-7), where first fit without the constraint would take GPUs 0-3."""
    setup = node_with_agent
    cluster = setup.cluster
    name = "gpu-nic-numa"
    domain = 'device.attributes["resource.kubernetes.io"]'
    spec = {
        "devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": CLASS, "count": 4}},
                {
                    "name": "nic",
                    "exactly": {
                        "deviceClassName": NIC_CLASS,
                        "selectors": [
                            {"cel": {"expression": f"has({domain}.numaNode) && {domain}.numaNode == 1"}}
                        ],
                    },
                },
            ],
            "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": NUMA}],
        }
    }
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": spec},
    }
    cluster.apply([template, _pod(name, claim={"resourceClaimTemplateName": name})])
    try:
        log = setup.wait_log(name, "done", timeout=180)
        results = setup.claim_of(name)["status"]["allocation"]["devices"]["results"]
        gpus = _slice_attributes(cluster, GPU)
        nics = _slice_attributes(cluster, NIC)
        numa = {
            r["device"]: (gpus if r["driver"] == GPU else nics)[r["device"]][NUMA]["int"] for r in results
        }
        assert sorted(d for d in numa if d.startswith("gpu-")) == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"], numa
        assert set(numa.values()) == {1}, numa
        (nic,) = [d for d in numa if d.startswith("nic-")]
        lines = log.splitlines()
        assert len([line for line in lines if line.startswith("GPU ")]) == 4, log
        assert f"DRA_SIM_NIC_{nic.removeprefix('nic-')}_NUMA_NODE=1" in lines, log
    finally:
        _delete(cluster, "pod", name)
        _delete(cluster, "resourceclaimtemplate", name)


@pytest.fixture
def operators(local_cluster: LocalCluster, tmp_path: Path) -> Iterator[Operators]:
    install_peering(local_cluster)
    ops = Operators(
        cluster=local_cluster, workdir=tmp_path, gpu_class="nic-align-gpu", tpu_class="nic-align-tpu"
    )
    yield ops
    ops.stop_all()
    for cls in (ops.gpu_class, ops.tpu_class):
        local_cluster.kubectl("delete", "deviceclass", cls, "--ignore-not-found", "--wait=false", check=False)


def _claim(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def test_the_operator_allocates_a_pair_under_one_root_and_explains_one_that_cannot_be_met(
    node_with_agent: NodeWithAgent, nic_class: str, operators: Operators
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    op = operators.start()
    cluster.wait_for(
        lambda: cluster.kubectl("get", "deviceclass", operators.gpu_class, check=False).returncode == 0,
        timeout=60,
        what="the operator's GPU class",
    )
    fits = _claim(
        "op-pair", _pair_spec(gpu_class=operators.gpu_class, gpu_selectors=(_root_is_not("pci0000:15"),))
    )
    # Only GPU 1 may be taken, and no NIC sits under its root.
    unmet = _claim(
        "op-unmet", _pair_spec(gpu_class=operators.gpu_class, gpu_selectors=(_root_is(NO_NIC_ROOT),))
    )
    cluster.apply([fits, unmet])
    try:

        def allocated() -> dict[str, Any] | None:
            claim: dict[str, Any] = cluster.get_json("resourceclaim", "op-pair", "-n", NAMESPACE)
            return claim if (claim.get("status") or {}).get("allocation") else None

        claim = cluster.wait_for(allocated, timeout=120, what="op-pair allocated by the operator")
        # The operator's allocation, not kube-scheduler's (no pod uses the claim yet).
        assert OPERATOR_FINALIZER in (claim["metadata"].get("finalizers") or []), claim["metadata"]
        roots = _allocated_roots(cluster, claim)
        (gpu, gpu_root), (nic, nic_root) = roots["gpu"], roots["nic"]
        assert gpu_root == nic_root, roots
        assert gpu not in ("gpu-0", "gpu-1"), roots  # excluded by the selector; no NIC under its root
        # A pod using the operator's claim runs with both devices prepared by the agent.
        cluster.apply([_pod("op-pair-user", claim={"resourceClaimName": "op-pair"})])
        log = setup.wait_log("op-pair-user", "done", timeout=180)
        _assert_container_got(log, nic=nic, root=gpu_root)

        def explained() -> list[dict[str, Any]] | None:
            found = [e for e in events_for(cluster, NAMESPACE, "op-unmet") if e["type"] == "Warning"]
            return found or None

        (event, *_) = cluster.wait_for(explained, timeout=120, what="the operator's Event on op-unmet")
        message = event["message"]
        assert event["reason"] == "NoFit", event
        # Refused by the feasibility check before any search, with the values each request had.
        assert f"devices sharing one value under {CONSTRAINT}; no value has that many" in message, message
        assert f": usable {ROOT} values: request gpu: {NO_NIC_ROOT} (1); request nic: " in message, message
        assert "no one value has enough for every request" in message, message
        unmet_now = cluster.get_json("resourceclaim", "op-unmet", "-n", NAMESPACE)
        assert not (unmet_now.get("status") or {}).get("allocation")
        condition = json.loads(unmet_now["metadata"]["annotations"][CONDITION_ANNOTATION])
        assert CONSTRAINT in condition["message"], condition
        assert op.proc.poll() is None, op.log_tail()
    finally:
        # While the operator runs: it removes its finalizer when the claim goes.
        _delete(cluster, "pod", "op-pair-user")
        _delete(cluster, "resourceclaim", "op-pair")
        _delete(cluster, "resourceclaim", "op-unmet")
