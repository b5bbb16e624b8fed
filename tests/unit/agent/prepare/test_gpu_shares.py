"""Prepare of GPU shares (``--consumable-shares``): claims of different namespaces hold shares of one
GPU; each share's ID and consumed capacity are in its checkpoint entry and its CDI spec; the shares
recorded on a GPU never exceed what it has; an exclusive claim and shares never meet on a GPU;
MPS on a share is bounded by the share; one share's unprepare leaves the others as they were.

The node is simulated (the fake NVML, the driver root's MPS stand-in) and runs the agent's code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent import prepare_tools
from dra_node_agent.prepare import PrepareHandler
from dra_node_agent.simulated.discovery import SimulatedBackend
from tests import mps_cgroup
from tests.unit.agent.prepare.simnode import SimulatedNode
from tests.unit.agent.prepare.test_mps import alive
from tests.unit.agent.prepare.test_prepare_configs import GPU, NODE, NVIDIA, entry

GIB = 1 << 30


class Node(SimulatedNode):
    def __init__(self, tmp_path: Path, *, mode: str) -> None:
        super().__init__(tmp_path)
        self.backend = SimulatedBackend(
            profile="h100-80gb-x8",
            node_name=NODE,
            state_dir=tmp_path / "hw",
            driver=GPU,
            consumable_shares=mode,
        )

    async def handler(self) -> PrepareHandler:  # type: ignore[override]
        return await super().handler(
            gpu_sharing=prepare_tools.gpu_sharing(self.backend),
            mps=prepare_tools.mps_daemons(
                self.backend, self.tmp_path / "state" / "mps", mps_cgroup.options()
            ),
        )

    def add(
        self,
        name: str,
        *,
        namespace: str = "ns",
        consumed: dict[str, str] | None,
        device: str = "gpu-0",
        sharing: dict[str, Any] | None = None,
    ) -> ClaimRef:
        """A claim holding ``device``: a share consuming ``consumed`` (None: the whole device, no share)."""
        uid = f"00000000-0000-4000-8000-{len(self.claims.objects):012d}"
        result: dict[str, Any] = {"request": "gpu", "driver": GPU, "pool": NODE, "device": device}
        if consumed is not None:
            result["shareID"] = uid.replace("-4000-", "-4111-")
            result["consumedCapacity"] = consumed
        config = []
        if sharing is not None:
            config.append(entry(GPU, {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": sharing}))
        self.claims.objects[name] = {
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [result], "config": config}}},
        }
        return ClaimRef(namespace=namespace, name=name, uid=uid)


@pytest.fixture
async def node(tmp_path: Path) -> Any:
    created = Node(tmp_path, mode="memory")
    yield created
    mps_cgroup.clean_up(tmp_path / "state" / "mps")


def spec_env(handler: PrepareHandler, uid: str) -> list[str]:
    spec = json.loads(handler.cdi.spec_path(uid).read_text())
    return [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]


async def prepare(handler: PrepareHandler, ref: ClaimRef) -> str:
    return (await handler.prepare([ref]))[ref.uid].error


async def test_two_tenants_shares_of_one_gpu_are_prepared_recorded_and_unprepared_apart(node: Node) -> None:
    handler = await node.handler()
    first = node.add("a", namespace="team-a", consumed={"memory": "10Gi"})
    second = node.add("b", namespace="team-b", consumed={"memory": "30Gi"})
    answers = await handler.prepare([first, second])
    assert [answers[r.uid].error for r in (first, second)] == ["", ""]
    for ref, amount in ((first, "10Gi"), (second, "30Gi")):
        (device,) = answers[ref.uid].devices
        share = node.claims.objects[ref.name]["status"]["allocation"]["devices"]["results"][0]["shareID"]
        assert (device.device, device.share_id) == ("gpu-0", share)
        recorded = handler.store.get(ref.uid)
        assert recorded is not None
        (held,) = recorded.devices
        assert (held.shared, held.share_id, held.consumed) == (
            True,
            share,
            (("memory", int(amount[:2]) * GIB),),
        )
        env = spec_env(handler, ref.uid)
        assert f"DRA_SHARE_GPU_0_ID={share}" in env
        assert f"DRA_SHARE_GPU_0_MEMORY={amount}" in env
    # No MPS asked: the shares are accounting only, nothing is started.
    assert not (node.tmp_path / "state" / "mps").exists() or not any(
        (node.tmp_path / "state" / "mps").iterdir()
    )

    assert (await handler.unprepare([first]))[first.uid] == ""
    assert handler.store.get(first.uid) is None
    assert not handler.cdi.spec_path(first.uid).exists()
    assert handler.store.get(second.uid) is not None
    assert handler.cdi.spec_path(second.uid).exists()


async def test_shares_beyond_the_gpus_memory_are_refused_without_naming_other_tenants(node: Node) -> None:
    handler = await node.handler()
    held = node.add("held", namespace="team-a", consumed={"memory": "60Gi"})
    assert await prepare(handler, held) == ""
    # An allocator with a stale view gave 30Gi more of the 81559Mi GPU.
    beyond = node.add("beyond", namespace="team-b", consumed={"memory": "30Gi"})
    error = await prepare(handler, beyond)
    assert "ResourceClaim team-b/beyond" in error
    assert (
        "device gpu-0: its shares would consume 90Gi of its memory 81559Mi (30Gi for this claim, 60Gi for 1"
        in error
    )
    assert "team-a" not in error
    assert handler.store.get(beyond.uid) is None
    assert not handler.cdi.spec_path(beyond.uid).exists()
    # A share that fits still does.
    assert await prepare(handler, node.add("fits", namespace="team-b", consumed={"memory": "15Gi"})) == ""


async def test_an_exclusive_claim_and_shares_never_meet_on_a_gpu(node: Node) -> None:
    handler = await node.handler()
    whole = node.add("whole", consumed=None)
    assert await prepare(handler, whole) == ""
    error = await prepare(handler, node.add("share", consumed={"memory": "1Gi"}))
    assert "device node-a/gpu-0 is already prepared for claim ns/whole" in error
    assert (await handler.unprepare([whole]))[whole.uid] == ""
    assert await prepare(handler, node.add("share-2", consumed={"memory": "1Gi"})) == ""
    error = await prepare(handler, node.add("whole-2", consumed=None))
    assert "device node-a/gpu-0 is already prepared for claim ns/share-2" in error


async def test_a_clash_with_another_tenants_claim_does_not_name_it(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    handler = await node.handler()
    held = node.add("secret-share", namespace="team-a", consumed={"memory": "1Gi"})
    assert await prepare(handler, held) == ""
    # An exclusive claim of another tenant on the GPU (an allocator that ignored the policy).
    error = await prepare(handler, node.add("whole", namespace="team-b", consumed=None))
    assert "device node-a/gpu-0 is already prepared for a claim of another namespace" in error
    assert "team-a" not in error
    assert "secret-share" not in error
    assert held.uid not in error
    # The operator of the node still learns which claim holds it.
    assert "team-a/secret-share" in caplog.text


async def test_mps_on_a_share_is_bounded_by_it_and_each_shares_daemon_is_its_own(node: Node) -> None:
    handler = await node.handler()
    first = node.add("a", namespace="team-a", consumed={"memory": "10Gi"}, sharing={"strategy": "MPS"})
    second = node.add(
        "b",
        namespace="team-b",
        consumed={"memory": "20Gi"},
        sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "8Gi"}},
    )
    assert await prepare(handler, first) == ""
    assert await prepare(handler, second) == ""
    uuid = next(d.uuid for d in node.backend.discover_sync().devices if d.name == "gpu-0")
    folders = {r.name: node.tmp_path / "state" / "mps" / r.uid for r in (first, second)}
    # The share's memory is the limit when the config sets none; a smaller one is kept.
    settings = {n: (f / "pipe" / "settings").read_text().splitlines() for n, f in folders.items()}
    assert f"set_default_device_pinned_mem_limit {uuid} 10240M" in settings["a"]
    assert f"set_default_device_pinned_mem_limit {uuid} 8192M" in settings["b"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M" in spec_env(handler, first.uid)
    # Each claim's containers get their own daemon's folders, never the other's.
    mounts = {
        r.name: {
            m["hostPath"]
            for d in json.loads(handler.cdi.spec_path(r.uid).read_text())["devices"]
            for m in d["containerEdits"].get("mounts", [])
        }
        for r in (first, second)
    }
    assert mounts["a"] == {str(folders["a"] / "pipe"), str(folders["a"] / "shm")}
    assert mounts["b"] == {str(folders["b"] / "pipe"), str(folders["b"] / "shm")}
    pids = {n: int(json.loads((f / "daemon.json").read_text())["pid"]) for n, f in folders.items()}

    # One share goes: its daemon stops, the other's runs on.
    assert (await handler.unprepare([first]))[first.uid] == ""
    assert not folders["a"].exists()
    assert alive(pids["b"])
    assert (folders["b"] / "pipe" / "control").exists()
    assert (await handler.unprepare([second]))[second.uid] == ""


async def test_an_mps_limit_beyond_the_share_is_refused_naming_the_field(node: Node) -> None:
    handler = await node.handler()
    ref = node.add(
        "greedy",
        consumed={"memory": "10Gi"},
        sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "20Gi"}},
    )
    error = await prepare(handler, ref)
    assert (
        "request gpu: GpuConfig sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 20Gi on GPU 0 is more "
        "than the claim's share of its memory (10Gi); ask for at most the share"
    ) in error
    assert handler.store.get(ref.uid) is None
    assert not (node.tmp_path / "state" / "mps" / ref.uid).exists()


async def test_with_a_number_of_shares_mps_threads_follow_the_claims_part(tmp_path: Path) -> None:
    node = Node(tmp_path, mode="4")
    try:
        handler = await node.handler()
        one = node.add("one", consumed={"memory": "0", "shares": "1"}, sharing={"strategy": "MPS"})
        assert await prepare(handler, one) == ""
        env = spec_env(handler, one.uid)
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env
        assert "DRA_SHARE_GPU_0_SHARES=1" in env
        assert not any(e.startswith("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=") for e in env), env
        greedy = node.add(
            "greedy",
            consumed={"memory": "0", "shares": "1"},
            sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
        )
        error = await prepare(handler, greedy)
        assert (
            "defaultActiveThreadPercentage: 50 is more than the claim's share of its GPUs' threads (25%"
            in error
        )
    finally:
        mps_cgroup.clean_up(tmp_path / "state" / "mps")
