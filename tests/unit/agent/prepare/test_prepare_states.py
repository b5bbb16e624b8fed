"""The prepare/unprepare state machine without a cluster.

Devices come from the simulated backend (fake hardware); claims are plain v1 ResourceClaim JSON
handed over by a stand-in for the claim reader (the part that GETs them is tested against the real
control plane in tests/integration/agent).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent import checkpoint as cp
from dra_node_agent.claim_reader import ClaimAllocation, ClaimGone, driver_allocation
from dra_node_agent.prepare import PAUSE_ENV, PrepareHandler
from dra_node_agent.simulated.discovery import SimulatedBackend

DRIVER = "gpu.nvidia.com"
NODE = "node-a"


class ClaimsByUID:
    """Returns claims from a dict, as the API server would (or a 404-style error)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0

    async def read(self, ref: ClaimRef) -> ClaimAllocation:
        self.reads += 1
        obj = self.objects.get((ref.namespace, ref.name))
        if obj is None:
            raise ClaimGone(f"ResourceClaim {ref.namespace}/{ref.name}: not found")
        return driver_allocation(ref=ref, obj=obj, driver=DRIVER)


def claim_json(
    name: str,
    uid: str,
    results: list[tuple[str, str]],
    *,
    config: list[dict[str, Any]] | None = None,
    allocated: bool = True,
    pool: str = NODE,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
        "status": {},
    }
    if allocated:
        obj["status"]["allocation"] = {
            "devices": {
                "results": [
                    {"request": request, "driver": driver, "pool": pool, "device": device}
                    for request, device in results
                    for driver in [DRIVER if device.startswith("gpu") else "tpu.google.com"]
                ],
                "config": config or [],
            }
        }
    return obj


def ref(name: str, uid: str) -> ClaimRef:
    return ClaimRef(namespace="ns", name=name, uid=uid)


@pytest.fixture
def boot_id(tmp_path: Path) -> Path:
    path = tmp_path / "proc/sys/kernel/random/boot_id"
    path.parent.mkdir(parents=True)
    path.write_text("boot-1\n")
    return path


@pytest.fixture
async def inventory(tmp_path: Path) -> Any:
    backend = SimulatedBackend(
        profile="h100-80gb-x8", node_name=NODE, state_dir=tmp_path / "hw", driver=DRIVER
    )
    return await backend.discover()


@pytest.fixture
def claims() -> ClaimsByUID:
    return ClaimsByUID()


def make_handler(tmp_path: Path, inventory: Any, claims: ClaimsByUID) -> PrepareHandler:
    return PrepareHandler(
        driver=DRIVER,
        node_name=NODE,
        inventory=inventory,
        claims=claims,
        state_dir=tmp_path / "state" / DRIVER,
        cdi_dir=tmp_path / "cdi",
        proc_root=tmp_path / "proc",
    )


@pytest.fixture
async def handler(tmp_path: Path, inventory: Any, claims: ClaimsByUID, boot_id: Path) -> PrepareHandler:
    h = make_handler(tmp_path, inventory, claims)
    await h.start()
    return h


def _errors(operation: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "dra_agent_claim_operation_errors_total",
        {"driver": DRIVER, "operation": operation, "reason": reason},
    )
    return value or 0.0


def _checkpoint_errors(operation: str) -> float:
    value = REGISTRY.get_sample_value(
        "dra_agent_checkpoint_errors_total", {"driver": DRIVER, "operation": operation}
    )
    return value or 0.0


async def test_prepare_writes_cdi_and_completes(handler: PrepareHandler, claims: ClaimsByUID) -> None:
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-0"), ("gpu", "gpu-1")])
    result = (await handler.prepare([ref("c1", "uid-1")]))["uid-1"]
    assert result.error == ""
    assert [(d.requests, d.pool, d.device) for d in result.devices] == [
        (("gpu",), NODE, "gpu-0"),
        (("gpu",), NODE, "gpu-1"),
    ]
    assert result.devices[0].cdi_device_ids == ("k8s.gpu.nvidia.com/claim=uid-1-gpu-0",)
    spec = json.loads(handler.cdi.spec_path("uid-1").read_text())
    assert [d["name"] for d in spec["devices"]] == ["uid-1-gpu-0", "uid-1-gpu-1"]
    entry = handler.store.get("uid-1")
    assert entry is not None
    assert entry.state == cp.ClaimState.PREPARE_COMPLETED


async def test_prepare_is_idempotent(handler: PrepareHandler, claims: ClaimsByUID) -> None:
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-0")])
    first = await handler.prepare([ref("c1", "uid-1")])
    spec = handler.cdi.spec_path("uid-1")
    written = spec.stat().st_mtime_ns, spec.stat().st_ino
    again = await handler.prepare([ref("c1", "uid-1")])
    assert again == first
    assert (spec.stat().st_mtime_ns, spec.stat().st_ino) == written
    assert handler.device_setups == 1
    assert claims.reads == 1  # the second answer came from the checkpoint
    assert [e.uid for e in handler.store.load()] == ["uid-1"]


async def test_prepare_survives_a_new_handler(
    tmp_path: Path, inventory: Any, claims: ClaimsByUID, handler: PrepareHandler
) -> None:
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-3")])
    first = await handler.prepare([ref("c1", "uid-1")])
    restarted = make_handler(tmp_path, inventory, claims)
    await restarted.start()
    assert await restarted.prepare([ref("c1", "uid-1")]) == first
    assert restarted.device_setups == 0


async def test_replaced_claim_is_refused(handler: PrepareHandler, claims: ClaimsByUID) -> None:
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-new", [("gpu", "gpu-0")])
    result = (await handler.prepare([ref("c1", "uid-old")]))["uid-old"]
    assert "uid uid-new" in result.error
    assert "replaced" in result.error
    assert handler.store.load() == []


async def test_unallocated_claim_is_refused(handler: PrepareHandler, claims: ClaimsByUID) -> None:
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [], allocated=False)
    result = (await handler.prepare([ref("c1", "uid-1")]))["uid-1"]
    assert "not allocated" in result.error


async def test_device_of_another_node_is_refused(handler: PrepareHandler, claims: ClaimsByUID) -> None:
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-0")], pool="node-b")
    result = (await handler.prepare([ref("c1", "uid-1")]))["uid-1"]
    assert "node-b/gpu-0" in result.error
    assert "not published by node node-a" in result.error
    assert handler.store.load() == []


async def test_other_drivers_results_are_ignored(handler: PrepareHandler, claims: ClaimsByUID) -> None:
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-2"), ("tpu", "tpu-0")])
    result = (await handler.prepare([ref("c1", "uid-1")]))["uid-1"]
    assert [d.device for d in result.devices] == ["gpu-2"]


async def test_invalid_opaque_config_names_the_field(handler: PrepareHandler, claims: ClaimsByUID) -> None:
    config = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "bogus": 1},
            },
        },
        # Another driver's config is not ours to judge.
        {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {"anything": True}}},
    ]
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-0")], config=config)
    result = (await handler.prepare([ref("c1", "uid-1")]))["uid-1"]
    assert "bogus" in result.error
    assert "unknown field" in result.error
    assert handler.store.load() == []
    assert not handler.cdi.spec_path("uid-1").exists()


async def test_valid_opaque_config_is_accepted(handler: PrepareHandler, claims: ClaimsByUID) -> None:
    # A GpuConfig without sharing asks for nothing this driver lacks (sharing itself is refused as
    # not implemented: tests/unit/agent/prepare/test_prepare_configs.py).
    config = [
        {
            "source": "FromClass",
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"},
            },
        }
    ]
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-0")], config=config)
    assert (await handler.prepare([ref("c1", "uid-1")]))["uid-1"].error == ""


async def test_device_held_by_another_claim_is_refused(handler: PrepareHandler, claims: ClaimsByUID) -> None:
    claims.objects[("ns", "a")] = claim_json("a", "uid-a", [("gpu", "gpu-0")])
    claims.objects[("ns", "b")] = claim_json("b", "uid-b", [("gpu", "gpu-0")])
    assert (await handler.prepare([ref("a", "uid-a")]))["uid-a"].error == ""
    busy_before = _errors("prepare", "device-busy")
    refused = (await handler.prepare([ref("b", "uid-b")]))["uid-b"]
    assert "gpu-0" in refused.error
    assert "ns/a" in refused.error
    assert _errors("prepare", "device-busy") == busy_before + 1
    assert not handler.cdi.spec_path("uid-b").exists()
    assert (await handler.unprepare([ref("a", "uid-a")])) == {"uid-a": ""}
    assert (await handler.prepare([ref("b", "uid-b")]))["uid-b"].error == ""


async def test_errors_stay_with_their_claim(handler: PrepareHandler, claims: ClaimsByUID) -> None:
    claims.objects[("ns", "good")] = claim_json("good", "uid-good", [("gpu", "gpu-4")])
    results = await handler.prepare([ref("missing", "uid-missing"), ref("good", "uid-good")])
    assert "not found" in results["uid-missing"].error
    assert results["uid-good"].error == ""
    assert results["uid-good"].devices


async def test_unprepare_removes_spec_and_entry_and_is_idempotent(
    handler: PrepareHandler, claims: ClaimsByUID
) -> None:
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-0")])
    await handler.prepare([ref("c1", "uid-1")])
    del claims.objects[("ns", "c1")]  # the claim is gone: unprepare needs only the checkpoint
    assert await handler.unprepare([ref("c1", "uid-1")]) == {"uid-1": ""}
    assert not handler.cdi.spec_path("uid-1").exists()
    assert handler.store.load() == []
    before = handler.store.path.read_bytes()
    assert await handler.unprepare([ref("c1", "uid-1"), ref("x", "uid-unknown")]) == {
        "uid-1": "",
        "uid-unknown": "",
    }
    assert handler.store.path.read_bytes() == before


async def test_interrupted_prepare_is_rolled_back_and_redone(
    handler: PrepareHandler, claims: ClaimsByUID, inventory: Any
) -> None:
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-5")])
    # What a crash after PrepareStarted and a CDI spec of an earlier attempt (other devices) leaves.
    handler.store.begin(
        cp.ClaimRef(uid="uid-1", namespace="ns", name="c1"),
        [cp.CheckpointedDevice(request="gpu", pool=NODE, device="gpu-5")],
    )
    handler.cdi.write_claim_spec(
        claim_uid="uid-1", devices=[inventory.by_name()["gpu-6"]], inventory=inventory
    )
    result = (await handler.prepare([ref("c1", "uid-1")]))["uid-1"]
    assert result.error == ""
    assert [d.device for d in result.devices] == ["gpu-5"]
    spec = json.loads(handler.cdi.spec_path("uid-1").read_text())
    assert [d["name"] for d in spec["devices"]] == ["uid-1-gpu-5"]
    entries = handler.store.load()
    assert [(e.uid, e.state) for e in entries] == [("uid-1", cp.ClaimState.PREPARE_COMPLETED)]


async def test_corrupt_checkpoint_refuses_everything_and_is_kept(
    tmp_path: Path, handler: PrepareHandler, claims: ClaimsByUID, inventory: Any
) -> None:
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-0")])
    claims.objects[("ns", "c2")] = claim_json("c2", "uid-2", [("gpu", "gpu-1")])
    await handler.prepare([ref("c1", "uid-1")])
    raw = bytearray(handler.store.path.read_bytes())
    at = raw.index(b"gpu-0")
    raw[at + 4] = ord("9")  # flip one byte inside the checksummed data
    handler.store.path.write_bytes(bytes(raw))

    reads_before = _checkpoint_errors("read")
    restarted = make_handler(tmp_path, inventory, claims)
    await restarted.start()
    assert _checkpoint_errors("read") == reads_before + 1
    refused = (await restarted.prepare([ref("c2", "uid-2")]))["uid-2"]
    assert "corrupt" in refused.error
    assert "checksum" in refused.error
    again = (await restarted.prepare([ref("c1", "uid-1")]))["uid-1"]
    assert "corrupt" in again.error
    unprepared = await restarted.unprepare([ref("c1", "uid-1")])
    assert "corrupt" in unprepared["uid-1"]
    assert _errors("prepare", "checkpoint-corrupt") >= 2
    assert _errors("unprepare", "checkpoint-corrupt") >= 1
    assert restarted.store.path.read_bytes() == bytes(raw)
    assert restarted.cdi.spec_path("uid-1").exists()  # nothing was cleaned up on a guess


async def test_reboot_invalidates_prepared_claims(
    tmp_path: Path, handler: PrepareHandler, claims: ClaimsByUID, inventory: Any, boot_id: Path
) -> None:
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-0")])
    await handler.prepare([ref("c1", "uid-1")])
    await asyncio.to_thread(boot_id.write_text, "boot-2\n")
    rebooted = make_handler(tmp_path, inventory, claims)
    await rebooted.start()
    assert rebooted.store.load() == []
    assert not rebooted.cdi.spec_path("uid-1").exists()
    # The claim is prepared afresh in this boot.
    result = (await rebooted.prepare([ref("c1", "uid-1")]))["uid-1"]
    assert result.error == ""
    assert rebooted.device_setups == 1


async def test_stray_cdi_spec_without_entry_is_removed_at_start(
    tmp_path: Path, handler: PrepareHandler, claims: ClaimsByUID, inventory: Any
) -> None:
    handler.cdi.write_claim_spec(
        claim_uid="uid-stray", devices=[inventory.by_name()["gpu-0"]], inventory=inventory
    )
    restarted = make_handler(tmp_path, inventory, claims)
    await restarted.start()
    assert not restarted.cdi.spec_path("uid-stray").exists()


async def test_stale_prepare_started_of_a_deleted_claim_is_cleaned_up(
    handler: PrepareHandler, claims: ClaimsByUID, inventory: Any
) -> None:
    for name, uid, device in (("gone", "uid-gone", "gpu-1"), ("alive", "uid-alive", "gpu-2")):
        claims.objects[("ns", name)] = claim_json(name, uid, [("gpu", device)])
        handler.store.begin(
            cp.ClaimRef(uid=uid, namespace="ns", name=name),
            [cp.CheckpointedDevice(request="gpu", pool=NODE, device=device)],
        )
        handler.cdi.write_claim_spec(
            claim_uid=uid, devices=[inventory.by_name()[device]], inventory=inventory
        )
    claims.objects[("ns", "replaced")] = claim_json("replaced", "uid-replaced-new", [("gpu", "gpu-3")])
    handler.store.begin(
        cp.ClaimRef(uid="uid-replaced-old", namespace="ns", name="replaced"),
        [cp.CheckpointedDevice(request="gpu", pool=NODE, device="gpu-3")],
    )
    del claims.objects[("ns", "gone")]

    removed = await handler.clean_up_stale(older_than=0)
    assert sorted(removed) == ["uid-gone", "uid-replaced-old"]
    assert [e.uid for e in handler.store.load()] == ["uid-alive"]
    assert not handler.cdi.spec_path("uid-gone").exists()
    assert handler.cdi.spec_path("uid-alive").exists()
    # A later kubelet unprepare of a cleaned-up claim is a no-op.
    assert await handler.unprepare([ref("gone", "uid-gone")]) == {"uid-gone": ""}
    # Young entries are left to the prepare that may still be running.
    assert await handler.clean_up_stale(older_than=3600) == []


async def _until_exists(path: Path) -> None:
    async with asyncio.timeout(10):
        while True:
            if await asyncio.to_thread(path.exists):
                return
            await asyncio.sleep(0.02)


async def test_a_paused_prepare_goes_on_when_its_marker_is_removed_and_pauses_once(
    tmp_path: Path,
    inventory: Any,
    claims: ClaimsByUID,
    boot_id: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PAUSE_ENV, "prepare-started")
    handler = make_handler(tmp_path, inventory, claims)
    await handler.start()
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-0")])
    claims.objects[("ns", "c2")] = claim_json("c2", "uid-2", [("gpu", "gpu-1")])
    marker = handler.state_dir / "paused-at-prepare-started"
    first = asyncio.create_task(handler.prepare([ref("c1", "uid-1")]))
    await _until_exists(marker)
    assert not first.done()
    entry = handler.store.get("uid-1")
    assert entry is not None
    assert entry.state == cp.ClaimState.PREPARE_STARTED
    assert not handler.cdi.spec_path("uid-1").exists()
    # What the kubelet does after a restart: the same call again, queued behind the paused one.
    again = asyncio.create_task(handler.prepare([ref("c1", "uid-1")]))

    marker.unlink()
    first_result, again_result = await asyncio.wait_for(asyncio.gather(first, again), timeout=10)
    assert first_result["uid-1"].error == ""
    assert again_result == first_result
    assert handler.device_setups == 1
    assert claims.reads == 1  # the reissued call was answered from the checkpoint
    # The point paused once: another claim goes through without stopping there.
    other = await asyncio.wait_for(handler.prepare([ref("c2", "uid-2")]), timeout=10)
    assert other["uid-2"].error == ""
    assert not marker.exists()


async def test_a_paused_unprepare_keeps_everything_until_its_marker_is_removed(
    tmp_path: Path,
    inventory: Any,
    claims: ClaimsByUID,
    boot_id: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PAUSE_ENV, "unprepare-started")
    handler = make_handler(tmp_path, inventory, claims)
    await handler.start()
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-0")])
    claims.objects[("ns", "c2")] = claim_json("c2", "uid-2", [("gpu", "gpu-1")])
    assert (await handler.prepare([ref("c1", "uid-1"), ref("c2", "uid-2")]))["uid-1"].error == ""
    marker = handler.state_dir / "paused-at-unprepare-started"
    # An unknown claim has nothing to tear down: no pause.
    assert await asyncio.wait_for(handler.unprepare([ref("gone", "uid-0")]), timeout=10) == {"uid-0": ""}
    assert not marker.exists()

    call = asyncio.create_task(handler.unprepare([ref("c1", "uid-1")]))
    await _until_exists(marker)
    assert not call.done()
    assert handler.cdi.spec_path("uid-1").exists()
    assert handler.store.get("uid-1") is not None
    again = asyncio.create_task(handler.unprepare([ref("c1", "uid-1")]))

    marker.unlink()
    done = await asyncio.wait_for(asyncio.gather(call, again), timeout=10)
    assert [dict(errors) for errors in done] == [{"uid-1": ""}] * 2
    assert not handler.cdi.spec_path("uid-1").exists()
    assert handler.store.get("uid-1") is None
    assert await asyncio.wait_for(handler.unprepare([ref("c2", "uid-2")]), timeout=10) == {"uid-2": ""}
    assert [e.uid for e in handler.store.load()] == []
    assert not marker.exists()
