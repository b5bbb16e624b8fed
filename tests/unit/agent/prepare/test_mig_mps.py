"""MigDeviceConfig MPS at prepare: one control daemon per claim over its MIG devices, with the
limits per MIG device, run and stopped by the same code as whole-GPU MPS (its own session, cgroup,
mount namespace and shm tmpfs); a claim that would need one daemon over GPUs and MIG devices at
once is refused, as is MPS asked by a request with admin access."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent import prepare_tools
from dra_node_agent.prepare import PrepareHandler
from tests import mps_cgroup
from tests.unit.agent.prepare.simnode import SimulatedNode
from tests.unit.agent.prepare.test_mps import alive
from tests.unit.agent.prepare.test_prepare_configs import GPU, NODE, NVIDIA, entry


class Node(SimulatedNode):
    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path, profile="a100-40gb-mig")

    async def handler(self) -> PrepareHandler:  # type: ignore[override]
        return await super().handler(
            gpu_sharing=prepare_tools.gpu_sharing(self.backend),
            mps=prepare_tools.mps_daemons(
                self.backend, self.tmp_path / "state" / "mps", mps_cgroup.options()
            ),
        )

    def migs(self, parent_minor: int) -> list[tuple[str, str, str]]:
        """(device name, MIG UUID, local id) of the MIG devices of GPU ``parent_minor``."""
        devices = self.backend.discover_sync().devices
        return sorted(
            (d.name, d.uuid, d.local_id)
            for d in devices
            if d.kind == "mig" and d.local_id.startswith(f"{parent_minor}:")
        )

    def add(
        self, name: str, devices: list[tuple[str, str]], sharing: dict[str, Any], *, admin: bool = False
    ) -> ClaimRef:
        """A claim of (request, device) results whose MIG devices ask ``sharing`` of MigDeviceConfig."""
        uid = f"uid-{name}"
        results: list[dict[str, Any]] = []
        for request, device in devices:
            result: dict[str, Any] = {"request": request, "driver": GPU, "pool": NODE, "device": device}
            if admin:
                result["adminAccess"] = True
            results.append(result)
        config = [entry(GPU, {"apiVersion": NVIDIA, "kind": "MigDeviceConfig", "sharing": sharing})]
        self.claims.objects[name] = {
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results, "config": config}}},
        }
        return ClaimRef(namespace="ns", name=name, uid=uid)


@pytest.fixture
async def node(tmp_path: Path) -> Any:
    created = Node(tmp_path)
    yield created
    mps_cgroup.clean_up(tmp_path / "state" / "mps")


async def test_one_daemon_serves_the_claims_mig_devices_with_a_limit_for_each(node: Node) -> None:
    handler = await node.handler()
    (first, first_uuid, _), (second, second_uuid, second_id) = node.migs(1)[:2]
    sharing = {
        "strategy": "MPS",
        "mpsConfig": {
            "defaultActiveThreadPercentage": 30,
            "defaultPinnedDeviceMemoryLimit": "2Gi",
            # A MIG device by its UUID, or by <GPU minor>:<GPU instance>:<compute instance>.
            "defaultPerDevicePinnedMemoryLimit": {second_id: "1Gi"},
        },
    }
    ref = node.add("c", [("mig", first), ("mig", second)], sharing)
    assert (await handler.prepare([ref]))[ref.uid].error == ""

    folder = node.tmp_path / "state" / "mps" / ref.uid
    record = json.loads((folder / "daemon.json").read_text())
    assert alive(int(record["pid"]))
    uuids = record["uuids"]
    assert sorted(uuids) == sorted([first_uuid, second_uuid])
    settings = (folder / "pipe" / "settings").read_text().splitlines()
    assert settings[0] == f"devices {','.join(uuids)}"  # CUDA_VISIBLE_DEVICES: the MIG devices
    assert "set_default_active_thread_percentage 30" in settings
    assert f"set_default_device_pinned_mem_limit {first_uuid} 2048M" in settings
    assert f"set_default_device_pinned_mem_limit {second_uuid} 1024M" in settings
    spec = json.loads(handler.cdi.spec_path(ref.uid).read_text())
    env = [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in env
    limits = {f"{i}={2048 if u == first_uuid else 1024}M" for i, u in enumerate(uuids)}
    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={','.join(sorted(limits))}" in env
    (recorded,) = handler.store.load()
    assert [d.mps for d in recorded.devices] == [True, True]

    assert (await handler.unprepare([ref]))[ref.uid] == ""
    assert not alive(int(record["pid"]))
    assert not folder.exists()


async def test_mps_on_mig_devices_and_whole_gpus_of_one_claim_is_refused(node: Node) -> None:
    handler = await node.handler()
    (mig, _, _) = node.migs(0)[0]
    gpu = next(d.name for d in node.backend.discover_sync().devices if d.kind == "gpu")
    ref = node.add("mixed", [("mig", mig), ("gpu", gpu)], {"strategy": "MPS"})
    both = {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    node.claims.objects["mixed"]["status"]["allocation"]["devices"]["config"].append(entry(GPU, both))
    error = (await handler.prepare([ref]))[ref.uid].error
    assert "GpuConfig and MigDeviceConfig both ask for MPS" in error
    assert "over either whole GPUs or MIG devices" in error
    assert handler.store.load() == []
    assert not (node.tmp_path / "state" / "mps" / ref.uid).exists()


async def test_a_limit_for_a_mig_device_the_claim_lacks_and_admin_access_are_refused(node: Node) -> None:
    handler = await node.handler()
    (mig, _, local), (other, _, other_id) = node.migs(0)[:2]
    ref = node.add(
        "c",
        [("mig", mig)],
        {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {other_id: "1Gi"}}},
    )
    error = (await handler.prepare([ref]))[ref.uid].error
    assert (
        f"request mig: MigDeviceConfig sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.{other_id}"
        in error
    )
    assert f"names no GPU of this claim; its GPUs are {local} (" in error
    admin = node.add("admin", [("mig", other)], {"strategy": "MPS"}, admin=True)
    error = (await handler.prepare([admin]))[admin.uid].error
    assert "so MigDeviceConfig sharing.strategy MPS cannot apply" in error
    assert handler.store.load() == []
