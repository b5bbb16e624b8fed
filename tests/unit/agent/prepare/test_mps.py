"""GpuConfig MPS at prepare: a control daemon per claim, its limits, its folders in the CDI spec, and
its life cycle across unprepare, failures and agent restarts.

The daemon is the simulated node's nvidia-cuda-mps-control (a shell stand-in under the simulated
driver root), started by the same code as on hardware: its own session, cgroup (under the test
session's parent) and mount namespace, whose /dev/shm is the claim's shm tmpfs (seen through
/proc/<pid>/root, the daemon's view of the file system).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent import checkpoint as cp
from dra_node_agent import prepare_tools
from dra_node_agent.nvidia.mps import MpsLimits
from dra_node_agent.prepare import PrepareHandler
from dra_node_agent.simulated.discovery import SIMULATED_DRIVER_ROOT
from tests import mps_cgroup
from tests.unit.agent.prepare.simnode import SimulatedNode
from tests.unit.agent.prepare.test_prepare_configs import GPU, NODE, NVIDIA, entry

PROFILE = "h100-80gb-x8"


class Node(SimulatedNode):
    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path, profile=PROFILE)

    async def handler(self, *, mps: bool = True) -> PrepareHandler:  # type: ignore[override]
        return await super().handler(
            gpu_sharing=prepare_tools.gpu_sharing(self.backend),
            mps=prepare_tools.mps_daemons(self.backend, self.tmp_path / "state" / "mps", mps_cgroup.options())
            if mps
            else None,
        )

    def gpus(self, *indices: int) -> list[tuple[str, str]]:
        devices = sorted(
            (d for d in self.backend.discover_sync().devices if d.kind == "gpu"),
            key=lambda d: int(d.local_id),
        )
        return [(devices[i].name, devices[i].uuid) for i in indices]

    def add_claim(
        self, name: str, devices: list[str], mps_config: dict[str, Any] | None, *, admin: bool = False
    ) -> ClaimRef:
        sharing: dict[str, Any] = {"strategy": "MPS"}
        if mps_config is not None:
            sharing["mpsConfig"] = mps_config
        uid = f"uid-{name}"
        results: list[dict[str, Any]] = [
            {"request": "gpus", "driver": GPU, "pool": NODE, "device": d} for d in devices
        ]
        for result in results:
            if admin:
                result["adminAccess"] = True
        self.claims.objects[name] = {
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": results,
                        "config": [
                            entry(GPU, {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": sharing})
                        ],
                    }
                }
            },
        }
        return ClaimRef(namespace="ns", name=name, uid=uid)

    def folder(self, ref: ClaimRef) -> Path:
        return self.tmp_path / "state" / "mps" / ref.uid

    def pid(self, ref: ClaimRef) -> int:
        return int(json.loads((self.folder(ref) / "daemon.json").read_text())["pid"])

    def settings(self, ref: ClaimRef) -> list[str]:
        return (self.folder(ref) / "pipe" / "settings").read_text().splitlines()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_dead(pid: int) -> None:
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
async def node(tmp_path: Path) -> Any:
    created = Node(tmp_path)
    yield created
    # Never leave a daemon, its cgroup or its shm mount behind, whatever a test did.
    mps_cgroup.clean_up(tmp_path / "state" / "mps")


def spec(handler: PrepareHandler, uid: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(handler.cdi.spec_path(uid).read_text())
    return loaded


def edits_of(document: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    env: list[str] = []
    mounts: list[dict[str, Any]] = []
    for device in document["devices"]:
        env += device["containerEdits"].get("env", [])
        mounts += device["containerEdits"].get("mounts", [])
    return env, mounts


async def test_a_claims_daemon_runs_with_its_limits_while_prepared_and_stops_at_unprepare(node: Node) -> None:
    handler = await node.handler()
    (name0, uuid0), (name1, uuid1) = node.gpus(0, 1)
    config = {
        "defaultActiveThreadPercentage": 50,
        "defaultPinnedDeviceMemoryLimit": "10Gi",
        "defaultPerDevicePinnedMemoryLimit": {"1": "4Gi"},  # by the GPU's index on the node
    }
    ref = node.add_claim("c", [name0, name1], config)

    result = (await handler.prepare([ref]))[ref.uid]
    assert result.error == "", result.error
    pid = node.pid(ref)
    assert alive(pid)
    assert (node.folder(ref) / "pipe" / "control").exists()
    assert node.settings(ref) == [
        f"devices {uuid0},{uuid1}",
        "set_default_active_thread_percentage 50",
        f"set_default_device_pinned_mem_limit {uuid0} 10240M",
        f"set_default_device_pinned_mem_limit {uuid1} 4096M",
    ]
    # The daemon's /dev/shm is the claim's shm tmpfs, which its containers get; its cgroup is its own.
    shm = node.folder(ref) / "shm"
    assert os.stat(f"/proc/{pid}/root/dev/shm").st_dev == os.stat(shm).st_dev != os.stat(shm.parent).st_dev
    assert handler.mps is not None
    cgroups = handler.mps.cgroups  # type: ignore[attr-defined]
    assert cgroups.members(ref.uid) == [pid]
    env, mounts = edits_of(spec(handler, ref.uid))
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in env
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M,1=4096M" in env
    by_path = {m["containerPath"]: m for m in mounts}
    assert by_path["/tmp/nvidia-mps"]["hostPath"] == str(node.folder(ref) / "pipe")
    assert by_path["/tmp/nvidia-mps"]["options"] == ["ro", "nosuid", "nodev", "bind", "noexec"]
    assert by_path["/dev/shm"]["hostPath"] == str(node.folder(ref) / "shm")
    assert by_path["/dev/shm"]["options"] == ["rw", "nosuid", "nodev", "bind", "noexec"]
    (recorded,) = handler.store.load()
    assert [d.mps for d in recorded.devices] == [True, True]

    assert (await handler.unprepare([ref]))[ref.uid] == ""
    assert not alive(pid)
    assert not node.folder(ref).exists()
    assert not cgroups.path(ref.uid).exists()
    assert f" {shm} " not in await asyncio.to_thread(Path("/proc/self/mountinfo").read_text)


async def test_a_limit_for_a_gpu_the_claim_does_not_have_names_the_field_and_its_gpus(node: Node) -> None:
    handler = await node.handler()
    ((name, uuid),) = node.gpus(2)
    ref = node.add_claim("c", [name], {"defaultPerDevicePinnedMemoryLimit": {"5": "1Gi"}})
    error = (await handler.prepare([ref]))[ref.uid].error
    assert (
        "request gpus: GpuConfig sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.5: names no GPU" in error
    )
    assert f"its GPUs are 2 ({uuid})" in error
    assert handler.store.load() == []
    assert not node.folder(ref).exists()


async def test_a_daemon_that_fails_to_start_fails_the_prepare_with_its_words_and_leaves_nothing(
    node: Node,
) -> None:
    handler = await node.handler()
    ((name, _),) = node.gpus(0)
    tool = node.tmp_path / "hw" / SIMULATED_DRIVER_ROOT / "usr/bin/nvidia-cuda-mps-control"
    original = tool.read_text()
    tool.write_text("#!/bin/sh\necho 'An MPS control daemon is already running for this user' >&2\nexit 1\n")
    ref = node.add_claim("c", [name], None)

    error = (await handler.prepare([ref]))[ref.uid].error
    assert "ResourceClaim ns/c" in error
    assert "request gpus: GpuConfig sharing.strategy MPS: MPS control daemon exited with status 1" in error
    assert "An MPS control daemon is already running for this user" in error
    assert handler.store.load() == []
    assert not handler.cdi.spec_path(ref.uid).exists()
    assert not node.folder(ref).exists()

    tool.write_text(original)
    assert (await handler.prepare([ref]))[ref.uid].error == ""


async def test_an_agent_restart_keeps_a_running_daemon_and_starts_a_dead_one_again(node: Node) -> None:
    handler = await node.handler()
    ((name0, _), (name1, uuid1)) = node.gpus(0, 1)
    kept = node.add_claim("kept", [name0], {"defaultActiveThreadPercentage": 30})
    lost = node.add_claim("lost", [name1], {"defaultActiveThreadPercentage": 70})
    for ref in (kept, lost):
        assert (await handler.prepare([ref]))[ref.uid].error == ""
    kept_pid, lost_pid = node.pid(kept), node.pid(lost)
    # The agent's container restarted: its daemons went with it. Here one is killed, one stays.
    os.killpg(lost_pid, signal.SIGKILL)
    await asyncio.to_thread(wait_dead, lost_pid)

    restarted = await node.handler()
    assert node.pid(kept) == kept_pid
    assert alive(kept_pid)
    assert node.pid(lost) != lost_pid
    assert alive(node.pid(lost))
    assert node.settings(lost)[-1] == "set_default_active_thread_percentage 70"
    assert node.settings(lost)[0] == f"devices {uuid1}"
    # The restarted agent stops what it found, as it would have stopped its own.
    for ref in (kept, lost):
        assert (await restarted.unprepare([ref]))[ref.uid] == ""
    assert not alive(kept_pid)
    assert not any((node.tmp_path / "state" / "mps").iterdir())


async def test_a_daemon_of_a_claim_no_longer_recorded_is_stopped_at_start(node: Node) -> None:
    handler = await node.handler()
    ((name, _),) = node.gpus(0)
    ref = node.add_claim("c", [name], None)
    assert (await handler.prepare([ref]))[ref.uid].error == ""
    pid = node.pid(ref)
    handler.store.remove(ref.uid)  # as if the checkpoint had been reset by hand

    await node.handler()
    assert not alive(pid)
    assert not node.folder(ref).exists()


async def test_mps_switched_off_or_asked_two_ways_in_one_claim_is_refused(node: Node) -> None:
    off = await node.handler(mps=False)
    ((name0, _), (name1, _)) = node.gpus(0, 1)
    ref = node.add_claim("c", [name0], None)
    error = (await off.prepare([ref]))[ref.uid].error
    assert "GpuConfig sharing.strategy MPS: MPS is off on this node (--mps-support=false)" in error

    handler = await node.handler()
    two = node.add_claim("two", [name0, name1], None)
    allocation = node.claims.objects["two"]["status"]["allocation"]["devices"]
    allocation["results"][1]["request"] = "more"
    other = {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 10}}
    allocation["config"].append(
        entry(GPU, {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": other}, requests=["more"])
    )
    error = (await handler.prepare([two]))[two.uid].error
    assert "requests gpus, more: their GpuConfig sharing.mpsConfig entries differ" in error
    assert handler.store.load() == []


async def test_a_crash_between_the_daemon_and_prepare_completed_is_redone_or_undone(node: Node) -> None:
    handler = await node.handler()
    ((name0, uuid0), (name1, uuid1)) = node.gpus(0, 1)
    live = node.add_claim("live", [name0], None)
    gone = node.add_claim("gone", [name1], None)
    # What a crash right after the daemon started leaves: PrepareStarted with the devices recorded
    # (they are, before the daemon starts) and the daemon running.
    assert handler.mps is not None
    for ref, device, uuid in ((live, name0, uuid0), (gone, name1, uuid1)):
        handler.store.begin(ref, [cp.CheckpointedDevice(request="gpus", pool=NODE, device=device, mps=True)])
        await handler.mps.start(ref.uid, MpsLimits(uuids=(uuid,)))
    live_pid, gone_pid = node.pid(live), node.pid(gone)
    del node.claims.objects["gone"]

    restarted = await node.handler()
    # The deleted claim's interrupted prepare is undone by the stale clean-up: its daemon stops.
    assert await restarted.clean_up_stale(older_than=0) == [gone.uid]
    assert not alive(gone_pid)
    assert not node.folder(gone).exists()
    # The live claim's is redone by the kubelet's retry: a fresh daemon, the old one stopped.
    assert (await restarted.prepare([live]))[live.uid].error == ""
    assert not alive(live_pid)
    assert alive(node.pid(live))
    (entry_,) = restarted.store.load()
    assert entry_.state == cp.ClaimState.PREPARE_COMPLETED


async def test_admin_access_never_starts_a_daemon_on_a_gpu_others_may_hold(node: Node) -> None:
    handler = await node.handler()
    ((name, _),) = node.gpus(3)
    ref = node.add_claim("admin", [name], {"multiUser": True}, admin=True)
    error = (await handler.prepare([ref]))[ref.uid].error
    assert f"request gpus: admin access observes device {name} and never reconfigures it" in error
    assert "GpuConfig sharing.strategy MPS cannot apply" in error
    assert not node.folder(ref).exists()
    assert handler.store.load() == []


async def test_multi_user_reaches_the_daemon_and_the_record_a_restart_reads(node: Node) -> None:
    handler = await node.handler()
    ((name, _),) = node.gpus(1)
    ref = node.add_claim("multi", [name], {"multiUser": True})
    assert (await handler.prepare([ref]))[ref.uid].error == ""
    assert (node.folder(ref) / "pipe" / "mode").read_text().strip() == "multi-user yes"
    assert json.loads((node.folder(ref) / "daemon.json").read_text())["multiUser"] is True
    assert (await handler.unprepare([ref]))[ref.uid] == ""
    assert not node.folder(ref).exists()
