"""``attach_health`` as the agent would call it: the simulated backend, the real publisher and RBAC, and
faults dropped as files into the simulated node's fault folder (what a demo does)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dra_devcluster import LocalCluster
from dra_node_agent.driver_health import attach_health
from dra_node_agent.health import HealthSettings
from dra_node_agent.publisher import SlicePublisher
from dra_node_agent.simulated.discovery import SimulatedBackend
from dra_node_agent.simulated.health_probe import FAULTS_FOLDER

from .conftest import eventually

pytestmark = pytest.mark.cluster

GPU = "gpu.nvidia.com"


async def taints_by_device(cluster: LocalCluster, node: str) -> dict[str, list[dict[str, Any]]]:
    items = (
        await asyncio.to_thread(
            cluster.get_json, "resourceslices", f"--field-selector=spec.nodeName={node},spec.driver={GPU}"
        )
    )["items"]
    return {d["name"]: d.get("taints") or [] for s in items for d in s["spec"].get("devices") or []}


async def test_fault_files_taint_simulated_gpus(
    agent_api: Any, local_cluster: LocalCluster, node: str, tmp_path: Path
) -> None:
    backend = SimulatedBackend(profile="h100-80gb-x8", node_name=node, state_dir=tmp_path / "sim")
    inventory = await backend.discover()
    publisher = SlicePublisher(api=agent_api, driver=GPU, node_name=node, api_version="v1")
    await publisher.publish(inventory.slice_devices())
    health = await attach_health(
        backend=backend,
        devices=inventory.devices,
        slice_devices=inventory.slice_devices,
        publisher=publisher,
        api=agent_api,
        api_version="v1",
        node_name=node,
        settings=HealthSettings(poll_interval=0.2, recovery_period=600),
    )
    assert health is not None
    try:
        assert health.monitor.taints_supported
        faults = tmp_path / "sim" / FAULTS_FOLDER
        faults.mkdir()
        (faults / "xid-3-79").touch()
        (faults / "lost-5").touch()

        async def tainted() -> dict[str, list[dict[str, Any]]] | None:
            found = await taints_by_device(local_cluster, node)
            return found if found["gpu-3"] and found["gpu-5"] else None

        found = await eventually(tainted, what="gpu-3 and gpu-5 tainted")
        assert [(t["key"], t.get("value")) for t in found["gpu-3"]] == [("gpu.nvidia.com/xid", "79")]
        assert [t["key"] for t in found["gpu-5"]] == ["gpu.nvidia.com/gpu-lost"]
        assert [name for name, taints in found.items() if taints] == ["gpu-3", "gpu-5"]
        assert not (faults / "xid-3-79").exists()  # one-shot
    finally:
        await health.stop()
