"""Pool planning without a cluster: chunking, counter slices, slice names, generations, stale slices."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest

from dra_node_agent.publisher import (
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_EXTRAS,
    PoolDesign,
    PoolPlan,
    SliceChunk,
    chunk_devices,
    chunk_pool,
    for_version,
    plan_pool,
    pool_content,
    slice_name,
)

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
OWNER = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid", "controller": True}


def devices(count: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}, **extra} for i in range(count)]


def design(chunks: Sequence[SliceChunk], *, api_version: str = "v1") -> PoolDesign:
    return PoolDesign(driver=DRIVER, node=NODE, api_version=api_version, owner=OWNER, chunks=chunks)


def counter_sets(count: int, *, memory: str = "80Gi") -> list[dict[str, Any]]:
    return [
        {"name": f"gpu-{i}-counter-set", "counters": {"memory": {"value": memory}, "compute": {"value": "7"}}}
        for i in range(count)
    ]


def consuming_devices(gpus: int) -> list[dict[str, Any]]:
    return [
        {
            "name": f"gpu-{i}-mig-1g-{slot}",
            "consumesCounters": [
                {"counterSet": f"gpu-{i}-counter-set", "counters": {"memory": {"value": "10Gi"}}}
            ],
        }
        for i in range(gpus)
        for slot in range(7)
    ]


def server_copy(plan: PoolPlan, *, version: int = 1) -> list[dict[str, Any]]:
    """What the server would hold after applying the plan (creates and updates)."""
    out = []
    for body in (*plan.update, *plan.create):
        obj = copy.deepcopy(body)  # a test that edits the copy must not edit what was sent
        obj["metadata"]["resourceVersion"] = str(version)
        out.append(obj)
    return out


def test_small_pool_is_one_slice() -> None:
    assert [len(c) for c in chunk_devices(devices(8))] == [8]


def test_empty_pool_still_gets_one_empty_slice() -> None:
    assert chunk_devices([]) == [[]]


def test_chunks_hold_at_most_128_devices() -> None:
    sizes = [len(c) for c in chunk_devices(devices(300))]
    assert sizes == [128, 128, 44]
    assert MAX_DEVICES_PER_SLICE == 128


def test_taints_lower_the_limit_to_64() -> None:
    tainted = devices(100)
    tainted[5]["taints"] = [{"key": "gpu.nvidia.com/xid", "effect": "NoSchedule"}]
    assert [len(c) for c in chunk_devices(tainted)] == [64, 36]
    assert MAX_DEVICES_PER_SLICE_WITH_EXTRAS == 64


def test_counters_and_list_attributes_lower_the_limit_to_64() -> None:
    counted = devices(
        65, consumesCounters=[{"counterSet": "gpu-0", "counters": {"memory": {"value": "1Gi"}}}]
    )
    assert [len(c) for c in chunk_devices(counted)] == [64, 1]
    listed = devices(65)
    listed[64]["attributes"]["links"] = {"ints": [1, 2]}
    assert [len(c) for c in chunk_devices(listed)] == [64, 1]


def test_chunking_keeps_the_device_order() -> None:
    chunks = chunk_devices(devices(130))
    names = [d["name"] for chunk in chunks for d in chunk]
    assert names == [f"gpu-{i}" for i in range(130)]


def test_slice_names_are_deterministic_and_bounded() -> None:
    assert slice_name(node=NODE, driver=DRIVER, index=0) == "node-a-gpu.nvidia.com-0"
    long_node = "n" * 250
    first = slice_name(node=long_node, driver=DRIVER, index=0)
    second = slice_name(node=long_node, driver=DRIVER, index=1)
    assert len(first) <= 253
    assert len(second) <= 253
    assert first != second
    assert first == slice_name(node=long_node, driver=DRIVER, index=0)


def test_v1beta1_wraps_device_fields_in_basic() -> None:
    device = {"name": "gpu-0", "attributes": {"index": {"int": 0}}, "capacity": {"memory": {"value": "80Gi"}}}
    assert for_version(device, api_version="v1beta1") == {
        "name": "gpu-0",
        "basic": {"attributes": {"index": {"int": 0}}, "capacity": {"memory": {"value": "80Gi"}}},
    }
    assert for_version(device, api_version="v1") == device


def test_first_publication_creates_every_slice_at_generation_1() -> None:
    plan = plan_pool(design=design(chunk_pool(devices(200))), existing=[], last_generation=0)
    assert plan.generation == 1
    assert plan.bumped
    assert [b["metadata"]["name"] for b in plan.create] == [f"{NODE}-{DRIVER}-0", f"{NODE}-{DRIVER}-1"]
    for body in plan.create:
        assert body["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 2}
        assert body["spec"]["nodeName"] == NODE
        assert body["metadata"]["ownerReferences"] == [OWNER]


def test_unchanged_pool_writes_nothing_and_keeps_the_generation() -> None:
    d = design(chunk_pool(devices(8)))
    first = plan_pool(design=d, existing=[], last_generation=0)
    again = plan_pool(design=d, existing=server_copy(first), last_generation=0)
    assert again.empty
    assert again.generation == 1
    assert not again.bumped


def test_restart_with_unchanged_devices_keeps_slices() -> None:
    # A new process has no memory of the generation: it reads it from the slices.
    first = plan_pool(design=design(chunk_pool(devices(8))), existing=[], last_generation=0)
    stored = server_copy(first)
    for obj in stored:
        obj["spec"]["pool"]["generation"] = 7
    again = plan_pool(design=design(chunk_pool(devices(8))), existing=stored, last_generation=0)
    assert again.empty
    assert again.generation == 7


def test_changed_devices_bump_the_generation_of_every_slice() -> None:
    first = plan_pool(design=design(chunk_pool(devices(200))), existing=[], last_generation=0)
    changed = devices(200)
    changed[150]["attributes"]["index"] = {"int": 999}
    plan = plan_pool(design=design(chunk_pool(changed)), existing=server_copy(first), last_generation=1)
    assert plan.generation == 2
    assert plan.bumped
    # Consumers only read the newest generation: the unchanged slice must move up too.
    assert len(plan.update) == 2
    assert not plan.create
    assert all(b["spec"]["pool"]["generation"] == 2 for b in plan.update)
    assert all(b["metadata"]["resourceVersion"] == "1" for b in plan.update)


def test_a_deleted_slice_is_recreated_without_a_bump() -> None:
    first = plan_pool(design=design(chunk_pool(devices(200))), existing=[], last_generation=0)
    remaining = server_copy(first)[1:]
    plan = plan_pool(design=design(chunk_pool(devices(200))), existing=remaining, last_generation=1)
    assert not plan.bumped
    assert plan.generation == 1
    assert [b["metadata"]["name"] for b in plan.create] == [f"{NODE}-{DRIVER}-0"]
    assert not plan.update


def test_a_wiped_pool_comes_back_at_its_generation_when_unchanged() -> None:
    d = design(chunk_pool(devices(8)))
    plan = plan_pool(design=d, existing=[], last_generation=4, last_content=pool_content(d.chunks))
    assert plan.generation == 4
    assert not plan.bumped
    assert len(plan.create) == 1


def test_a_wiped_pool_with_new_content_comes_back_one_higher() -> None:
    old = pool_content(chunk_pool(devices(4)))
    plan = plan_pool(design=design(chunk_pool(devices(8))), existing=[], last_generation=4, last_content=old)
    assert plan.generation == 5
    assert plan.bumped


def test_growing_from_one_to_two_slices_changes_the_count() -> None:
    first = plan_pool(design=design(chunk_pool(devices(100))), existing=[], last_generation=0)
    plan = plan_pool(design=design(chunk_pool(devices(150))), existing=server_copy(first), last_generation=1)
    assert plan.bumped
    assert plan.generation == 2
    assert len(plan.update) == 1
    assert len(plan.create) == 1
    assert plan.update[0]["spec"]["pool"]["resourceSliceCount"] == 2


def test_stale_slices_are_deleted() -> None:
    big = plan_pool(design=design(chunk_pool(devices(200))), existing=[], last_generation=0)
    stored = server_copy(big)
    foreign_pool = {
        "metadata": {"name": "leftover", "resourceVersion": "3"},
        "spec": {"driver": DRIVER, "nodeName": NODE, "pool": {"name": "old-pool", "generation": 1}},
    }
    other_driver = {
        "metadata": {"name": "tpu-slice"},
        "spec": {"driver": "tpu.google.com", "nodeName": NODE, "pool": {"name": NODE, "generation": 1}},
    }
    plan = plan_pool(
        design=design(chunk_pool(devices(100))),
        existing=[*stored, foreign_pool, other_driver],
        last_generation=1,
    )
    assert set(plan.delete) == {f"{NODE}-{DRIVER}-1", "leftover"}
    assert plan.bumped
    assert plan.generation == 2


def test_missing_owner_reference_is_fixed_without_a_bump() -> None:
    first = plan_pool(design=design(chunk_pool(devices(8))), existing=[], last_generation=0)
    stored = server_copy(first)
    del stored[0]["metadata"]["ownerReferences"]
    plan = plan_pool(design=design(chunk_pool(devices(8))), existing=stored, last_generation=1)
    assert not plan.bumped
    assert len(plan.update) == 1
    assert plan.update[0]["metadata"]["ownerReferences"] == [OWNER]


def test_v1beta1_slices_compare_equal_to_the_v1_design() -> None:
    d = design(chunk_pool(devices(8)), api_version="v1beta1")
    first = plan_pool(design=d, existing=[], last_generation=0)
    assert "basic" in first.create[0]["spec"]["devices"][0]
    again = plan_pool(design=d, existing=server_copy(first), last_generation=1)
    assert again.empty


def test_fields_the_server_dropped_do_not_cause_endless_bumps() -> None:
    tainted = devices(2)
    tainted[0]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    d = design(chunk_pool(tainted))
    first = plan_pool(design=d, existing=[], last_generation=0)
    stored = server_copy(first)
    dropped = [dict(dev) for dev in stored[0]["spec"]["devices"]]
    dropped[0].pop("taints")
    stored[0]["spec"]["devices"] = dropped
    # Without knowing the server dropped it, this looks like a change...
    assert plan_pool(design=d, existing=stored, last_generation=1).bumped
    # ...but the publisher records what the server accepted for what it sent.
    assert d.accept(sent=first.create[0], written=stored[0])
    assert not d.accept(sent=first.create[0], written=stored[0])  # known: warned once
    assert plan_pool(design=d, existing=stored, last_generation=1).empty


def test_without_counter_sets_the_slices_are_what_they_always_were() -> None:
    plan = plan_pool(design=design(chunk_pool(devices(200), ())), existing=[], last_generation=0)
    assert [b["metadata"]["name"] for b in plan.create] == [f"{NODE}-{DRIVER}-0", f"{NODE}-{DRIVER}-1"]
    for body, expected in zip(plan.create, chunk_devices(devices(200)), strict=True):
        assert "sharedCounters" not in body["spec"]
        assert body["spec"]["devices"] == expected


def test_counter_slices_come_first_and_hold_at_most_8_sets() -> None:
    chunks = chunk_pool(consuming_devices(10), counter_sets(10))
    assert MAX_COUNTER_SETS_PER_SLICE == 8
    assert [len(c.counter_sets) for c in chunks] == [8, 2, 0, 0]
    assert [len(c.devices) for c in chunks] == [0, 0, 64, 6]  # consumesCounters: 64 a slice
    assert [s["name"] for c in chunks for s in c.counter_sets] == [f"gpu-{i}-counter-set" for i in range(10)]


def test_counter_sets_without_devices_need_no_empty_device_slice() -> None:
    assert [len(c.counter_sets) for c in chunk_pool([], counter_sets(2))] == [2]
    assert chunk_pool([]) == [SliceChunk()]


def test_a_chunk_never_holds_devices_and_counter_sets() -> None:
    with pytest.raises(ValueError, match="never both"):
        SliceChunk(devices=tuple(devices(1)), counter_sets=tuple(counter_sets(1)))


@pytest.mark.parametrize("api_version", ["v1", "v1beta1"])
def test_a_counter_slice_carries_shared_counters_and_no_devices(api_version: str) -> None:
    plan = plan_pool(
        design=design(chunk_pool(consuming_devices(2), counter_sets(2)), api_version=api_version),
        existing=[],
        last_generation=0,
    )
    counters, device_slice = plan.create
    assert counters["metadata"]["name"] == f"{NODE}-{DRIVER}-0"
    assert counters["spec"]["sharedCounters"] == counter_sets(2)
    assert "devices" not in counters["spec"]
    assert counters["apiVersion"] == f"resource.k8s.io/{api_version}"
    assert device_slice["metadata"]["name"] == f"{NODE}-{DRIVER}-1"
    assert "sharedCounters" not in device_slice["spec"]
    first = device_slice["spec"]["devices"][0]
    consumes = first["basic"]["consumesCounters"] if api_version == "v1beta1" else first["consumesCounters"]
    assert consumes == [{"counterSet": "gpu-0-counter-set", "counters": {"memory": {"value": "10Gi"}}}]


def test_resource_slice_count_counts_the_counter_slices() -> None:
    plan = plan_pool(
        design=design(chunk_pool(consuming_devices(10), counter_sets(10))), existing=[], last_generation=0
    )
    assert len(plan.create) == 4
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in plan.create} == {4}
    assert {b["spec"]["pool"]["generation"] for b in plan.create} == {1}


def test_unchanged_pool_with_counters_plans_nothing() -> None:
    d = design(chunk_pool(consuming_devices(2), counter_sets(2)))
    first = plan_pool(design=d, existing=[], last_generation=0)
    again = plan_pool(
        design=design(chunk_pool(consuming_devices(2), counter_sets(2))),
        existing=server_copy(first),
        last_generation=1,
    )
    assert again.empty
    assert again.generation == 1
    beta = design(chunk_pool(consuming_devices(2), counter_sets(2)), api_version="v1beta1")
    stored = server_copy(plan_pool(design=beta, existing=[], last_generation=0))
    assert plan_pool(design=beta, existing=stored, last_generation=1).empty


def test_a_changed_counter_value_bumps_the_generation() -> None:
    first = plan_pool(
        design=design(chunk_pool(consuming_devices(2), counter_sets(2))), existing=[], last_generation=0
    )
    plan = plan_pool(
        design=design(chunk_pool(consuming_devices(2), counter_sets(2, memory="40Gi"))),
        existing=server_copy(first),
        last_generation=1,
    )
    assert plan.bumped
    assert plan.generation == 2
    assert len(plan.update) == 2  # the device slice moves up with it
    assert plan.update[0]["spec"]["sharedCounters"][1]["counters"]["memory"] == {"value": "40Gi"}
    assert {b["spec"]["pool"]["generation"] for b in plan.update} == {2}


def test_adding_counter_sets_to_a_published_pool_moves_the_devices_behind_them() -> None:
    first = plan_pool(design=design(chunk_pool(devices(8))), existing=[], last_generation=0)
    plan = plan_pool(
        design=design(chunk_pool(devices(8), counter_sets(1))), existing=server_copy(first), last_generation=1
    )
    assert plan.bumped
    assert [b["metadata"]["name"] for b in plan.update] == [f"{NODE}-{DRIVER}-0"]
    assert "sharedCounters" in plan.update[0]["spec"]
    assert "devices" not in plan.update[0]["spec"]
    assert [b["metadata"]["name"] for b in plan.create] == [f"{NODE}-{DRIVER}-1"]


def test_a_server_that_dropped_the_shared_counters_is_accepted_without_a_loop() -> None:
    # DRAPartitionableDevices off: the server stores the counter slice without sharedCounters and
    # the devices without consumesCounters.
    d = design(chunk_pool(consuming_devices(1), counter_sets(1)))
    first = plan_pool(design=d, existing=[], last_generation=0)
    stored = server_copy(first)
    del stored[0]["spec"]["sharedCounters"]
    stored[1]["spec"]["devices"] = [
        {k: v for k, v in dev.items() if k != "consumesCounters"} for dev in stored[1]["spec"]["devices"]
    ]
    assert plan_pool(design=d, existing=stored, last_generation=1).bumped
    assert d.accept(sent=first.create[0], written=stored[0])
    assert d.accept(sent=first.create[1], written=stored[1])
    assert not d.accept(sent=first.create[0], written=stored[0])  # warned once only
    again = plan_pool(design=d, existing=stored, last_generation=1)
    assert again.empty
    assert again.generation == 1
