"""The device status writer under prepare, health changes and unprepare, against ResourceClaims
that behave as an API server's: this driver's entries set and removed, everyone else's kept, the
Ready condition following the health monitor, conflicts and outages retried, and the degrade paths
(the field dropped, RBAC refusing) ending the writes with one log line."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent import prepare_tools
from dra_node_agent.checkpoint import ClaimEntry, ClaimState
from dra_node_agent.claim_reader import ClaimAllocation, driver_allocation
from dra_node_agent.device_status import DeviceStatusWriter, StatusSupport
from dra_node_agent.devices import DiscoveredDevice
from dra_node_agent.health.monitor import HealthMonitor
from dra_node_agent.health.probe import PollResult
from dra_node_agent.health.state import Observation, ProblemKind
from dra_node_agent.prepare import PrepareHandler
from dra_node_agent.simulated.discovery import SimulatedBackend
from tests.unit.agent.device_status.fakeserver import GPU, NODE, OTHER, FakeClaims, api_error, claim

OTHER_ENTRY = {
    "driver": OTHER,
    "pool": NODE,
    "device": "nic-0",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Up",
            "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ],
    "data": {"ifName": "eth1"},
    "networkData": {"interfaceName": "eth1", "ips": ["192.0.2.5/24"]},
}


class ServerClaims:
    """The prepare path's ClaimSource, reading the same fake server."""

    def __init__(self, server: FakeClaims) -> None:
        self.server = server

    async def read(self, ref: ClaimRef) -> ClaimAllocation:
        return driver_allocation(ref=ref, obj=self.server.read(ref), driver=GPU)


class NoProbe:
    backend = "none"

    def start(self, **_: Any) -> None: ...

    def poll(self, *, devices: Sequence[DiscoveredDevice], now: float) -> PollResult:
        return PollResult()

    def stop(self) -> None: ...


@dataclass
class Node:
    server: FakeClaims
    handler: PrepareHandler
    writer: DeviceStatusWriter
    monitor: HealthMonitor
    sleeps: list[float]

    def uuid(self, device: str) -> str:
        return self.handler.inventory.by_name()[device].uuid

    async def prepare(self, name: str, uid: str) -> None:
        result = (await self.handler.prepare([ClaimRef(namespace="ns", name=name, uid=uid)]))[uid]
        assert not result.error, result.error
        await self.writer.join()

    async def unprepare(self, name: str, uid: str) -> None:
        assert (await self.handler.unprepare([ClaimRef(namespace="ns", name=name, uid=uid)]))[uid] == ""
        await self.writer.join()

    async def observe(
        self, device: str, kind: ProblemKind | None = None, value: str = "", message: str = ""
    ) -> None:
        self.monitor.observe(
            Observation(device=device, time=1_800_000_000.0, kind=kind, value=value, message=message)
        )
        await self.writer.join()


async def start_node(tmp_path: Path, server: FakeClaims, *, support: StatusSupport | None = None) -> Node:
    backend = SimulatedBackend(profile="h100-80gb-x8", node_name=NODE, state_dir=tmp_path / "hw", driver=GPU)
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("boot-1\n")
    sleeps: list[float] = []

    async def sleep(delay: float) -> None:
        sleeps.append(delay)

    writer = DeviceStatusWriter(
        driver=GPU,
        api=server,
        support=support or StatusSupport(),
        vendor=prepare_tools.status_data(backend),
        clock=lambda: 1_800_000_000.0 + len(sleeps),
        sleep=sleep,
    )
    inventory = await backend.discover()
    handler = PrepareHandler(
        driver=GPU,
        node_name=NODE,
        inventory=inventory,
        claims=ServerClaims(server),
        state_dir=tmp_path / "state",
        cdi_dir=tmp_path / "cdi",
        proc_root=tmp_path / "proc",
        vendor_env=prepare_tools.vendor_env(backend),
        device_status=writer,
    )
    await handler.start()
    monitor = HealthMonitor(driver=GPU, node_name=NODE, probe=NoProbe(), devices=inventory.devices)
    writer.use_health(monitor)
    monitor.add_change_listener(writer.devices_changed)
    writer.start()
    return Node(server=server, handler=handler, writer=writer, monitor=monitor, sleeps=sleeps)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    server = FakeClaims()
    found = await start_node(tmp_path, server)
    for device in ("gpu-0", "gpu-1"):
        await found.observe(device)  # checked and fine
    yield found
    await found.writer.stop(grace=1)


def ours(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["device"]: e for e in entries if e["driver"] == GPU}


def ready(entry: dict[str, Any]) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in entry["conditions"] if c["type"] == "Ready"]
    assert len(found) == 1
    return found[0]


async def test_prepare_writes_an_entry_per_device_with_ready_and_the_gpu_uuid(node: Node) -> None:
    node.server.add(claim("c", uid="u1", devices=["gpu-0", "gpu-1"], other=["nic-0"]))
    node.server.write_entries("c", [OTHER_ENTRY])
    await node.prepare("c", "u1")
    entries = node.server.entries("c")
    assert entries[0] == OTHER_ENTRY  # another driver's entry, untouched and in its place
    mine = ours(entries)
    assert set(mine) == {"gpu-0", "gpu-1"}
    entry = mine["gpu-0"]
    assert (entry["driver"], entry["pool"], entry["device"]) == (GPU, NODE, "gpu-0")
    assert "shareID" not in entry
    assert "networkData" not in entry
    device = node.handler.inventory.by_name()["gpu-0"]
    assert entry["data"] == {"uuid": device.uuid, "pciBusID": device.pci_bus_id}
    assert ready(entry) == {
        "type": "Ready",
        "status": "True",
        "reason": "Healthy",
        "message": "prepared and healthy",
        "lastTransitionTime": "2027-01-15T08:00:00Z",
    }


async def test_a_health_change_turns_ready_false_and_back(node: Node) -> None:
    node.server.add(claim("c", uid="u1", devices=["gpu-0", "gpu-1"]))
    await node.prepare("c", "u1")
    puts = node.server.puts
    await node.observe("gpu-1", ProblemKind.XID, "79", "XID 79 on GPU GPU-1")
    mine = ours(node.server.entries("c"))
    assert ready(mine["gpu-1"])["status"] == "False"
    assert ready(mine["gpu-1"])["reason"] == "XID"
    assert ready(mine["gpu-1"])["message"] == "XID 79 on GPU GPU-1"
    assert ready(mine["gpu-0"])["status"] == "True"
    assert mine["gpu-1"]["data"]["uuid"] == node.uuid("gpu-1")  # the data stays
    assert node.server.puts == puts + 1
    # The GPU lost as well: still False, the reason of the first problem and both in the message.
    await node.observe("gpu-1", ProblemKind.GPU_LOST, "", "GPU fell off the bus")
    condition = ready(ours(node.server.entries("c"))["gpu-1"])
    assert (condition["status"], condition["reason"]) == ("False", "GPULost")
    assert "XID 79" in condition["message"]
    assert "fell off the bus" in condition["message"]


async def test_a_device_not_in_any_claim_changes_no_claim(node: Node) -> None:
    node.server.add(claim("c", uid="u1", devices=["gpu-0"]))
    await node.prepare("c", "u1")
    gets = node.server.gets
    await node.observe("gpu-5", ProblemKind.XID, "48", "XID 48")
    assert node.server.gets == gets


async def test_the_transition_time_moves_only_when_the_status_does(node: Node) -> None:
    node.server.add(claim("c", uid="u1", devices=["gpu-0"]))
    await node.prepare("c", "u1")
    first = ready(ours(node.server.entries("c"))["gpu-0"])["lastTransitionTime"]
    node.sleeps.extend([1.0] * 60)  # the writer's clock moves a minute on
    await node.observe("gpu-0", ProblemKind.UNHEALTHY, "row-remap-pending", "row remapping pending")
    condition = ready(ours(node.server.entries("c"))["gpu-0"])
    assert (condition["status"], condition["reason"]) == ("False", "RowRemapPending")
    assert condition["lastTransitionTime"] != first
    # A new problem while already unhealthy: the message changes, the transition time does not.
    node.sleeps.extend([1.0] * 60)
    await node.observe("gpu-0", ProblemKind.XID, "94", "XID 94")
    again = ready(ours(node.server.entries("c"))["gpu-0"])
    assert again["lastTransitionTime"] == condition["lastTransitionTime"]
    assert "XID 94" in again["message"]


async def test_unprepare_removes_its_entries_and_keeps_the_others(node: Node) -> None:
    node.server.add(claim("c", uid="u1", devices=["gpu-0"], other=["nic-0"]))
    await node.prepare("c", "u1")
    node.server.write_entries("c", [*node.server.entries("c"), OTHER_ENTRY])
    await node.unprepare("c", "u1")
    assert node.server.entries("c") == [OTHER_ENTRY]
    # Unprepared: a health change of its device writes nothing for it any more.
    puts = node.server.puts
    await node.observe("gpu-0", ProblemKind.XID, "79", "XID 79")
    assert node.server.puts == puts


async def test_unprepare_of_a_deleted_or_deallocated_claim_writes_nothing(node: Node) -> None:
    node.server.add(claim("gone", uid="u1", devices=["gpu-0"]))
    node.server.add(claim("freed", uid="u2", devices=["gpu-1"]))
    await node.prepare("gone", "u1")
    await node.prepare("freed", "u2")
    node.server.delete("gone")
    freed = node.server.get_claim("freed")
    freed["status"] = {}  # deallocated: the API server drops status.devices with the allocation
    node.server.add(freed)
    puts = node.server.puts
    await node.unprepare("gone", "u1")
    await node.unprepare("freed", "u2")
    assert node.server.puts == puts
    assert node.sleeps == []


async def test_a_conflicting_write_is_read_again_and_nothing_is_lost(node: Node) -> None:
    node.server.add(claim("c", uid="u1", devices=["gpu-0"], other=["nic-0"]))
    # Between this writer's read and its write, the other driver's agent writes its entry.
    node.server.before_put = lambda: node.server.write_entries("c", [OTHER_ENTRY])
    await node.prepare("c", "u1")
    entries = node.server.entries("c")
    assert entries[0] == OTHER_ENTRY
    assert set(ours(entries)) == {"gpu-0"}
    assert node.server.puts == 2


async def test_an_outage_is_retried_with_a_growing_delay_until_written(node: Node) -> None:
    node.server.add(claim("c", uid="u1", devices=["gpu-0"]))
    node.server.failures = [
        TimeoutError(),
        api_error(503, "Service Unavailable"),
        api_error(429, "Too Many Requests"),
    ]
    await node.prepare("c", "u1")
    assert node.sleeps == [0.5, 1.0, 2.0]
    assert ready(ours(node.server.entries("c"))["gpu-0"])["status"] == "True"


async def test_the_prepare_answer_does_not_wait_for_the_write(node: Node) -> None:
    node.server.add(claim("c", uid="u1", devices=["gpu-0"]))
    gate = asyncio.Event()

    async def stalled(delay: float) -> None:
        await gate.wait()

    node.writer._sleep = stalled
    node.server.before_put = lambda: node.server.failures.append(api_error(503, "Service Unavailable"))
    ref = ClaimRef(namespace="ns", name="c", uid="u1")
    result = (await node.handler.prepare([ref]))["u1"]
    assert not result.error
    assert result.devices
    assert node.server.entries("c") == []
    gate.set()
    await node.writer.join()
    assert set(ours(node.server.entries("c"))) == {"gpu-0"}


async def test_stop_gives_a_stuck_write_its_grace_then_cancels_it(node: Node) -> None:
    node.server.add(claim("c", uid="u1", devices=["gpu-0"]))
    forever = asyncio.Event()

    async def stuck(delay: float) -> None:
        await forever.wait()

    node.writer._sleep = stuck
    node.server.failures = [api_error(500, "Internal Server Error")]
    await node.handler.prepare([ClaimRef(namespace="ns", name="c", uid="u1")])
    await asyncio.sleep(0)
    await asyncio.wait_for(node.writer.stop(grace=0.05), timeout=5)


async def test_a_server_that_drops_the_field_is_logged_once_and_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = FakeClaims()
    server.drop_devices = True
    support = StatusSupport()
    node = await start_node(tmp_path / "a", server, support=support)
    # A second driver of the same agent shares what was learnt.
    other = DeviceStatusWriter(driver=OTHER, api=server, support=support)
    other.start()
    server.add(claim("c1", uid="u1", devices=["gpu-0"]))
    server.add(claim("c2", uid="u2", devices=["gpu-1"]))
    with caplog.at_level(logging.WARNING):
        await node.prepare("c1", "u1")
        calls = (server.gets, server.puts)
        await node.prepare("c2", "u2")
        await node.observe("gpu-0", ProblemKind.XID, "79", "XID 79")
        await node.unprepare("c1", "u1")
    assert (server.gets, server.puts) == calls  # nothing more was tried
    assert server.entries("c1") == server.entries("c2") == []
    dropped = [r for r in caplog.records if "drops ResourceClaim status.devices" in r.getMessage()]
    assert len(dropped) == 1
    assert not support.enabled(GPU)
    assert not support.enabled(OTHER)
    await node.writer.stop(grace=1)


async def test_rbac_refusing_the_write_stops_that_driver_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = FakeClaims()
    server.forbid_drivers = {GPU}
    support = StatusSupport()
    node = await start_node(tmp_path, server, support=support)
    server.add(claim("c1", uid="u1", devices=["gpu-0"]))
    server.add(claim("c2", uid="u2", devices=["gpu-1"]))
    with caplog.at_level(logging.WARNING):
        await node.prepare("c1", "u1")
        puts = server.puts
        await node.prepare("c2", "u2")
    assert server.puts == puts
    refused = [r.getMessage() for r in caplog.records if "refuses status.devices" in r.getMessage()]
    assert len(refused) == 1
    assert "associated-node:update on resourceclaims/driver" in refused[0]
    assert 'resource="resourceclaims/driver"' in refused[0]
    assert not support.enabled(GPU)
    assert support.enabled(OTHER)
    await node.writer.stop(grace=1)


async def test_after_a_restart_the_prepared_claims_are_rewritten_keeping_data_only_prepare_knew(
    tmp_path: Path,
) -> None:
    server = FakeClaims()
    first = await start_node(tmp_path, server)
    await first.observe("gpu-0")
    server.add(claim("c", uid="u1", devices=["gpu-0"]))
    await first.prepare("c", "u1")
    await first.writer.stop(grace=1)
    # What prepare alone knew (a TPU pod's worker identity) is on the server; a restart cannot rebuild it.
    entries = server.entries("c")
    entries[0]["data"]["workerId"] = 3
    server.write_entries("c", entries)

    second = await start_node(tmp_path, server)  # same checkpoint; the device not checked yet
    await second.writer.join()
    condition = ready(ours(server.entries("c"))["gpu-0"])
    assert (condition["status"], condition["reason"]) == ("True", "HealthUnknown")
    await second.observe("gpu-0", ProblemKind.XID, "79", "XID 79")
    entry = ours(server.entries("c"))["gpu-0"]
    assert ready(entry)["status"] == "False"
    assert entry["data"]["workerId"] == 3
    assert entry["data"]["uuid"] == second.uuid("gpu-0")
    await second.writer.stop(grace=1)


async def test_a_replaced_claim_is_left_alone(node: Node) -> None:
    node.server.add(claim("c", uid="u1", devices=["gpu-0"]))
    await node.prepare("c", "u1")
    node.server.delete("c")
    node.server.add(claim("c", uid="u-new", devices=["gpu-0"]))
    puts = node.server.puts
    await node.observe("gpu-0", ProblemKind.XID, "79", "XID 79")
    await node.unprepare("c", "u1")
    assert node.server.puts == puts
    assert node.server.entries("c") == []


async def test_a_bug_in_the_status_writer_fails_neither_prepare_nor_unprepare(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(node.writer, "prepared", broken)
    monkeypatch.setattr(node.writer, "unprepared", broken)
    node.server.add(claim("c", uid="u1", devices=["gpu-0"]))
    ref = ClaimRef(namespace="ns", name="c", uid="u1")
    result = (await node.handler.prepare([ref]))["u1"]
    assert not result.error
    assert result.devices
    assert (await node.handler.unprepare([ref]))["u1"] == ""


async def test_only_a_few_claims_are_written_at_once() -> None:
    class Gated(FakeClaims):
        def __init__(self) -> None:
            super().__init__()
            self.gate = asyncio.Event()
            self.in_flight = 0
            self.most = 0

        async def get(self, ref: ClaimRef) -> dict[str, Any]:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            await self.gate.wait()
            self.in_flight -= 1
            return await super().get(ref)

    server = Gated()
    writer = DeviceStatusWriter(driver=GPU, api=server, concurrency=2)
    writer.start()
    for i in range(6):
        server.add(claim(f"c{i}", uid=f"u{i}", devices=[f"gpu-{i}"]))
        writer.unprepared(ClaimEntry(f"u{i}", "ns", f"c{i}", ClaimState.PREPARE_COMPLETED, (), "t"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert server.most == 2
    server.gate.set()
    await writer.join()
    assert server.gets == 6
    await writer.stop(grace=1)
