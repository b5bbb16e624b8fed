"""The monitor: observations to state, taints, kubelet reports, metrics; recovery with an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pynvml
import pytest
from prometheus_client import REGISTRY

from dra_api.kubeletapi.model import HealthStatus
from dra_api.times import rfc3339
from dra_node_agent.health.monitor import HealthMonitor, HealthSettings, republish_on_change
from dra_node_agent.health.state import State
from dra_node_agent.health.taints import TaintEffect
from dra_node_agent.nvidia.health_probe import NvmlHealthProbe
from dra_node_agent.simulated.faketree import FakePciFunction, write_pci_tree
from dra_node_agent.simulated.health_probe import FakeNvmlHealth
from dra_node_agent.tpu.discovery import TpuBackend
from dra_node_agent.tpu.health_probe import TpuHealthProbe

from .fakes import Clock, discover, fake_nvml, h100

DRIVER = "unit-health.nvidia.com"
SETTINGS = HealthSettings(poll_interval=3600, recovery_period=300, heartbeat_interval=3600)


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


@pytest.fixture
def fake() -> FakeNvmlHealth:
    return fake_nvml(h100(0), h100(1))


@pytest.fixture
async def monitor(fake: FakeNvmlHealth, tmp_path: Path) -> AsyncIterator[tuple[HealthMonitor, Clock]]:
    clock = Clock()
    probe = NvmlHealthProbe(nvml=fake, event_timeout_ms=50, clock=clock)
    fake.nvmlInitWithFlags(0)
    devices = discover(fake, tmp_path)
    fake.nvmlShutdown()
    mon = HealthMonitor(
        driver=DRIVER, node_name="node-a", probe=probe, devices=devices, settings=SETTINGS, clock=clock
    )
    await mon.start()
    yield mon, clock
    await mon.stop()


async def wait_state(mon: HealthMonitor, device: str, state: State) -> None:
    async def reached() -> None:
        while mon.states()[device].state is not state:
            await mon.wait_change(timeout=0.5)

    await asyncio.wait_for(reached(), timeout=10)


async def test_xid_taints_reports_and_recovers_after_the_quiet_period(
    monitor: tuple[HealthMonitor, Clock], fake: FakeNvmlHealth
) -> None:
    mon, clock = monitor
    await mon.check()
    assert {s.state for s in mon.states().values()} == {State.HEALTHY}
    assert sample("dra_agent_device_healthy", driver=DRIVER, device="gpu-1") == 1
    first = clock.now
    fake.inject_xid(fake.gpus[1].uuid, 79)
    await wait_state(mon, "gpu-1", State.UNHEALTHY)
    assert mon.changed.is_set()
    assert mon.taints_for("gpu-1") == [
        {"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule", "timeAdded": rfc3339(first)}
    ]
    assert mon.taints_for("gpu-0") == []
    report = {h.device: h for h in mon.report()}
    assert report["gpu-1"].health is HealthStatus.UNHEALTHY
    assert report["gpu-1"].pool == "node-a"
    assert "XID 79" in report["gpu-1"].message
    assert report["gpu-0"].health is HealthStatus.HEALTHY
    assert sample("dra_agent_device_healthy", driver=DRIVER, device="gpu-1") == 0
    assert sample("dra_agent_device_health_state", driver=DRIVER, device="gpu-1", state="unhealthy") == 1
    assert sample("dra_agent_xid_errors_total", driver=DRIVER, device="gpu-1", xid="79", fatal="true") == 1
    assert (
        sample(
            "dra_agent_device_taint_info",
            driver=DRIVER,
            device="gpu-1",
            key=f"{DRIVER}/xid",
            value="79",
            effect="NoSchedule",
        )
        == 1
    )

    clock.advance(299)
    await mon.check()
    assert mon.states()["gpu-1"].state is State.UNHEALTHY
    clock.advance(1)
    await mon.check()
    assert mon.states()["gpu-1"].state is State.HEALTHY
    assert mon.taints_for("gpu-1") == []
    assert sample("dra_agent_device_healthy", driver=DRIVER, device="gpu-1") == 1
    assert (
        sample(
            "dra_agent_device_taint_info",
            driver=DRIVER,
            device="gpu-1",
            key=f"{DRIVER}/xid",
            value="79",
            effect="NoSchedule",
        )
        is None
    )
    assert [t.new for t in mon.states()["gpu-1"].history] == [State.HEALTHY, State.UNHEALTHY, State.HEALTHY]


async def test_polled_condition_holds_the_taint_while_it_lasts(
    monitor: tuple[HealthMonitor, Clock], fake: FakeNvmlHealth
) -> None:
    mon, clock = monitor
    fake.health[fake.gpus[0].uuid].remapped_rows = (0, 0, 1, 0)
    await mon.check()
    assert [t["value"] for t in mon.taints_for("gpu-0")] == ["row-remap-pending"]
    for _ in range(3):
        clock.advance(250)
        await mon.check()
        assert mon.states()["gpu-0"].state is State.UNHEALTHY
    fake.health[fake.gpus[0].uuid].remapped_rows = (0, 0, 0, 0)  # the GPU was reset
    clock.advance(250)
    await mon.check()
    assert mon.states()["gpu-0"].state is State.UNHEALTHY
    clock.advance(50)
    await mon.check()
    assert mon.states()["gpu-0"].state is State.HEALTHY


async def test_telemetry_and_info_series(monitor: tuple[HealthMonitor, Clock], fake: FakeNvmlHealth) -> None:
    mon, _ = monitor
    fake.health[fake.gpus[0].uuid].power_mw = 250_000
    await mon.check()
    assert sample("dra_agent_device_power_watts", driver=DRIVER, device="gpu-0") == 250.0
    assert sample("dra_agent_device_temperature_celsius", driver=DRIVER, device="gpu-0") == 40.0
    assert (
        sample("dra_agent_device_memory_total_bytes", driver=DRIVER, device="gpu-0")
        == fake.gpus[0].memory_total
    )
    assert (
        sample(
            "dra_agent_device_info",
            driver=DRIVER,
            node="node-a",
            device="gpu-0",
            uuid=fake.gpus[0].uuid,
            model="NVIDIA H100 80GB HBM3",
        )
        == 1
    )
    assert sample("dra_agent_health_monitor_up", driver=DRIVER, backend="nvml") == 1


async def test_devices_leave_the_slice_without_taint_support(
    monitor: tuple[HealthMonitor, Clock], fake: FakeNvmlHealth
) -> None:
    mon, _ = monitor
    fake.lose(fake.gpus[0].uuid, via_event=False)
    await mon.check()
    devices = [{"name": "gpu-0"}, {"name": "gpu-1"}]
    assert mon.decorate(devices)[0]["taints"][0]["key"] == f"{DRIVER}/gpu-lost"
    mon.taints_supported = False
    assert mon.decorate(devices) == [{"name": "gpu-1"}]


async def test_no_execute_setting(fake: FakeNvmlHealth, tmp_path: Path) -> None:
    clock = Clock()
    fake.nvmlInitWithFlags(0)
    devices = discover(fake, tmp_path)
    mon = HealthMonitor(
        driver=DRIVER,
        node_name="node-a",
        probe=NvmlHealthProbe(nvml=fake),
        devices=devices,
        settings=HealthSettings(taint_effect=TaintEffect.NO_EXECUTE),
        clock=clock,
    )
    fake.health[fake.gpus[1].uuid].remapped_rows = (0, 0, 0, 1)
    await mon.check()
    assert mon.taints_for("gpu-1")[0]["effect"] == "NoExecute"


async def test_health_source_yields_at_once_and_on_change(
    monitor: tuple[HealthMonitor, Clock], fake: FakeNvmlHealth
) -> None:
    mon, _ = monitor
    await mon.check()
    reports = mon.health_source().watch()
    first = await anext(reports)
    assert {h.health for h in first} == {HealthStatus.HEALTHY}
    pending = asyncio.ensure_future(anext(reports))
    fake.inject_xid(fake.gpus[0].uuid, 48)
    second = await asyncio.wait_for(pending, timeout=10)
    assert {h.device: h.health for h in second}["gpu-0"] is HealthStatus.UNHEALTHY
    await reports.aclose()  # type: ignore[attr-defined]


async def test_republish_on_change_publishes_decorated_devices(
    monitor: tuple[HealthMonitor, Clock], fake: FakeNvmlHealth
) -> None:
    mon, _ = monitor
    published: asyncio.Queue[list[dict[str, object]]] = asyncio.Queue()

    async def publish(devices: list[dict[str, object]]) -> None:
        await published.put(devices)

    await mon.check()
    mon.changed.clear()
    task = asyncio.create_task(
        republish_on_change(mon, devices=lambda: [{"name": "gpu-0"}, {"name": "gpu-1"}], publish=publish)
    )
    try:
        fake.inject_xid(fake.gpus[0].uuid, 79)
        devices = await asyncio.wait_for(published.get(), timeout=10)
        assert devices[0]["taints"]
        assert "taints" not in devices[1]
    finally:
        task.cancel()


async def test_tpu_presence(tmp_path: Path) -> None:
    write_pci_tree(
        tmp_path,
        [
            FakePciFunction(
                address=f"0000:0{i}:00.0", vendor=0x1AE0, device=0x0062, accel=f"accel{i}", iommu_group=i
            )
            for i in range(2)
        ],
    )
    inventory = TpuBackend(
        node_name="tpu-node", sysfs_root=tmp_path / "sys", dev_root=tmp_path / "dev", tpu_env_path=None
    ).discover_sync()
    assert [d.name for d in inventory.devices] == ["accel0", "accel1"], inventory.errors
    clock = Clock()
    mon = HealthMonitor(
        driver="unit-health.google.com",
        node_name="tpu-node",
        probe=TpuHealthProbe(sysfs_root=tmp_path / "sys", dev_root=tmp_path / "dev"),
        devices=inventory.devices,
        settings=SETTINGS,
        clock=clock,
    )
    await mon.check()
    assert {s.state for s in mon.states().values()} == {State.HEALTHY}
    (tmp_path / "dev" / "accel1").unlink()
    clock.advance(10)
    await mon.check()
    assert mon.taints_for("accel1")[0]["key"] == "unit-health.google.com/unhealthy"
    assert mon.taints_for("accel1")[0]["value"] == "device-node-missing"
    assert "accel1" in mon.states()["accel1"].message()
    (tmp_path / "dev" / "accel1").touch()
    clock.advance(SETTINGS.recovery_period)
    await mon.check()
    assert mon.states()["accel1"].state is State.HEALTHY


async def test_nvml_that_cannot_start_leaves_devices_unknown(fake: FakeNvmlHealth, tmp_path: Path) -> None:
    fake.nvmlInitWithFlags(0)
    devices = discover(fake, tmp_path)
    fake.nvmlShutdown()
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    mon = HealthMonitor(
        driver="unit-broken.nvidia.com",
        node_name="node-b",
        probe=NvmlHealthProbe(nvml=fake, event_timeout_ms=50),
        devices=devices,
        settings=SETTINGS,
        clock=Clock(),
    )
    await mon.start()
    try:
        assert sample("dra_agent_health_monitor_up", driver="unit-broken.nvidia.com", backend="nvml") == 0
        await mon.check()
        assert {s.state for s in mon.states().values()} == {State.UNKNOWN}
        assert "health check failed" in mon.states()["gpu-0"].message()
        assert {h.health for h in mon.report()} == {HealthStatus.UNKNOWN}
        assert mon.taints() == {}
        assert (
            sample(
                "dra_agent_device_health_state",
                driver="unit-broken.nvidia.com",
                device="gpu-0",
                state="unknown",
            )
            == 1
        )
    finally:
        await mon.stop()
    assert sample("dra_agent_device_healthy", driver="unit-broken.nvidia.com", device="gpu-0") is None


async def test_change_listeners_hear_which_devices_changed(
    monitor: tuple[HealthMonitor, Clock], fake: FakeNvmlHealth
) -> None:
    mon, _ = monitor
    heard: list[list[str]] = []

    def broken(devices: object) -> None:
        raise RuntimeError("a listener's bug")

    mon.add_change_listener(broken)
    mon.add_change_listener(lambda devices: heard.append(list(devices)))
    await mon.check()
    assert heard == [["gpu-0", "gpu-1"]]  # unknown -> healthy
    fake.inject_xid(fake.gpus[1].uuid, 79)
    await wait_state(mon, "gpu-1", State.UNHEALTHY)
    assert heard[-1] == ["gpu-1"]
    await mon.check()  # nothing changed: nobody is called
    assert len(heard) == 2
