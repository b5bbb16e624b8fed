"""GPUs for passthrough at prepare and unprepare, over the simulated node's fake sysfs and NVML (the
real code path): a claim written as KubeVirt's guide writes it binds its GPU to vfio-pci and gets
the IOMMU group's node and vfio's API device, nothing of the GPU driver's; unprepare gives the GPU
back; a GPU or a group that another claim or the host uses is refused before anything is touched;
an interrupted binding is undone at start-up and by the retry."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent import prepare_tools
from dra_node_agent.pci import bound_driver
from dra_node_agent.pci_binding import PciDriverBinding
from dra_node_agent.prepare import PAUSE_ENV, Holds, PrepareHandler
from dra_node_agent.simulated.faketree import FakePciFunction, write_pci_tree
from tests.unit.agent.prepare.simnode import SimulatedNode
from tests.unit.agent.prepare.test_prepare_configs import GPU, NODE, NVIDIA, entry

PROFILES = Path(__file__).parents[4] / "node_agent" / "dra_node_agent" / "profiles"
GPU0 = "0000:1b:00.0"  # gpu-0 and gpu-vfio-0, IOMMU group 40
KUBEVIRT = {
    "apiVersion": NVIDIA,
    "kind": "VfioDeviceConfig",
    "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": True},
}


class Node(SimulatedNode):
    def __init__(self, tmp_path: Path, profile: str | Path = "h100-80gb-x8") -> None:
        super().__init__(tmp_path, profile=profile, passthrough=True)

    async def handler(self, **components: Any) -> PrepareHandler:
        components.setdefault("passthrough", prepare_tools.passthrough(self.backend))
        return await super().handler(**components)

    @property
    def sysfs(self) -> Path:
        return self.backend.hardware().root / "sys"

    @property
    def dev(self) -> Path:
        return self.backend.hardware().root / "dev"

    def driver(self, address: str = GPU0) -> str | None:
        return bound_driver(self.sysfs, address)

    def override(self, address: str = GPU0) -> str | None:
        return PciDriverBinding(self.sysfs).override(address)

    def bindings(self) -> dict[str, tuple[str | None, str | None]]:
        """Each PCI function's driver and driver_override."""
        pci = PciDriverBinding(self.sysfs)
        functions = (self.sysfs / "bus" / "pci" / "devices").iterdir()
        return {p.name: (pci.driver(p.name), pci.override(p.name)) for p in functions}

    def add_claim(
        self,
        name: str,
        devices: list[str],
        configs: list[dict[str, Any]] | None = None,
        *,
        admin: bool = False,
        namespace: str = "ns",
    ) -> ClaimRef:
        uid = f"uid-{name}"
        results = []
        for i, device in enumerate(devices):
            result: dict[str, Any] = {"request": f"r{i}", "driver": GPU, "pool": NODE, "device": device}
            if admin:
                result["adminAccess"] = True
            results.append(result)
        self.claims.objects[name] = {
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results, "config": configs or []}}},
        }
        return ClaimRef(namespace=namespace, name=name, uid=uid)


def spec_of(handler: PrepareHandler, uid: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(handler.cdi.spec_path(uid).read_text())
    return spec


def nodes(edits: dict[str, Any]) -> list[str]:
    return [n["path"] for n in edits.get("deviceNodes", [])]


async def prepare(handler: PrepareHandler, ref: ClaimRef) -> str:
    return (await handler.prepare([ref]))[ref.uid].error


async def test_a_kubevirt_claim_gets_the_group_and_vfios_api_device_and_the_gpu_goes_back(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    ref = node.add_claim("vm", ["gpu-vfio-0"], [entry(GPU, KUBEVIRT, requests=["r0"])])
    assert await prepare(handler, ref) == ""
    assert node.driver() == "vfio-pci"
    assert (node.dev / "vfio" / "40").exists()

    spec = spec_of(handler, ref.uid)
    (device,) = spec["devices"]
    assert nodes(device["containerEdits"]) == ["/dev/vfio/40"]
    # Instead of the GPU driver's nodes, libraries and tools: vfio's container node, and void.
    assert nodes(spec["containerEdits"]) == ["/dev/vfio/vfio"]
    assert "mounts" not in spec["containerEdits"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec["containerEdits"]["env"]
    (recorded,) = handler.store.load()
    assert recorded.devices[0].vfio is not None
    assert recorded.devices[0].vfio.to_json() == {"pciBusID": GPU0, "iommuGroup": 40}

    assert (await handler.unprepare([ref]))[ref.uid] == ""
    assert node.driver() == "nvidia"
    assert node.override() is None
    assert not (node.dev / "vfio" / "40").exists()
    assert handler.store.load() == []


async def test_without_a_config_only_the_groups_node_as_nvidia_defaults(tmp_path: Path) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    ref = node.add_claim("vm", ["gpu-vfio-1"])
    assert await prepare(handler, ref) == ""
    spec = spec_of(handler, ref.uid)
    assert nodes(spec["devices"][0]["containerEdits"]) == ["/dev/vfio/41"]
    assert nodes(spec.get("containerEdits", {})) == []


def _profile(tmp_path: Path, *, iommufd: bool = False, groups: list[int] | None = None) -> Path:
    profile = yaml.safe_load((PROFILES / "h100-80gb-x8.yaml").read_text())
    profile["nvidia"]["iommufd"] = iommufd
    if groups is not None:
        profile["nvidia"]["gpus"][0]["iommuGroups"] = groups
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


async def test_prefer_iommufd_gets_the_cdev_and_dev_iommu(tmp_path: Path) -> None:
    node = Node(tmp_path, _profile(tmp_path, iommufd=True))
    handler = await node.handler()
    config = {"apiVersion": NVIDIA, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "PreferIommuFD"}}
    config["iommu"]["enableAPIDevice"] = True  # type: ignore[index]
    ref = node.add_claim("vm", ["gpu-vfio-0"], [entry(GPU, config)])
    assert await prepare(handler, ref) == ""
    spec = spec_of(handler, ref.uid)
    assert nodes(spec["devices"][0]["containerEdits"]) == ["/dev/vfio/devices/vfio0"]
    assert nodes(spec["containerEdits"]) == ["/dev/iommu"]


async def refused(node: Node, handler: PrepareHandler, ref: ClaimRef) -> str:
    """The prepare's error; nothing recorded for the claim, no spec, no GPU moved."""
    before = node.bindings()
    error = await prepare(handler, ref)
    assert error, "prepare should have failed"
    assert ref.uid not in {e.uid for e in handler.store.load()}
    assert not handler.cdi.spec_path(ref.uid).exists()
    assert node.bindings() == before
    return error


async def test_a_gpu_in_use_by_a_container_is_not_passed_through_nor_the_other_way(tmp_path: Path) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    cuda = node.add_claim("cuda", ["gpu-0"])
    assert await prepare(handler, cuda) == ""
    vm = node.add_claim("vm", ["gpu-vfio-0"], [entry(GPU, KUBEVIRT)])
    error = await refused(node, handler, vm)
    assert "GPU 0000:1b:00.0 (device gpu-vfio-0) would go to a virtual machine with IOMMU group 40" in error
    assert "which holds gpu-0, prepared for claim ns/cuda" in error

    assert (await handler.unprepare([cuda]))[cuda.uid] == ""
    assert await prepare(handler, vm) == ""
    again = node.add_claim("cuda2", ["gpu-0"])
    error = await refused(node, handler, again)
    assert "device gpu-0 is on IOMMU group 40, which claim ns/vm holds for passthrough (gpu-vfio-0)" in error


async def test_a_refusal_for_passthrough_names_no_claim_of_another_namespace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The error reaches the pod's Events: another tenant's claim is counted out, named in the log only.
    node = Node(tmp_path)
    handler = await node.handler()
    cuda = node.add_claim("secret-cuda", ["gpu-0"], namespace="tenant-b")
    assert await prepare(handler, cuda) == ""
    vm = node.add_claim("vm", ["gpu-vfio-0"], [entry(GPU, KUBEVIRT)])
    with caplog.at_level(logging.WARNING, logger="dra_node_agent.prepare.set_up"):
        error = await refused(node, handler, vm)
    assert "which holds gpu-0, prepared for a claim of another namespace" in error
    assert "secret-cuda" not in error
    assert "tenant-b" not in error
    assert "tenant-b/secret-cuda" in caplog.text

    assert (await handler.unprepare([cuda]))[cuda.uid] == ""
    assert await prepare(handler, vm) == ""
    other = node.add_claim("secret-cuda2", ["gpu-0"], namespace="tenant-b")
    error = await refused(node, handler, other)
    assert "which a claim of another namespace holds for passthrough (gpu-vfio-0)" in error
    assert "ns/vm" not in error


async def test_a_group_shared_with_a_function_the_host_uses_is_refused(tmp_path: Path) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    # The GPU's audio function, held by the host's sound driver, in the GPU's group.
    write_pci_tree(
        node.backend.hardware().root,
        [
            FakePciFunction(
                address="0000:1b:00.1",
                vendor=0x10DE,
                device=0x22BA,
                class_code=0x040300,
                iommu_group=40,
                driver="snd_hda_intel",
            )
        ],
    )
    error = await refused(node, handler, node.add_claim("vm", ["gpu-vfio-0"], [entry(GPU, KUBEVIRT)]))
    assert "GPU 0000:1b:00.0 (IOMMU group 40): a virtual machine is given the whole IOMMU group" in error
    assert "0000:1b:00.1 (driver snd_hda_intel), in use on this node" in error


async def test_gpus_sharing_a_group_are_refused_while_the_other_is_the_nvidia_drivers(tmp_path: Path) -> None:
    node = Node(tmp_path, _profile(tmp_path, groups=[7, 7, 8, 9, 10, 11, 12, 13]))
    handler = await node.handler()
    error = await refused(node, handler, node.add_claim("vm", ["gpu-vfio-0"]))
    assert "it also holds 0000:43:00.0 (driver nvidia)" in error


async def test_a_process_holding_the_gpu_keeps_it(tmp_path: Path) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    fd = node.backend.hardware().root / "proc" / "4242" / "fd"  # the host's /proc as the agent sees it
    fd.mkdir(parents=True)
    (fd / "3").symlink_to("/dev/nvidia0")
    error = await refused(node, handler, node.add_claim("vm", ["gpu-vfio-0"]))
    assert "/dev/nvidia0 is open in process(es) 4242" in error


@pytest.mark.parametrize(
    ("devices", "configs", "admin", "words"),
    [
        (["gpu-vfio-0", "gpu-1"], [], False, "also holds gpu-1 for containers"),
        (["gpu-vfio-0"], [], True, "admin access observes a device other claims hold"),
        (
            ["gpu-vfio-0", "gpu-vfio-1"],
            [
                entry(GPU, {"apiVersion": NVIDIA, "kind": "VfioDeviceConfig"}),
                entry(GPU, KUBEVIRT, requests=["r0"]),
            ],
            False,
            "requests r0, r1: their VfioDeviceConfig iommu settings differ",
        ),
    ],
)
async def test_what_a_claim_for_passthrough_cannot_ask(
    tmp_path: Path, devices: list[str], configs: list[dict[str, Any]], admin: bool, words: str
) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    assert words in await refused(node, handler, node.add_claim("vm", devices, configs, admin=admin))


async def test_without_the_tool_a_gpu_for_passthrough_is_refused(tmp_path: Path) -> None:
    node = Node(tmp_path)
    handler = await node.handler(passthrough=None)
    error = await refused(node, handler, node.add_claim("vm", ["gpu-vfio-0"]))
    assert (
        "device gpu-vfio-0 is a GPU for passthrough, and driver gpu.nvidia.com cannot pass GPUs through"
        in error
    )


async def test_without_vfio_pci_loaded_the_claim_says_so(tmp_path: Path) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    for name in ("bind", "unbind"):
        (node.sysfs / "bus/pci/drivers/vfio-pci" / name).unlink()
    error = await refused(node, handler, node.add_claim("vm", ["gpu-vfio-0"]))
    assert "the vfio-pci driver is not loaded on this node (modprobe vfio-pci)" in error


async def test_a_failed_binding_gives_the_gpu_back_and_leaves_no_trace(tmp_path: Path) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    # vfio-pci's bind cannot be written (a folder in its place): the second step fails.
    bind = node.sysfs / "bus/pci/drivers/vfio-pci/bind"
    bind.unlink()
    bind.mkdir()
    ref = node.add_claim("vm", ["gpu-vfio-0"])
    error = await prepare(handler, ref)
    assert "device gpu-vfio-0: GPU 0000:1b:00.0: cannot bind it to vfio-pci" in error
    assert node.driver() == "nvidia"
    assert node.override() is None
    assert handler.store.load() == []


async def test_killed_between_the_binding_steps_the_gpu_goes_back_at_start_up_and_the_retry_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(tmp_path)
    monkeypatch.setenv(PAUSE_ENV, "vfio-unbound")
    handler = await node.handler()
    ref = node.add_claim("vm", ["gpu-vfio-0"], [entry(GPU, KUBEVIRT)])
    task = asyncio.create_task(handler.prepare([ref]))
    marker = tmp_path / "state" / "paused-at-vfio-unbound"
    while not marker.exists():  # noqa: ASYNC110 (the marker is the pause point's only signal)
        await asyncio.sleep(0.05)
    task.cancel()  # the agent is killed here: nothing of the call runs on
    await asyncio.gather(task, return_exceptions=True)
    assert node.driver() is None  # let go by the NVIDIA driver, not yet vfio-pci's
    assert node.override() == "vfio-pci"
    (recorded,) = handler.store.load()
    assert recorded.state.value == "PrepareStarted"

    monkeypatch.delenv(PAUSE_ENV)
    restarted = await node.handler()  # the start-up clean-up gives it back
    assert node.driver() == "nvidia"
    assert node.override() is None
    assert await prepare(restarted, ref) == ""  # the kubelet's retry
    assert node.driver() == "vfio-pci"


async def test_the_holds_are_told_before_the_binding_and_after_the_gpu_goes_back(tmp_path: Path) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    told: list[tuple[Holds, str | None]] = []
    handler.add_holds_listener(lambda holds: told.append((holds, node.driver())))
    inventory = handler.inventory.by_name()

    cuda = node.add_claim("cuda", ["gpu-1"])
    assert await prepare(handler, cuda) == ""
    held = handler.holds
    assert held.in_containers == {"0000:43:00.0"}
    assert not held.published(inventory["gpu-vfio-1"])  # offered for passthrough no more
    assert held.published(inventory["gpu-1"])

    vm = node.add_claim("vm", ["gpu-vfio-0"], [entry(GPU, KUBEVIRT)])
    assert await prepare(handler, vm) == ""
    # Told while the NVIDIA driver still held the GPU: nothing watched it go.
    passthrough = [(h, driver) for h, driver in told if GPU0 in h.passed_through]
    assert passthrough[0][1] == "nvidia"
    held = handler.holds
    assert not held.published(inventory["gpu-0"])
    assert not held.watched(inventory["gpu-0"])
    assert held.published(inventory["gpu-vfio-0"])  # its claim's device stays
    assert not held.watched(inventory["gpu-vfio-0"])  # a VM's GPU is never the monitor's
    assert held.watched(inventory["gpu-2"])

    for ref in (vm, cuda):
        assert (await handler.unprepare([ref]))[ref.uid] == ""
    assert handler.holds == Holds()
    assert told[-1] == (Holds(), "nvidia")


async def test_without_gpus_for_passthrough_nothing_is_tracked(tmp_path: Path) -> None:
    node = SimulatedNode(tmp_path)  # --passthrough-support off: no gpu-vfio devices
    handler = await node.handler(passthrough=prepare_tools.passthrough(node.backend))
    told: list[Holds] = []
    handler.add_holds_listener(told.append)
    node.claims.objects["c"] = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "uid-c"},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "r", "driver": GPU, "pool": NODE, "device": "gpu-0"}]}
            }
        },
    }
    assert await prepare(handler, ClaimRef(namespace="ns", name="c", uid="uid-c")) == ""
    assert told == []
    assert handler.holds == Holds()
