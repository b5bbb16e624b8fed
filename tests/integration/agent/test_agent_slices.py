"""The agent publishes its node's devices as ResourceSlices and keeps them right (real control plane)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dra_devcluster import LocalCluster
from dra_devcluster.kubelet import KubeletPluginClient

from .agentproc import GPU, TPU, AgentProcess
from .conftest import node_slices, wait_slices, wait_until

pytestmark = pytest.mark.cluster


async def _register(agent: AgentProcess, driver: str) -> None:
    async with await KubeletPluginClient.register_driver(agent.dirs.registry, driver=driver):
        pass


def _uid(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["uid"])


def test_slices_for_both_drivers_with_owner_and_pool(
    local_cluster: LocalCluster, agent: AgentProcess, node: str
) -> None:
    agent.profiles = ("h100-80gb-x8", "tpu-v6e-2x4")
    agent.start()
    assert agent.http_get("/healthz") == (200, "ok\n")
    # Ready only once the kubelet registered each driver (a rolling update waits on it).
    status, text = agent.http_get("/readyz")
    assert (status, text) == (503, f"waiting for the kubelet to register driver {GPU}\n")
    for driver in (GPU, TPU):
        asyncio.run(_register(agent, driver))
    wait_until(lambda: agent.http_get("/readyz") == (200, "ok\n"), timeout=30, what="/readyz to pass")
    node_uid = local_cluster.get_json("node", node)["metadata"]["uid"]
    # Names as the vendors publish them: gpu-N; a v6e chip by its VFIO group number.
    for driver, prefix in ((GPU, "gpu-"), (TPU, "")):
        (slice_obj,) = wait_slices(local_cluster, node, driver=driver)
        spec = slice_obj["spec"]
        assert slice_obj["apiVersion"] == "resource.k8s.io/v1"
        assert spec["nodeName"] == node
        assert spec["driver"] == driver
        assert spec["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
        assert sorted(d["name"] for d in spec["devices"]) == [f"{prefix}{i}" for i in range(8)]
        owners = slice_obj["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [("Node", node, node_uid)]
    gpu0 = next(d for d in node_slices(local_cluster, node)[0]["spec"]["devices"] if d["name"] == "gpu-0")
    assert gpu0["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert gpu0["capacity"]["memory"] == {"value": "81559Mi"}


def test_deleted_slice_is_recreated_without_a_generation_bump(
    local_cluster: LocalCluster, agent: AgentProcess, node: str
) -> None:
    agent.start()
    (first,) = wait_slices(local_cluster, node)
    local_cluster.kubectl("delete", "resourceslice", first["metadata"]["name"])

    def recreated() -> dict[str, Any] | None:
        items = node_slices(local_cluster, node)
        return items[0] if len(items) == 1 and _uid(items[0]) != _uid(first) else None

    again = wait_until(recreated, timeout=30, what="the deleted slice to come back")
    assert again["metadata"]["name"] == first["metadata"]["name"]
    assert again["spec"]["pool"] == first["spec"]["pool"]
    assert again["spec"]["devices"] == first["spec"]["devices"]


def test_stale_slice_of_this_node_and_driver_is_removed(
    local_cluster: LocalCluster, agent: AgentProcess, node: str
) -> None:
    agent.start()
    wait_slices(local_cluster, node)
    stale = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-leftover"},
        "spec": {
            "driver": GPU,
            "nodeName": node,
            "pool": {"name": f"{node}-old", "generation": 3, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-99"}],
        },
    }
    local_cluster.apply([stale])

    def only_ours() -> bool:
        return [s["metadata"]["name"] for s in node_slices(local_cluster, node)] == [f"{node}-{GPU}-0"]

    wait_until(only_ours, timeout=30, what="the stale slice to be deleted")


def test_restart_keeps_slices_and_a_device_change_bumps_the_generation(
    local_cluster: LocalCluster, agent: AgentProcess, node: str
) -> None:
    agent.start()
    (first,) = wait_slices(local_cluster, node)
    assert agent.stop() == 0
    # SIGTERM leaves the slices in place: running pods keep their devices published.
    (kept,) = node_slices(local_cluster, node)
    assert _uid(kept) == _uid(first)
    assert not agent.dirs.registration_socket().exists()

    agent.start()
    agent.wait_serving()
    (after,) = node_slices(local_cluster, node)
    assert _uid(after) == _uid(first)
    assert after["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert after["spec"]["pool"]["generation"] == 1

    # Different hardware on the same node: the pool really changes, so its generation goes up.
    agent.kill()
    agent.profiles = ("a100-40gb-mig",)
    agent.start()

    def bumped() -> dict[str, Any] | None:
        items = node_slices(local_cluster, node)
        return items[0] if len(items) == 1 and items[0]["spec"]["pool"]["generation"] == 2 else None

    changed = wait_until(bumped, timeout=30, what="generation 2 after the device change")
    assert _uid(changed) == _uid(first)
    names = {d["name"] for d in changed["spec"]["devices"]}
    assert any("-mig-" in n for n in names), names


def test_slices_go_with_their_node(local_cluster: LocalCluster, agent: AgentProcess, node: str) -> None:
    agent.start()
    wait_slices(local_cluster, node)
    agent.stop()
    local_cluster.kubectl("delete", "node", node)
    wait_until(
        lambda: node_slices(local_cluster, node) == [],
        timeout=60,
        what="the garbage collector to delete the node's slices",
    )
