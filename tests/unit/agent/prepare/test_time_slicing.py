"""GpuConfig time-slicing at prepare: set on the GPU, kept while a claim uses it, reset after the last.

The simulated node runs the real code path: compute mode through the (fake) NVML, the time slice
through the host's nvidia-smi stand-in under the simulated driver root; both keep the GPU's state
in files of the simulated hardware, read back here as a test would read the hardware.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent import checkpoint as cp
from dra_node_agent import prepare_tools
from dra_node_agent.prepare import PrepareHandler
from dra_node_agent.simulated.discovery import GPU_STATE_DIR, SIMULATED_DRIVER_ROOT, SimulatedBackend
from dra_node_agent.simulated.fakehw import COMPUTE_MODE_FILE, TIME_SLICE_FILE
from tests.unit.agent.prepare.simnode import SimulatedNode
from tests.unit.agent.prepare.test_prepare_configs import GPU, NODE, NVIDIA, entry

PROFILE = "h100-80gb-x8"


class Node(SimulatedNode):
    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path, profile=PROFILE)

    async def handler(self) -> PrepareHandler:  # type: ignore[override]
        """A fresh handler over the same hardware and state (an agent (re)start)."""
        return await super().handler(gpu_sharing=prepare_tools.gpu_sharing(self.backend))

    def gpu(self, index: int) -> tuple[str, str]:
        """(device name, UUID) of GPU ``index``."""
        devices = sorted(
            (d for d in self.backend.discover_sync().devices if d.kind == "gpu"), key=lambda d: d.name
        )
        return devices[index].name, devices[index].uuid

    def state(self, uuid: str) -> tuple[int, int]:
        """(compute mode, time slice) as the GPU holds them."""
        folder = self.tmp_path / "hw" / GPU_STATE_DIR / uuid
        return int((folder / COMPUTE_MODE_FILE).read_text()), int((folder / TIME_SLICE_FILE).read_text())

    def add_claim(
        self,
        name: str,
        devices: list[str],
        *,
        interval: str | None,
        admin: bool = False,
        shared: bool = False,
        namespace: str = "ns",
    ) -> ClaimRef:
        config: list[dict[str, Any]] = []
        if interval is not None:
            sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}
            config.append(entry(GPU, {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": sharing}))
        results: list[dict[str, Any]] = [
            {"request": "gpus", "driver": GPU, "pool": NODE, "device": d} for d in devices
        ]
        for result in results:
            if admin:
                result["adminAccess"] = True
            if shared:  # a consumable-capacity share: claims may hold one GPU together
                result["shareID"] = f"share-{name}"
        uid = f"uid-{name}"
        self.claims.objects[name] = {
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results, "config": config}}},
        }
        return ClaimRef(namespace=namespace, name=name, uid=uid)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


async def prepared(handler: PrepareHandler, ref: ClaimRef) -> None:
    result = (await handler.prepare([ref]))[ref.uid]
    assert result.error == "", result.error


async def test_the_interval_is_set_at_prepare_and_reset_at_unprepare(node: Node) -> None:
    handler = await node.handler()
    (name0, uuid0), (name1, uuid1) = node.gpu(0), node.gpu(1)
    # An administrator had set the GPU exclusive; sharing needs the default compute mode.
    hardware = node.backend.hardware()
    assert hardware.nvml is not None
    hardware.nvml.gpus[0].compute_mode = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    ref = node.add_claim("c", [name0, name1], interval="Long")

    await prepared(handler, ref)
    assert node.state(uuid0) == (pynvml.NVML_COMPUTEMODE_DEFAULT, 3)
    assert node.state(uuid1) == (pynvml.NVML_COMPUTEMODE_DEFAULT, 3)
    (recorded,) = handler.store.load()
    assert [d.time_slice for d in recorded.devices] == ["Long", "Long"]
    # Another GPU is untouched.
    assert node.state(node.gpu(2)[1]) == (pynvml.NVML_COMPUTEMODE_DEFAULT, 0)

    assert (await handler.unprepare([ref]))[ref.uid] == ""
    assert node.state(uuid0) == (pynvml.NVML_COMPUTEMODE_DEFAULT, 0)
    assert node.state(uuid1) == (pynvml.NVML_COMPUTEMODE_DEFAULT, 0)


async def test_time_slicing_without_an_interval_is_default_and_no_config_touches_nothing(node: Node) -> None:
    handler = await node.handler()
    name, uuid = node.gpu(0)
    plain = node.add_claim("plain", [name], interval=None)
    await prepared(handler, plain)
    assert handler.device_setups == 1
    assert node.state(uuid) == (pynvml.NVML_COMPUTEMODE_DEFAULT, 0)
    (recorded,) = handler.store.load()
    assert recorded.devices[0].time_slice is None
    await handler.unprepare([plain])

    sharing = {"strategy": "TimeSlicing"}
    ref = node.add_claim("ts", [name], interval=None)
    node.claims.objects["ts"]["status"]["allocation"]["devices"]["config"] = [
        entry(GPU, {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": sharing})
    ]
    await prepared(handler, ref)
    (recorded,) = handler.store.load()
    assert recorded.devices[0].time_slice == "Default"


async def test_the_slice_stays_while_another_claim_holds_the_gpu_with_it(node: Node) -> None:
    handler = await node.handler()
    name, uuid = node.gpu(0)
    # Claims holding consumable-capacity shares of one GPU hold it together.
    first = node.add_claim("first", [name], interval="Medium", shared=True)
    second = node.add_claim("second", [name], interval="Medium", shared=True)
    await prepared(handler, first)
    await prepared(handler, second)
    assert node.state(uuid)[1] == 2

    await handler.unprepare([first])
    assert node.state(uuid)[1] == 2, "reset while the second claim still uses the slice"
    await handler.unprepare([second])
    assert node.state(uuid)[1] == 0


async def test_two_claims_asking_one_gpu_for_different_slices_fail_the_second(node: Node) -> None:
    handler = await node.handler()
    name, uuid = node.gpu(0)
    first = node.add_claim("first", [name], interval="Short", shared=True)
    second = node.add_claim("second", [name], interval="Long", shared=True)
    await prepared(handler, first)

    error = (await handler.prepare([second]))[second.uid].error
    assert "ResourceClaim ns/second" in error
    assert (
        "request gpus: GpuConfig sharing.timeSlicingConfig.interval Long conflicts with interval Short"
        in error
    )
    assert "claim ns/first (request gpus)" in error
    # Nothing of the refused claim is left, and the first claim's slice is as it set it.
    assert [e.uid for e in handler.store.load()] == [first.uid]
    assert not handler.cdi.spec_path(second.uid).exists()
    assert node.state(uuid)[1] == 1


async def test_another_tenants_slice_on_a_shared_gpu_is_given_but_its_claim_not_named(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    handler = await node.handler()
    name, uuid = node.gpu(0)
    first = node.add_claim("secret-first", [name], interval="Short", shared=True, namespace="team-a")
    second = node.add_claim("second", [name], interval="Long", shared=True, namespace="team-b")
    await prepared(handler, first)

    error = (await handler.prepare([second]))[second.uid].error
    # What the GPU is set to is the GPU's; whose claim set it is not this tenant's to know.
    assert "conflicts with interval Short that a claim of another namespace set on GPU" in error
    assert "team-a" not in error
    assert "secret-first" not in error
    assert "team-a/secret-first (request gpus)" in caplog.text
    assert node.state(uuid)[1] == 1


async def test_a_failing_nvidia_smi_fails_the_prepare_with_its_message_and_leaves_nothing(node: Node) -> None:
    handler = await node.handler()
    name, uuid = node.gpu(0)
    tool = node.tmp_path / "hw" / SIMULATED_DRIVER_ROOT / "usr/bin/nvidia-smi"
    original = tool.read_text()
    tool.write_text("#!/bin/sh\necho 'Unable to set the timeslice: Not Supported' >&2\nexit 3\n")
    ref = node.add_claim("c", [name], interval="Long")

    error = (await handler.prepare([ref]))[ref.uid].error
    assert "request gpus: GpuConfig sharing.timeSlicingConfig.interval Long could not be applied" in error
    assert "failed (exit 3): Unable to set the timeslice: Not Supported" in error
    assert handler.store.load() == []
    assert not handler.cdi.spec_path(ref.uid).exists()

    # Once the tool works, the kubelet's retry prepares the claim.
    tool.write_text(original)
    await prepared(handler, ref)
    assert node.state(uuid)[1] == 3


async def test_no_nvidia_smi_under_the_driver_root_says_where_it_looked(node: Node) -> None:
    handler = await node.handler()
    name, _ = node.gpu(0)
    (node.tmp_path / "hw" / SIMULATED_DRIVER_ROOT / "usr/bin/nvidia-smi").unlink()
    handler.gpu_sharing = prepare_tools.gpu_sharing(node.backend)
    ref = node.add_claim("c", [name], interval="Short")
    error = (await handler.prepare([ref]))[ref.uid].error
    assert "time-slicing needs nvidia-smi, and the driver root" in error
    assert "--driver-root" in error
    assert handler.store.load() == []


async def test_a_crash_after_the_set_up_is_undone_for_a_deleted_claim_and_redone_for_a_live_one(
    node: Node,
) -> None:
    name0, uuid0 = node.gpu(0)
    name1, uuid1 = node.gpu(1)
    handler = await node.handler()
    gone = node.add_claim("gone", [name0], interval="Long")
    live = node.add_claim("live", [name1], interval="Medium")
    # What a crash between set-up and PrepareCompleted leaves: PrepareStarted with the devices
    # recorded (they are, before the GPU is touched) and the slices set.
    for ref, device, interval, uuid in ((gone, name0, "Long", uuid0), (live, name1, "Medium", uuid1)):
        planned = [cp.CheckpointedDevice(request="gpus", pool=NODE, device=device, time_slice=interval)]
        handler.store.begin(ref, planned)
        assert handler.gpu_sharing is not None
        await handler.gpu_sharing.set_time_slice([uuid], interval)
    assert (node.state(uuid0)[1], node.state(uuid1)[1]) == (3, 2)
    del node.claims.objects["gone"]

    restarted = await node.handler()
    assert await restarted.clean_up_stale(older_than=0) == [gone.uid]
    assert node.state(uuid0)[1] == 0, "the deleted claim's slice was not reset"
    assert node.state(uuid1)[1] == 2, "the live claim's slice was reset before its retry"
    await prepared(restarted, live)
    assert node.state(uuid1)[1] == 2
    (entry_,) = restarted.store.load()
    assert entry_.state == cp.ClaimState.PREPARE_COMPLETED


async def test_the_gpu_settings_outlive_the_agent_as_on_hardware(node: Node) -> None:
    handler = await node.handler()
    name, uuid = node.gpu(0)
    ref = node.add_claim("c", [name], interval="Short")
    await prepared(handler, ref)
    # A new simulated backend over the same folder (an agent restart) sees the GPU as it was left.
    again = SimulatedBackend(profile=PROFILE, node_name=NODE, state_dir=node.tmp_path / "hw", driver=GPU)
    hardware = again.hardware()
    assert hardware.nvml is not None
    by_uuid = {g.uuid: g for g in hardware.nvml.gpus}
    assert by_uuid[uuid].compute_mode == pynvml.NVML_COMPUTEMODE_DEFAULT
    assert node.state(uuid)[1] == 1
    restarted = await node.handler()
    assert (await restarted.unprepare([ref]))[ref.uid] == ""
    assert node.state(uuid)[1] == 0


async def test_admin_access_observes_the_gpu_and_never_sets_its_slice_or_compute_mode(node: Node) -> None:
    handler = await node.handler()
    name, uuid = node.gpu(0)
    workload = node.add_claim("workload", [name], interval="Long")
    await prepared(handler, workload)
    assert node.state(uuid) == (pynvml.NVML_COMPUTEMODE_DEFAULT, 3)

    # An admin-access claim that asks for a slice is refused, saying why; the GPU is as it was.
    asks = node.add_claim("asks", [name], interval="Short", admin=True)
    error = (await handler.prepare([asks]))[asks.uid].error
    assert (
        f"ResourceClaim ns/asks (uid {asks.uid}): request gpus: admin access observes device {name} and "
        "never reconfigures it (other claims may hold it), so GpuConfig sharing.strategy TimeSlicing "
        "cannot apply; leave sharing out of admin-access requests"
    ) == error
    assert node.state(uuid) == (pynvml.NVML_COMPUTEMODE_DEFAULT, 3)
    # One that asks nothing is prepared beside the workload, and its unprepare resets nothing.
    observer = node.add_claim("observer", [name], interval=None, admin=True)
    await prepared(handler, observer)
    assert (await handler.unprepare([observer]))[observer.uid] == ""
    assert node.state(uuid) == (pynvml.NVML_COMPUTEMODE_DEFAULT, 3)
    assert (await handler.unprepare([workload]))[workload.uid] == ""
    assert node.state(uuid)[1] == 0
