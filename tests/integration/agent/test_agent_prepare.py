"""kube-scheduler allocates from the agent's slices; the kubelet client prepares and unprepares the claim."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_api.kubeletapi.model import ClaimRef, DRAVersion
from dra_devcluster import LocalCluster
from dra_devcluster.kubelet import KubeletPluginClient

from .agentproc import GPU, AgentProcess
from .conftest import apply_in, gpu_pod, node_slices, wait_allocated_claim, wait_slices

pytestmark = pytest.mark.cluster


def claim_ref(claim: dict[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    env = spec.get("containerEdits", {}).get("env", [])
    return dict(entry.split("=", 1) for entry in env)


@pytest.mark.parametrize(("version", "count"), [("v1", 1), ("v1beta1", 2)])
async def test_scheduler_allocates_and_kubelet_prepares(
    local_cluster: LocalCluster,
    agent: AgentProcess,
    node: str,
    namespace: str,
    device_classes: tuple[str, str],
    version: DRAVersion,
    count: int,
) -> None:
    agent.start()
    (published,) = wait_slices(local_cluster, node)
    uuids = {d["name"]: d["attributes"]["uuid"]["string"] for d in published["spec"]["devices"]}
    apply_in(local_cluster, namespace, gpu_pod(name="work", node=node, count=count))
    claim = wait_allocated_claim(local_cluster, namespace, "work")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == count
    assert {(r["driver"], r["pool"]) for r in results} == {(GPU, node)}
    allocated = [r["device"] for r in results]

    ref = claim_ref(claim)
    async with await KubeletPluginClient.register_driver(
        agent.dirs.registry, driver=GPU, version=version
    ) as kubelet:
        assert kubelet.version == version
        prepared = (await kubelet.prepare([ref]))[ref.uid]
        assert prepared.error == ""
        assert [d.device for d in prepared.devices] == allocated
        assert all(d.pool == node and d.requests == ("gpu",) for d in prepared.devices)
        ids = [i for d in prepared.devices for i in d.cdi_device_ids]
        assert ids == [f"k8s.{GPU}/claim={ref.uid}-{name}" for name in allocated]

        spec_path = agent.dirs.cdi_spec(ref.uid)
        spec = json.loads(spec_path.read_text())
        assert spec["kind"] == f"k8s.{GPU}/claim"
        assert [d["name"] for d in spec["devices"]] == [f"{ref.uid}-{name}" for name in allocated]
        env = env_of(spec)
        # The devices are the spec's, by UUID; the variable only tells an NVIDIA runtime to add none.
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
        per_device = [e.split("=", 1) for d in spec["devices"] for e in d["containerEdits"].get("env", [])]
        simulated = [v for k, v in per_device if k.startswith("DRA_SIMULATED_DEVICE_")]
        assert sorted(simulated) == sorted(uuids[name] for name in allocated)
        claims = agent.dirs.checkpoint_claims()
        assert list(claims) == [ref.uid]
        assert claims[ref.uid]["state"] == "PrepareCompleted"

        assert await kubelet.unprepare([ref]) == {ref.uid: ""}
        assert not spec_path.exists()
        assert agent.dirs.checkpoint_claims() == {}
    # Nothing about the slices changed through all this.
    (after,) = node_slices(local_cluster, node)
    assert after["metadata"]["resourceVersion"] == published["metadata"]["resourceVersion"]


async def test_prepare_of_a_claim_without_allocation_fails_for_that_claim_only(
    local_cluster: LocalCluster, agent: AgentProcess, node: str, namespace: str
) -> None:
    agent.start()
    local_cluster.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "pending"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
            }
        ),
    )
    claim = local_cluster.get_json("resourceclaim", "pending", "-n", namespace)
    ref = claim_ref(claim)
    gone = ClaimRef(namespace=namespace, name="never-existed", uid="0b0c3f43-1111-4c1c-9d7f-1d4f2c2a0000")
    async with await KubeletPluginClient.register_driver(agent.dirs.registry, driver=GPU) as kubelet:
        results = await kubelet.prepare([ref, gone])
    assert "not allocated" in results[ref.uid].error
    assert "not found" in results[gone.uid].error
    assert not agent.dirs.checkpoint(GPU).exists() or agent.dirs.checkpoint_claims() == {}
