"""Health against the real control plane: fake NVML events drive taints on and off in a real
ResourceSlice written by the real publisher, the kubelet test client sees the health stream change on
the real plugin server, and Events land on the Node. The clock that decides recovery is injected."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_api.kubeletapi.model import ClaimRef, DeviceHealth, HealthStatus, PrepareResult
from dra_api.times import rfc3339
from dra_devcluster import LocalCluster
from dra_devcluster.kubelet import HealthStream, HealthStreamEnded, KubeletPluginClient
from dra_node_agent.health import (
    HealthMonitor,
    HealthSettings,
    republish_on_change,
    server_keeps_device_taints,
)
from dra_node_agent.nvidia.health_probe import NvmlHealthProbe
from dra_node_agent.plugin import serve_plugin
from dra_node_agent.publisher import SlicePublisher
from dra_node_agent.simulated.health_probe import FakeNvmlHealth
from tests.unit.agent.health.fakes import Clock, discover, fake_nvml, h100

from .conftest import eventually

pytestmark = pytest.mark.cluster

GPU = "gpu.nvidia.com"
RECOVERY = 600.0


class NoClaims:
    """The DRA side is not under test here; the health stream shares its socket."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        return {c.uid: PrepareResult(error="not under test") for c in claims}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        return {c.uid: "" for c in claims}


@dataclass
class Rig:
    fake: FakeNvmlHealth
    clock: Clock
    monitor: HealthMonitor
    publisher: SlicePublisher
    kubelet: KubeletPluginClient


@pytest.fixture
async def rig(
    agent_api: Any, node: str, socket_dirs: tuple[Path, Path], tmp_path: Path
) -> AsyncIterator[Rig]:
    fake = fake_nvml(h100(0), h100(1))
    fake.nvmlInitWithFlags(0)
    devices = discover(fake, tmp_path)
    fake.nvmlShutdown()
    clock = Clock()
    monitor = HealthMonitor(
        driver=GPU,
        node_name=node,
        probe=NvmlHealthProbe(nvml=fake, event_timeout_ms=50, clock=clock),
        devices=devices,
        settings=HealthSettings(poll_interval=0.2, recovery_period=RECOVERY, heartbeat_interval=1.0),
        api=agent_api,
        clock=clock,
    )
    publisher = SlicePublisher(
        api=agent_api, driver=GPU, node_name=node, api_version="v1", resync_delay=0.05, resync_interval=30
    )
    slice_devices = [d.to_slice_device() for d in devices]
    await monitor.start()
    await publisher.publish(monitor.decorate(slice_devices))
    tasks = [
        asyncio.create_task(publisher.run()),
        asyncio.create_task(
            republish_on_change(
                monitor, devices=lambda: slice_devices, publish=publisher.publish, retry=publisher.mark_dirty
            )
        ),
    ]
    registry, plugins = socket_dirs
    plugin = await serve_plugin(
        driver=GPU,
        handler=NoClaims(),
        health=monitor.health_source(),
        registry_dir=registry,
        plugins_dir=plugins,
    )
    kubelet = await KubeletPluginClient.register(plugin.registration_socket, driver=GPU)
    try:
        yield Rig(fake=fake, clock=clock, monitor=monitor, publisher=publisher, kubelet=kubelet)
    finally:
        await kubelet.close()
        await plugin.stop(grace=1)
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await monitor.stop()


async def slice_devices(cluster: LocalCluster, node: str) -> dict[str, dict[str, Any]]:
    items = (
        await asyncio.to_thread(
            cluster.get_json, "resourceslices", f"--field-selector=spec.nodeName={node},spec.driver={GPU}"
        )
    )["items"]
    return {d["name"]: d for s in items for d in s["spec"].get("devices") or []}


async def pool_generation(cluster: LocalCluster, node: str) -> int:
    items = (
        await asyncio.to_thread(
            cluster.get_json, "resourceslices", f"--field-selector=spec.nodeName={node},spec.driver={GPU}"
        )
    )["items"]
    return max(int(s["spec"]["pool"]["generation"]) for s in items)


async def next_report_where(stream: HealthStream, device: str, health: HealthStatus) -> list[DeviceHealth]:
    for _ in range(100):
        report = await stream.next(idle_timeout=30)
        assert not isinstance(report, HealthStreamEnded), report
        if {h.device: h.health for h in report}.get(device) is health:
            return report
    raise AssertionError(f"no report with {device} {health} in 100 reports")


async def node_events(cluster: LocalCluster, node: str, reason: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (
        await asyncio.to_thread(
            cluster.get_json,
            "events",
            "-n",
            "default",
            f"--field-selector=involvedObject.name={node},involvedObject.kind=Node,reason={reason}",
        )
    )["items"]
    return items


async def test_server_keeps_device_taints(agent_api: Any, node: str) -> None:
    assert await server_keeps_device_taints(agent_api, api_version="v1", driver=GPU, node_name=node) is True


async def test_xid_taints_the_device_streams_unhealthy_and_recovers(
    rig: Rig, local_cluster: LocalCluster, node: str
) -> None:
    async with rig.kubelet.watch_health() as stream:
        report = await next_report_where(stream, "gpu-1", HealthStatus.HEALTHY)
        assert {h.device for h in report} == {"gpu-0", "gpu-1"}
        assert {h.pool for h in report} == {node}
        devices = await slice_devices(local_cluster, node)
        assert "taints" not in devices["gpu-1"]
        generation = await pool_generation(local_cluster, node)

        first_seen = rig.clock.now
        rig.fake.inject_xid(rig.fake.gpus[1].uuid, 79)
        rig.fake.inject_xid(rig.fake.gpus[0].uuid, 13)  # an application XID: no taint

        async def tainted() -> list[dict[str, Any]] | None:
            found: list[dict[str, Any]] | None = (await slice_devices(local_cluster, node))["gpu-1"].get(
                "taints"
            )
            return found

        taints = await eventually(tainted, what="gpu-1 tainted in its ResourceSlice")
        assert len(taints) == 1
        assert taints[0]["key"] == "gpu.nvidia.com/xid"
        assert taints[0]["value"] == "79"
        assert taints[0]["effect"] == "NoSchedule"
        assert taints[0]["timeAdded"] == rfc3339(first_seen)
        assert "taints" not in (await slice_devices(local_cluster, node))["gpu-0"]
        assert await pool_generation(local_cluster, node) > generation

        report = await next_report_where(stream, "gpu-1", HealthStatus.UNHEALTHY)
        by_device = {h.device: h for h in report}
        assert "XID 79" in by_device["gpu-1"].message
        assert by_device["gpu-0"].health is HealthStatus.HEALTHY

        async def warned() -> list[dict[str, Any]]:
            return await node_events(local_cluster, node, "DeviceUnhealthy")

        (event,) = await eventually(warned, what="a DeviceUnhealthy Event on the Node")
        assert event["type"] == "Warning"
        assert "gpu.nvidia.com/gpu-1" in event["message"]
        assert "gpu.nvidia.com/xid=79:NoSchedule" in event["message"]

        # Recovery: nothing happens before the quiet period, then the taint goes without a restart.
        rig.clock.advance(RECOVERY - 1)
        await rig.monitor.check()
        assert (await slice_devices(local_cluster, node))["gpu-1"].get("taints")
        rig.clock.advance(1)

        async def untainted() -> bool:
            return "taints" not in (await slice_devices(local_cluster, node))["gpu-1"]

        await eventually(untainted, what="gpu-1's taint removed after the quiet period")
        await next_report_where(stream, "gpu-1", HealthStatus.HEALTHY)

        async def recovered() -> list[dict[str, Any]]:
            return await node_events(local_cluster, node, "DeviceRecovered")

        (event,) = await eventually(recovered, what="a DeviceRecovered Event on the Node")
        assert event["type"] == "Normal"


async def test_lost_gpu_without_taint_support_leaves_the_slice_and_returns(
    rig: Rig, local_cluster: LocalCluster, node: str
) -> None:
    rig.monitor.taints_supported = False  # as on a server with DRADeviceTaints off
    async with rig.kubelet.watch_health() as stream:
        await next_report_where(stream, "gpu-0", HealthStatus.HEALTHY)
        rig.fake.lose(rig.fake.gpus[0].uuid, via_event=False)  # found by the next poll

        async def gone() -> bool:
            return set(await slice_devices(local_cluster, node)) == {"gpu-1"}

        await eventually(gone, what="the lost gpu-0 left out of the ResourceSlice")
        report = await next_report_where(stream, "gpu-0", HealthStatus.UNHEALTHY)
        assert "lost" in {h.device: h for h in report}["gpu-0"].message

        rig.fake.restore(rig.fake.gpus[0].uuid)
        rig.clock.advance(RECOVERY)

        async def back() -> bool:
            return set(await slice_devices(local_cluster, node)) == {"gpu-0", "gpu-1"}

        await eventually(back, what="gpu-0 back in the ResourceSlice")
        await next_report_where(stream, "gpu-0", HealthStatus.HEALTHY)
