"""The checkpoint's bounds: claims prepared at once, bytes of one claim's entry and of the file. Growth
past one is refused with a message saying which (nothing written); a removal always goes through."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from dra_node_agent import checkpoint as cp
from dra_node_agent.checkpoint import CheckpointedDevice, CheckpointFull, CheckpointStore, ClaimRef
from tests.unit.agent.prepare.test_prepare_states import ClaimsByUID, claim_json, make_handler, ref


def claim(i: int) -> ClaimRef:
    return ClaimRef(uid=f"{i:08x}-0000-4000-8000-000000000000", namespace="ns", name=f"claim-{i}")


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    return CheckpointStore(tmp_path / "checkpoint.json", boot, driver="gpu.nvidia.com", max_claims=2)


def test_no_more_claims_than_the_bound_and_a_removal_makes_room(store: CheckpointStore) -> None:
    shared = CheckpointedDevice(request="gpu", pool="n", device="gpu-0", admin_access=True)
    store.begin(claim(1), [shared])
    store.begin(claim(2), [shared])
    before = store.path.read_bytes()
    with pytest.raises(CheckpointFull, match=r"2 claims of driver gpu.nvidia.com .*--max-prepared-claims=2"):
        store.begin(claim(3), [shared])
    assert store.path.read_bytes() == before
    store.begin(claim(2), [shared])  # an entry already there is no new claim
    store.remove(claim(1).uid)
    store.begin(claim(3), [shared])
    assert {e.name for e in store.load()} == {"claim-2", "claim-3"}


def test_an_oversized_entry_is_refused(store: CheckpointStore) -> None:
    devices = [
        CheckpointedDevice(request="r" * 63, pool="p" * 253, device=f"d{i}" + "x" * 60) for i in range(100)
    ]
    with pytest.raises(CheckpointFull, match=r"checkpoint entry would be \d+ bytes, more than the 32768"):
        store.begin(claim(1), devices)
    assert store.load() == []


def test_the_file_never_grows_past_its_bound_and_shrinks_freely(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.max_claims = 100
    device = CheckpointedDevice(request="gpu", pool="n", device="gpu-0", admin_access=True)
    store.begin(claim(1), [device])
    monkeypatch.setattr(cp, "MAX_FILE_BYTES", 100)  # already more: it may not grow, only shrink
    with pytest.raises(CheckpointFull, match="the checkpoint would grow to"):
        store.begin(claim(2), [device])
    store.remove(claim(1).uid)
    assert store.load() == []


async def test_prepare_beyond_the_bound_fails_naming_it_and_leaves_nothing(tmp_path: Path) -> None:
    from dra_node_agent.simulated.discovery import SimulatedBackend

    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("boot-1\n")
    inventory = await SimulatedBackend(
        profile="h100-80gb-x8", node_name="node-a", state_dir=tmp_path / "hw"
    ).discover()
    claims = ClaimsByUID()
    handler = make_handler(tmp_path, inventory, claims)
    handler.store.max_claims = 1
    await handler.start()
    claims.objects[("ns", "c1")] = claim_json("c1", "uid-1", [("gpu", "gpu-0")])
    claims.objects[("ns", "c2")] = claim_json("c2", "uid-2", [("gpu", "gpu-1")])
    errors = REGISTRY.get_sample_value(
        "dra_agent_claim_operation_errors_total",
        {"driver": "gpu.nvidia.com", "operation": "prepare", "reason": "checkpoint-full"},
    )
    assert (await handler.prepare([ref("c1", "uid-1")]))["uid-1"].error == ""
    error = (await handler.prepare([ref("c2", "uid-2")]))["uid-2"].error
    assert "refused: 1 claims of driver gpu.nvidia.com are prepared on this node" in error
    assert [e.uid for e in handler.store.load()] == ["uid-1"]
    assert not handler.cdi.spec_path("uid-2").exists()
    after = REGISTRY.get_sample_value(
        "dra_agent_claim_operation_errors_total",
        {"driver": "gpu.nvidia.com", "operation": "prepare", "reason": "checkpoint-full"},
    )
    assert (after or 0) - (errors or 0) == 1
    # Once the first is unprepared, the second fits.
    assert (await handler.unprepare([ref("c1", "uid-1")]))["uid-1"] == ""
    assert (await handler.prepare([ref("c2", "uid-2")]))["uid-2"].error == ""
