"""The agent's compute-domain driver as a process on a simulated GB200 tray (real control plane):
it registers its own plugin socket, publishes its own ResourceSlice (channel-0, daemon-0) beside the
GPU driver's, and labels its node with the NVLink clique, through the component's RBAC and under its
admission policy, which lets an agent's node-bound token label its own node only."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dra_api import computedomains as cd
from dra_api.kube import make_api_client
from dra_devcluster import LocalCluster
from dra_node_agent.nvidia.cd_api import ApiUnavailable, DomainApi

from .agentproc import AgentDirs, AgentProcess, agent_kubeconfig
from .conftest import wait_slices, wait_until

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[3]
COMPONENT = REPO / "manifests" / "optional" / "compute-domains"
GB200_CLIQUE = "6b9e5f0a-1c2d-4e3f-8a7b-9c0d1e2f3a4b.1"


async def _label_other_node(kubeconfig: Path, *, other: str) -> None:
    client = await make_api_client(kubeconfig=kubeconfig)
    api = DomainApi(api=client, node_name=other, namespace="accel-dra", request_timeout=10.0)
    try:
        await api.set_node_label(cd.GPU_CLIQUE_LABEL, "forged")
    finally:
        await api.aclose()
        await client.close()


def test_the_driver_publishes_its_slice_and_labels_only_its_own_node(
    local_cluster: LocalCluster, node: str, dirs: AgentDirs
) -> None:
    local_cluster.kubectl("apply", "-k", str(REPO / "crds"))
    local_cluster.kubectl(
        "wait", "--for=condition=Established", "crd/computedomains.resource.nvidia.com", "--timeout=60s"
    )
    kubeconfig = agent_kubeconfig(local_cluster, bound_node=node)
    for name in ("node-agent-rbac.yaml", "node-label-policy.yaml"):
        local_cluster.apply((COMPONENT / name).read_text())
    agent = AgentProcess(
        node=node,
        dirs=dirs,
        kubeconfig=kubeconfig,
        profiles=("gb200-nvl-x4",),
        extra_env={"DRA_AGENT_COMPUTE_DOMAINS": "true"},
    )
    try:
        agent.start()
        wait_until(
            lambda: agent.dirs.registration_socket(cd.DRIVER).exists(),
            timeout=60,
            what="the compute-domain driver's registration socket",
        )
        (slice_obj,) = wait_slices(local_cluster, node, driver=cd.DRIVER)
        devices = {d["name"]: d["attributes"] for d in slice_obj["spec"]["devices"]}
        assert devices == {
            cd.CHANNEL_DEVICE: {"type": {"string": "channel"}, "id": {"int": 0}},
            cd.DAEMON_DEVICE: {"type": {"string": "daemon"}, "id": {"int": 0}},
        }
        assert slice_obj["spec"]["pool"]["name"] == node

        def labelled() -> bool:
            labels = local_cluster.get_json("node", node)["metadata"].get("labels") or {}
            return bool(labels.get(cd.GPU_CLIQUE_LABEL) == GB200_CLIQUE)

        wait_until(labelled, timeout=60, what="the node's nvidia.com/gpu.clique label")

        # The same token cannot label another node (the admission policy), whatever RBAC allows.
        other = f"{node}-other"
        local_cluster.add_node(other)
        try:
            with pytest.raises(ApiUnavailable, match="403"):
                asyncio.run(_label_other_node(kubeconfig, other=other))
            labels = local_cluster.get_json("node", other)["metadata"].get("labels") or {}
            assert cd.GPU_CLIQUE_LABEL not in labels
        finally:
            local_cluster.kubectl("delete", "node", other, "--ignore-not-found", "--wait=false")
    finally:
        agent.kill()
        print(f"agent log ({agent.log_path}):\n{agent.log_tail(200)}")
        for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
            local_cluster.kubectl("delete", kind, "accel-dra-node-labels-own-node", "--ignore-not-found")
