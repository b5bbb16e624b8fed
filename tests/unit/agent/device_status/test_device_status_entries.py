"""Building ``status.devices`` entries: keys with a share ID, this driver's entries set in place and
removed among everyone else's, the Ready condition from health, and the data within its limit."""

from __future__ import annotations

import json
from typing import Any

from dra_node_agent.checkpoint import CheckpointedDevice
from dra_node_agent.device_status.conditions import MAX_CONDITIONS, Readiness, readiness, ready_condition
from dra_node_agent.device_status.data import MAX_DATA_BYTES, bounded, claim_device_data
from dra_node_agent.device_status.entries import DesiredEntry, EntryKey, allocated_keys, merged_entries
from dra_node_agent.devices import DiscoveredDevice, DiscoveredInventory, TpuHostInfo, int_attr
from dra_node_agent.health.state import DeviceHealthState, Observation, ProblemKind
from dra_node_agent.opaqueconfig import TpuConfig
from dra_node_agent.tpu.status_data import TpuStatusData
from dra_node_agent.tpu.workers import TpuWorkers
from tests.unit.agent.device_status.fakeserver import GPU, NODE, OTHER, claim

NOW = "2026-11-26T17:00:00Z"
HEALTHY = Readiness("True", "Healthy", "prepared and healthy")
SHARE = "6f1d4c7e-9f0a-4b1e-8f3a-2c5d7e9a1b3c"


def entry(driver: str, device: str, **extra: Any) -> dict[str, Any]:
    return {"driver": driver, "pool": NODE, "device": device, **extra}


def test_keys_come_from_the_allocation_with_their_share_id() -> None:
    obj = claim("c", uid="u", devices=["gpu-0", "gpu-1"], other=["nic-0"], share_ids={"gpu-1": SHARE})
    assert allocated_keys(obj) == {
        EntryKey(GPU, NODE, "gpu-0"),
        EntryKey(GPU, NODE, "gpu-1", SHARE),
        EntryKey(OTHER, NODE, "nic-0"),
    }
    assert allocated_keys({"status": {}}) == frozenset()
    assert EntryKey.of(entry(GPU, "gpu-1", shareID=SHARE)).fields() == {
        "driver": GPU,
        "pool": NODE,
        "device": "gpu-1",
        "shareID": SHARE,
    }


def test_merging_sets_ours_in_place_appends_new_ones_and_keeps_every_other_entry() -> None:
    theirs = entry(OTHER, "nic-0", data={"x": 1}, networkData={"interfaceName": "eth1"})
    shared_by_another_claim = entry(GPU, "gpu-1", shareID=SHARE, data={"keep": True})
    current = [entry(GPU, "gpu-0", data={"old": 1}), theirs, shared_by_another_claim]
    desired = [
        DesiredEntry(EntryKey(GPU, NODE, "gpu-0"), HEALTHY, {"uuid": "GPU-0"}),
        DesiredEntry(EntryKey(GPU, NODE, "gpu-1"), HEALTHY, {"uuid": "GPU-1"}),
    ]
    merged = merged_entries(current, desired=desired, now=NOW)
    assert [(e["driver"], e["device"], e.get("shareID")) for e in merged] == [
        (GPU, "gpu-0", None),
        (OTHER, "nic-0", None),
        (GPU, "gpu-1", SHARE),  # another share of the device: another key, not ours to touch
        (GPU, "gpu-1", None),
    ]
    assert merged[0]["data"] == {"uuid": "GPU-0"}
    assert merged[1] == theirs
    assert merged[2] == shared_by_another_claim
    assert merged[3]["conditions"][0]["status"] == "True"


def test_removing_drops_only_the_keys_named() -> None:
    current = [entry(GPU, "gpu-0"), entry(OTHER, "nic-0"), entry(GPU, "gpu-1", shareID=SHARE)]
    merged = merged_entries(
        current, remove={EntryKey(GPU, NODE, "gpu-0"), EntryKey(GPU, NODE, "gpu-1")}, now=NOW
    )
    assert merged == current[1:]


def test_data_rebuilt_after_a_restart_keeps_what_the_server_has() -> None:
    rebuilt = DesiredEntry(EntryKey(GPU, NODE, "gpu-0"), HEALTHY, {"uuid": "GPU-0"}, data_known=False)
    kept = merged_entries(
        [entry(GPU, "gpu-0", data={"uuid": "GPU-0", "workerId": 2})], desired=[rebuilt], now=NOW
    )
    assert kept[0]["data"] == {"uuid": "GPU-0", "workerId": 2}
    fresh = merged_entries([], desired=[rebuilt], now=NOW)
    assert fresh[0]["data"] == {"uuid": "GPU-0"}


def test_ready_is_first_keeps_its_transition_time_while_its_status_stays_and_others_are_kept() -> None:
    previous = [
        {"type": "Custom", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "T0"},
        {"type": "Ready", "status": "True", "reason": "Healthy", "message": "", "lastTransitionTime": "T1"},
    ]
    same = ready_condition(HEALTHY, previous=previous, now=NOW)
    assert [c["type"] for c in same] == ["Ready", "Custom"]
    assert same[0]["lastTransitionTime"] == "T1"
    moved = ready_condition(Readiness("False", "XID", "XID 79"), previous=previous, now=NOW)
    assert moved[0]["lastTransitionTime"] == NOW
    many = [{"type": f"T{i}", "status": "True"} for i in range(10)]
    assert len(ready_condition(HEALTHY, previous=many, now=NOW)) == MAX_CONDITIONS


def _state(*observations: Observation) -> DeviceHealthState:
    state = DeviceHealthState(device="gpu-0", recovery_period=300)
    for observation in observations:
        state.observe(observation)
    return state


def test_readiness_follows_the_health_state() -> None:
    assert readiness(None, monitored=False).reason == "Prepared"
    assert readiness(None, monitored=True) == Readiness(
        "True", "HealthUnknown", "prepared; the health monitor does not watch this device"
    )
    assert readiness(_state(), monitored=True).reason == "HealthUnknown"
    assert readiness(_state(Observation("gpu-0", 1.0)), monitored=True) == HEALTHY
    xid = _state(Observation("gpu-0", 1.0, ProblemKind.XID, "79", "XID 79 on GPU-0"))
    assert readiness(xid, monitored=True) == Readiness("False", "XID", "XID 79 on GPU-0")
    remap = _state(Observation("gpu-0", 1.0, ProblemKind.UNHEALTHY, "row-remap-failure", "row remap failed"))
    assert readiness(remap, monitored=True).reason == "RowRemapFailure"
    odd = _state(Observation("gpu-0", 1.0, ProblemKind.UNHEALTHY, "9-lives", "?"))
    assert readiness(odd, monitored=True).reason == "Unhealthy"


def gpu(name: str, *, uuid: str, parent: str | None = None) -> DiscoveredDevice:
    return DiscoveredDevice(
        name=name,
        kind="mig" if parent else "gpu",
        uuid=uuid,
        attributes={},
        pci_bus_id="0000:10:00.0",
        parent_uuid=parent,
    )


def test_gpu_and_mig_data_name_the_uuids_and_the_bus() -> None:
    inventory = DiscoveredInventory(driver=GPU)
    devices = {
        "gpu-0": gpu("gpu-0", uuid="GPU-0"),
        "mig-1": gpu("mig-1", uuid="MIG-1", parent="GPU-1"),
        "dyn": gpu("dyn", uuid="", parent="GPU-2"),
    }
    prepared = [
        CheckpointedDevice("gpu", NODE, "gpu-0"),
        CheckpointedDevice("mig", NODE, "mig-1"),
        CheckpointedDevice("dyn", NODE, "dyn", dynamic_mig=True, mig_uuid="MIG-created"),
        CheckpointedDevice("gone", NODE, "gone"),
    ]
    data = claim_device_data(prepared, devices=devices, inventory=inventory, vendor=None)
    assert data == {
        "gpu-0": {"uuid": "GPU-0", "pciBusID": "0000:10:00.0"},
        "mig-1": {"uuid": "MIG-1", "parentUUID": "GPU-1", "pciBusID": "0000:10:00.0"},
        "dyn": {"uuid": "MIG-created", "parentUUID": "GPU-2", "pciBusID": "0000:10:00.0"},
        "gone": {},
    }


def test_tpu_data_has_the_chip_index_and_on_a_multi_host_slice_the_worker_identity() -> None:
    host = TpuHostInfo(
        "v4", "tpu-v4-podslice", 2, 4, "4x4x4", (2, 2, 1), worker_id=3, worker_hostnames=("a", "b")
    )
    inventory = DiscoveredInventory(driver="tpu.google.com", tpu_host=host)
    chips = {
        f"accel{i}": DiscoveredDevice(
            name=f"accel{i}",
            kind="tpu",
            uuid=f"tpu-{i}",
            attributes={"index": int_attr(i)},
            pci_bus_id=f"0000:0{i}:00.0",
        )
        for i in range(4)
    }
    every_chip = [CheckpointedDevice("tpu", NODE, name) for name in chips]
    data = claim_device_data(every_chip, devices=chips, inventory=inventory, vendor=TpuStatusData())
    assert data["accel2"] == {
        "uuid": "tpu-2",
        "pciBusID": "0000:02:00.0",
        "index": 2,
        "workerId": 3,
        "workerHostnames": ["a", "b"],
    }
    # The pod's Job says which worker it is; the claim's TpuConfig says more still.
    derived = claim_device_data(
        every_chip,
        devices=chips,
        inventory=inventory,
        vendor=TpuStatusData(),
        context=TpuWorkers(worker_id=1, hostnames=("w-0.s", "w-1.s")),
    )
    assert (derived["accel0"]["workerId"], derived["accel0"]["workerHostnames"]) == (1, ["w-0.s", "w-1.s"])
    configured = claim_device_data(
        every_chip, devices=chips, inventory=inventory, vendor=TpuStatusData(), config=TpuConfig(worker_id=0)
    )
    assert configured["accel0"]["workerId"] == 0
    # Two chips of the host: a single-host sub-slice of its own, no worker identity.
    two = claim_device_data(every_chip[:2], devices=chips, inventory=inventory, vendor=TpuStatusData())
    assert two["accel1"] == {"uuid": "tpu-1", "pciBusID": "0000:01:00.0", "index": 1}


def test_data_stays_within_the_api_limit() -> None:
    small = {"uuid": "GPU-0"}
    assert bounded(small) == small
    huge = {"uuid": "GPU-0", "workerHostnames": [f"host-{i}.example" * 4 for i in range(400)]}
    cut = bounded(huge)
    assert cut == {"uuid": "GPU-0"}
    assert len(json.dumps(bounded({"blob": "x" * (MAX_DATA_BYTES + 1)}))) <= MAX_DATA_BYTES
