"""The agent's wiring of passthrough holds: while a claim holds a GPU for passthrough, the GPU's CUDA
device leaves what the agent publishes and what the health monitor watches (the fake NVML loses a GPU
the NVIDIA driver gives up, so a monitor that watched it would call it lost); when the claim gives it
back, a discovery pass runs at once and publishes it again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from dra_node_agent.agent import DriverRuntime, _rediscover
from dra_node_agent.driver_health import DriverHealth, probe_for
from dra_node_agent.health.monitor import HealthMonitor, HealthSettings
from dra_node_agent.health.state import State
from dra_node_agent.publisher import SlicePublisher
from tests.unit.agent.prepare.test_passthrough_prepare import GPU0, KUBEVIRT, Node, prepare
from tests.unit.agent.prepare.test_prepare_configs import GPU, entry

SETTINGS = HealthSettings(node_events=False)


class Publisher:
    """Keeps what it was given to publish."""

    def __init__(self) -> None:
        self.published: list[list[str]] = []
        self.gpu_0_published = asyncio.Event()

    async def publish(
        self, devices: Sequence[Mapping[str, Any]], counter_sets: object = None, *, guards: object = ()
    ) -> None:
        del counter_sets, guards
        self.published.append([str(d["name"]) for d in devices])
        if "gpu-0" in self.published[-1]:
            self.gpu_0_published.set()

    def mark_dirty(self) -> None:
        raise AssertionError("nothing fails to publish here")


@contextlib.asynccontextmanager
async def monitor_of(node: Node, devices: Sequence[Any]) -> AsyncIterator[HealthMonitor]:
    probe = probe_for(node.backend)
    assert probe is not None
    monitor = HealthMonitor(driver=GPU, node_name="node-a", probe=probe, devices=devices, settings=SETTINGS)
    await monitor.start()
    try:
        yield monitor
    finally:
        await monitor.stop()


async def test_a_gpu_in_passthrough_is_neither_published_as_cuda_device_nor_watched(tmp_path: Path) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    publisher = Publisher()
    runtime = DriverRuntime(
        backend=node.backend,
        inventory=handler.inventory,
        publisher=cast(SlicePublisher, publisher),
        handler=handler,
    )
    async with monitor_of(node, runtime.watched_devices()) as monitor:
        await _while_a_vm_has_gpu_0(node=node, runtime=runtime, monitor=monitor, publisher=publisher)


async def _while_a_vm_has_gpu_0(
    *, node: Node, runtime: DriverRuntime, monitor: HealthMonitor, publisher: Publisher
) -> None:
    handler = runtime.handler
    runtime.health = DriverHealth(monitor=monitor, task=asyncio.create_task(asyncio.sleep(0)))
    handler.add_holds_listener(runtime.holds_changed)
    names = [d["name"] for d in runtime.slice_devices()]
    assert "gpu-0" in names
    assert "gpu-vfio-0" in names
    assert "gpu-vfio-0" not in monitor.states()  # a VM's GPU is never the monitor's

    vm = node.add_claim("vm", ["gpu-vfio-0"], [entry(GPU, KUBEVIRT)])
    assert await prepare(handler, vm) == ""
    assert node.driver(GPU0) == "vfio-pci"
    assert runtime.wake.is_set()
    names = [d["name"] for d in runtime.slice_devices()]
    assert "gpu-0" not in names  # no CUDA device while a VM has it
    assert "gpu-vfio-0" in names  # its claim's device stays
    await monitor.check()
    assert "gpu-0" not in monitor.states()
    assert {s.state for s in monitor.states().values()} == {State.HEALTHY}

    # What the monitor is spared: one that watched the GPU would call it lost now.
    async with monitor_of(node, [d for d in handler.inventory.devices if d.kind == "gpu"]) as everything:
        await everything.check()
        assert everything.states()["gpu-0"].state is not State.HEALTHY

    assert (await handler.unprepare([vm]))[vm.uid] == ""
    assert node.driver(GPU0) == "nvidia"
    assert publisher.published == []
    rediscovery = asyncio.create_task(_rediscover(runtime, interval=3600))  # woken, not timed
    try:
        await asyncio.wait_for(publisher.gpu_0_published.wait(), timeout=30)
    finally:
        rediscovery.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await rediscovery
    assert "gpu-0" in monitor.states()
    await monitor.check()
    assert monitor.states()["gpu-0"].state is State.HEALTHY
