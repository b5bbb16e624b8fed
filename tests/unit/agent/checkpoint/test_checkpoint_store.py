"""The prepared-claims checkpoint: two-phase records, reboot invalidation, fail-closed corruption."""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dra_node_agent.checkpoint import (
    API_VERSION,
    CheckpointCorrupt,
    CheckpointedDevice,
    CheckpointStore,
    ClaimRef,
    ClaimState,
    DeviceAlreadyPrepared,
    checksum_of,
)

UID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UID_B = "bbbbbbbb-0000-4000-8000-000000000002"
CLAIM_A = ClaimRef(uid=UID_A, namespace="ns", name="claim-a")
CLAIM_B = ClaimRef(uid=UID_B, namespace="ns", name="claim-b")
GPU0 = CheckpointedDevice(request="gpu", pool="node-1", device="gpu-0")
GPU1 = CheckpointedDevice(request="gpu", pool="node-1", device="gpu-1")


@pytest.fixture
def boot_id(tmp_path: Path) -> Path:
    path = tmp_path / "boot_id"
    path.write_text("11111111-1111-1111-1111-111111111111\n")
    return path


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "plugin" / "checkpoint.json"


def store(path: Path, boot_id: Path) -> CheckpointStore:
    return CheckpointStore(path, boot_id, driver="gpu.nvidia.com")


def completed(device: CheckpointedDevice, uid: str) -> CheckpointedDevice:
    return CheckpointedDevice(
        request=device.request,
        pool=device.pool,
        device=device.device,
        cdi_device_ids=(f"k8s.gpu.nvidia.com/claim={uid}-{device.device}",),
    )


def test_missing_file_is_an_empty_checkpoint(path: Path, boot_id: Path) -> None:
    s = store(path, boot_id)
    assert s.load() == []
    assert not path.exists()  # nothing to write until something is prepared


def test_two_phase_prepare_survives_a_restart(path: Path, boot_id: Path) -> None:
    s = store(path, boot_id)
    started = s.begin(CLAIM_A, [GPU0, GPU1])
    assert started.state == ClaimState.PREPARE_STARTED
    assert started.completed_at is None

    # Crash between the phases: a new process sees PrepareStarted with the planned devices.
    after_crash = store(path, boot_id).get(UID_A)
    assert after_crash is not None
    assert after_crash.state == ClaimState.PREPARE_STARTED
    assert [d.device for d in after_crash.devices] == ["gpu-0", "gpu-1"]

    done = s.complete(UID_A, [completed(GPU0, UID_A), completed(GPU1, UID_A)])
    assert done.state == ClaimState.PREPARE_COMPLETED
    reloaded = store(path, boot_id).get(UID_A)
    assert reloaded == done
    assert reloaded.cdi_device_ids("gpu") == [
        f"k8s.gpu.nvidia.com/claim={UID_A}-gpu-0",
        f"k8s.gpu.nvidia.com/claim={UID_A}-gpu-1",
    ]

    doc = json.loads(path.read_text())
    assert doc["apiVersion"] == API_VERSION
    assert doc["kind"] == "Checkpoint"
    assert doc["checksum"] == checksum_of(doc["data"])
    assert doc["data"]["nodeBootID"] == "11111111-1111-1111-1111-111111111111"
    assert doc["data"]["preparedClaims"][UID_A]["state"] == "PrepareCompleted"


def test_begin_on_a_completed_claim_is_a_no_op(path: Path, boot_id: Path) -> None:
    s = store(path, boot_id)
    s.begin(CLAIM_A, [GPU0])
    done = s.complete(UID_A, [completed(GPU0, UID_A)])
    before = path.read_bytes()
    assert s.begin(CLAIM_A, [GPU1]) == done
    assert path.read_bytes() == before
    assert len(s.entries()) == 1


def test_remove_is_idempotent(path: Path, boot_id: Path) -> None:
    s = store(path, boot_id)
    s.begin(CLAIM_A, [GPU0])
    assert s.remove(UID_A) is not None
    before = path.read_bytes()
    mtime = path.stat().st_mtime_ns
    assert s.remove(UID_A) is None
    assert s.remove("never-seen") is None
    assert path.read_bytes() == before
    assert path.stat().st_mtime_ns == mtime
    assert s.entries() == []


def test_complete_without_begin_is_an_error(path: Path, boot_id: Path) -> None:
    with pytest.raises(KeyError, match="call begin"):
        store(path, boot_id).complete(UID_A, [GPU0])


def test_a_device_is_never_prepared_for_two_claims(path: Path, boot_id: Path) -> None:
    s = store(path, boot_id)
    s.begin(CLAIM_A, [GPU0])
    with pytest.raises(DeviceAlreadyPrepared, match="node-1/gpu-0 is already prepared for claim ns/claim-a"):
        s.begin(CLAIM_B, [GPU1, GPU0])
    assert s.get(UID_B) is None
    admin = CheckpointedDevice(request="mon", pool="node-1", device="gpu-0", admin_access=True)
    assert s.begin(CLAIM_B, [admin]).state == ClaimState.PREPARE_STARTED


UID_C = "cccccccc-0000-4000-8000-000000000003"
CLAIM_C = ClaimRef(uid=UID_C, namespace="ns", name="claim-c")


def share(uid_suffix: str) -> CheckpointedDevice:
    return CheckpointedDevice(
        request="gpu",
        pool="node-1",
        device="gpu-0",
        shared=True,
        share_id=f"0000000{uid_suffix}-aaaa-4aaa-8aaa-0",
    )


def test_shares_of_one_device_coexist_but_never_with_an_exclusive_hold(path: Path, boot_id: Path) -> None:
    s = store(path, boot_id)
    s.begin(CLAIM_A, [share("1")])
    # Consumable capacity: a second share of the same device is what the allocator intended.
    assert s.begin(CLAIM_B, [share("2")]).state == ClaimState.PREPARE_STARTED
    # An exclusive hold of a device that is shared out is refused...
    with pytest.raises(DeviceAlreadyPrepared, match="node-1/gpu-0"):
        s.begin(CLAIM_C, [GPU0])
    s.remove(UID_A)
    s.remove(UID_B)
    # ...and so is a share of a device held exclusively.
    s.begin(CLAIM_C, [GPU0])
    with pytest.raises(DeviceAlreadyPrepared, match="node-1/gpu-0 is already prepared for claim ns/claim-c"):
        s.begin(CLAIM_A, [share("1")])


def test_share_ids_survive_a_reload(path: Path, boot_id: Path) -> None:
    store(path, boot_id).begin(CLAIM_A, [share("1")])
    entry = store(path, boot_id).get(UID_A)
    assert entry is not None
    assert entry.devices == (share("1"),)


def test_reboot_invalidates_entries_and_says_so(
    path: Path, boot_id: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = store(path, boot_id)
    s.begin(CLAIM_A, [GPU0])
    s.complete(UID_A, [completed(GPU0, UID_A)])
    boot_id.write_text("22222222-2222-2222-2222-222222222222\n")

    rebooted = store(path, boot_id)
    with caplog.at_level(logging.WARNING, logger="dra_node_agent.checkpoint"):
        assert rebooted.load() == []
    assert [e.uid for e in rebooted.invalidated] == [UID_A]
    assert "written in boot 11111111" in caplog.text
    assert UID_A in caplog.text
    doc = json.loads(path.read_text())
    assert doc["data"]["nodeBootID"] == "22222222-2222-2222-2222-222222222222"
    assert doc["data"]["preparedClaims"] == {}


def tamper_value(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["data"]["preparedClaims"][UID_A]["name"] = "someone-else"  # checksum left as it was
    path.write_text(json.dumps(doc))


def tamper_version(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["apiVersion"] = f"{API_VERSION.split('/')[0]}/v9"
    path.write_text(json.dumps(doc))


def flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def zero_checksum(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["checksum"] = ""
    path.write_text(json.dumps(doc))


def truncate(path: Path) -> None:
    path.write_bytes(b"")


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (tamper_value, "checksum mismatch"),
        (zero_checksum, "checksum mismatch"),
        (tamper_version, "unknown version"),
        (flip_bytes, "not valid JSON|checksum mismatch|malformed"),
        (truncate, "not valid JSON"),
    ],
)
def test_corruption_fails_closed_and_keeps_the_file(
    path: Path, boot_id: Path, damage: object, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    s = store(path, boot_id)
    s.begin(CLAIM_A, [GPU0])
    damage(path)  # type: ignore[operator]
    damaged = path.read_bytes()

    fresh = store(path, boot_id)
    with caplog.at_level(logging.ERROR), pytest.raises(CheckpointCorrupt, match=reason):
        fresh.load()
    assert "refusing prepare and unprepare" in caplog.text
    # Every later call is refused too, and nothing touched the file.
    with pytest.raises(CheckpointCorrupt):
        fresh.begin(CLAIM_B, [GPU1])
    with pytest.raises(CheckpointCorrupt):
        fresh.remove(UID_A)
    with pytest.raises(CheckpointCorrupt):
        fresh.get(UID_A)
    assert path.read_bytes() == damaged
    assert fresh.corrupt is not None

    # Recovery is an explicit operator action that keeps the evidence.
    aside = fresh.quarantine()
    assert aside is not None
    assert aside.read_bytes() == damaged
    assert fresh.entries() == []


def test_failed_write_leaves_the_previous_checkpoint(
    path: Path, boot_id: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(path, boot_id)
    s.begin(CLAIM_A, [GPU0])
    before = path.read_bytes()

    def no_space(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(OSError, match="No space left"):
        s.begin(CLAIM_B, [GPU1])
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(path.parent)) == ["checkpoint.json", "checkpoint.json.lock"]
    assert [e.uid for e in store(path, boot_id).entries()] == [UID_A]


def test_temp_files_from_a_crash_are_removed(path: Path, boot_id: Path) -> None:
    s = store(path, boot_id)
    s.begin(CLAIM_A, [GPU0])
    (path.parent / ".checkpoint.json.tmp-99-dead").write_text('{"half')
    assert s.remove_stale_temp_files() == 1
    assert sorted(os.listdir(path.parent)) == ["checkpoint.json", "checkpoint.json.lock"]
    assert s.get(UID_A) is not None


def test_two_stores_on_one_file_see_each_others_writes(path: Path, boot_id: Path) -> None:
    # Two agent pods during a rolling update share the plugin directory.
    old, new = store(path, boot_id), store(path, boot_id)
    old.begin(CLAIM_A, [GPU0])
    new.begin(CLAIM_B, [GPU1])
    old.complete(UID_A, [completed(GPU0, UID_A)])
    assert {e.uid for e in new.entries()} == {UID_A, UID_B}
    with pytest.raises(DeviceAlreadyPrepared):
        new.begin(ClaimRef(uid="c", namespace="ns", name="c"), [GPU0])
    assert new.remove(UID_A) is not None
    assert [e.uid for e in old.entries()] == [UID_B]


def test_stale_prepare_started_entries(path: Path, boot_id: Path) -> None:
    s = store(path, boot_id)
    s.begin(CLAIM_A, [GPU0])
    s.begin(CLAIM_B, [GPU1])
    s.complete(UID_B, [completed(GPU1, UID_B)])
    future = datetime.now(UTC) + timedelta(minutes=1)
    past = datetime.now(UTC) - timedelta(minutes=10)
    assert [e.uid for e in s.started_before(future)] == [UID_A]
    assert s.started_before(past) == []
    assert [e.uid for e in s.entries(ClaimState.PREPARE_COMPLETED)] == [UID_B]


def test_unreadable_boot_id_is_a_clear_error(path: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"boot ID .*missing: cannot read"):
        CheckpointStore(path, tmp_path / "missing").load()


def test_concurrent_writers_lose_no_update(path: Path, boot_id: Path) -> None:
    # Two stores (as two agent pods would) writing from threads at once: flock serializes them.
    stores = [store(path, boot_id), store(path, boot_id)]

    def prepare(which: int) -> None:
        for i in range(15):
            uid = f"claim-{which}-{i}"
            device = CheckpointedDevice(request="r", pool="node-1", device=f"dev-{which}-{i}")
            stores[which].begin(ClaimRef(uid=uid, namespace="ns", name=uid), [device])
            stores[which].complete(uid, [device])

    threads = [threading.Thread(target=prepare, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = store(path, boot_id).entries(ClaimState.PREPARE_COMPLETED)
    assert len(entries) == 30
