from __future__ import annotations

import time

from dra_api.model import AllocationResult, ResourceClaim
from dra_operator.model.cluster import ClaimKey, ClusterModel
from dra_operator.model.shares import ShareLedger
from tests.unit.operator.helpers import allocation, claim, gpu_class, gpu_slice


def test_older_watch_event_does_not_roll_back_an_allocation() -> None:
    model = ClusterModel()
    model.upsert_claim(claim("a", rv="10", allocation=allocation("n1", "gpu-0")))
    assert model.upsert_claim(claim("a", rv="9")) is None
    assert ("gpu.nvidia.com", "n1", "gpu-0") in model.devices_in_use()


def test_devices_are_released_when_allocation_is_cleared_or_claim_removed() -> None:
    model = ClusterModel()
    model.upsert_claim(claim("a", rv="1", allocation=allocation("n1", "gpu-0")))
    model.upsert_claim(claim("b", rv="2", allocation=allocation("n1", "gpu-1")))
    model.upsert_claim(claim("a", rv="3"))
    assert model.devices_in_use() == {("gpu.nvidia.com", "n1", "gpu-1")}
    model.remove_claim(ClaimKey("ns", "b"))
    assert model.devices_in_use() == frozenset()


def test_assumed_allocation_holds_devices_until_written() -> None:
    model = ClusterModel()
    model.upsert_claim(claim("a", rv="1"))
    key = ClaimKey("ns", "a")
    model.assume(key, AllocationResult.from_json(allocation("n1", "gpu-3")))
    assert ("gpu.nvidia.com", "n1", "gpu-3") in model.devices_in_use()
    assert [c.name for c in model.allocated_claims()] == ["a"]
    model.upsert_claim(claim("a", rv="2", allocation=allocation("n1", "gpu-3")))
    assert model.assumed(key) is None
    assert ("gpu.nvidia.com", "n1", "gpu-3") in model.devices_in_use()


def test_double_booking_is_detected() -> None:
    model = ClusterModel()
    model.upsert_claim(claim("a", rv="1", allocation=allocation("n1", "gpu-0")))
    model.upsert_claim(claim("b", rv="2", allocation=allocation("n1", "gpu-0")))
    assert model.double_booked() == {
        ("gpu.nvidia.com", "n1", "gpu-0"): {ClaimKey("ns", "a"), ClaimKey("ns", "b")}
    }


def test_shares_beyond_a_devices_capacity_are_overbooked_and_within_it_are_not() -> None:
    model = ClusterModel()
    shared = gpu_slice("n1", 2)
    for device in shared["spec"]["devices"]:
        device["allowMultipleAllocations"] = True
        device["capacity"] = {"memory": {"value": "80Gi"}}
    model.upsert_slice(shared)

    def share(name: str, device: str, memory: str, rv: str) -> None:
        raw = allocation("n1", device)
        raw["devices"]["results"][0]["shareID"] = f"0b8e0c52-5d7d-4c6e-9a51-3c2f1e0d9a0{rv}"
        raw["devices"]["results"][0]["consumedCapacity"] = {"memory": memory}
        model.upsert_claim(claim(name, rv=rv, allocation=raw))

    share("a", "gpu-0", "40Gi", "1")
    share("b", "gpu-0", "40Gi", "2")
    share("c", "gpu-1", "50Gi", "3")
    assert model.double_booked() == {}
    assert ShareLedger(model).overbooked() == {}
    share("d", "gpu-1", "40Gi", "4")  # 90Gi of 80Gi: two allocators raced
    ledger = ShareLedger(model)
    assert ledger.overbooked() == {
        ("gpu.nvidia.com", "n1", "gpu-1"): {ClaimKey("ns", "c"), ClaimKey("ns", "d")}
    }
    model.upsert_claim(claim("d", rv="5"))  # ours given up
    assert ledger.overbooked() == {}
    share("d", "gpu-1", "40Gi", "6")
    assert ledger.overbooked() != {}
    # The capacities follow the slices: a GPU published with more memory holds both shares.
    grown = gpu_slice("n1", 2, rv="7")
    for device in grown["spec"]["devices"]:
        device["allowMultipleAllocations"] = True
        device["capacity"] = {"memory": {"value": "96Gi"}}
    model.upsert_slice(grown)
    assert ledger.overbooked() == {}


def test_one_claims_own_shares_of_a_device_are_not_a_race() -> None:
    model = ClusterModel()
    shared = gpu_slice("n1", 1)
    shared["spec"]["devices"][0]["allowMultipleAllocations"] = True
    shared["spec"]["devices"][0]["capacity"] = {"memory": {"value": "80Gi"}}
    model.upsert_slice(shared)
    raw = allocation("n1", "gpu-0", "gpu-0")
    for i, result in enumerate(raw["devices"]["results"]):
        result["shareID"] = f"0b8e0c52-5d7d-4c6e-9a51-3c2f1e0d9a0{i}"
        result["consumedCapacity"] = {"memory": "50Gi"}
    model.upsert_claim(claim("both", rv="1", allocation=raw))
    # Alone on the device: whatever one allocator wrote is not two allocators racing.
    assert ShareLedger(model).overbooked() == {}


def test_unparsable_claim_is_kept_as_invalid_with_the_reason() -> None:
    model = ClusterModel()
    bad = claim("bad")
    bad["spec"]["devices"]["requests"][0] = {"name": "r"}  # neither exactly nor firstAvailable
    result = model.upsert_claim(bad)
    assert ClaimKey("ns", "bad") in model.invalid_claims
    assert result is not None
    assert "bad" in model.invalid_claims[ClaimKey("ns", "bad")].message


def test_generation_moves_with_slices_and_classes() -> None:
    model = ClusterModel()
    g0 = model.generation
    model.upsert_class(gpu_class())
    model.upsert_slice(gpu_slice("n1", 2))
    assert model.generation == g0 + 2
    model.remove_slice("n1-gpu")
    assert model.slices == {}


def test_listing_older_than_a_deletion_does_not_resurrect_the_claim() -> None:
    model = ClusterModel()
    model.upsert_claim(claim("a", rv="5", allocation=allocation("n1", "gpu-0")))
    model.remove_claim(ClaimKey("ns", "a"), resource_version="7")
    assert model.upsert_claim(claim("a", rv="5", allocation=allocation("n1", "gpu-0"))) is None
    assert model.devices_in_use() == frozenset()
    assert model.upsert_claim(claim("a", rv="9")) is not None  # re-created later


def test_holding_changes_are_logged_for_placers_to_catch_up() -> None:
    model = ClusterModel()
    start = model.holding_position
    model.upsert_claim(claim("a", rv="1", allocation=allocation("n1", "gpu-0")))
    model.upsert_claim(claim("b", rv="2"))  # holds nothing: not a change
    assumed = AllocationResult.from_json(allocation("n1", "gpu-1"))
    model.assume(ClaimKey("ns", "b"), assumed)
    assert model.holding_changes_since(start) == {ClaimKey("ns", "a"), ClaimKey("ns", "b")}
    assert set(model.holding_allocations()) == {ClaimKey("ns", "a"), ClaimKey("ns", "b")}
    middle = model.holding_position
    model.upsert_claim(claim("a", rv="1", allocation=allocation("n1", "gpu-0")))  # same version
    assert model.holding_changes_since(middle) == set()
    model.forget_assumed(ClaimKey("ns", "b"))
    model.remove_claim(ClaimKey("ns", "a"), resource_version="3")
    assert model.holding_changes_since(middle) == {ClaimKey("ns", "a"), ClaimKey("ns", "b")}
    assert dict(model.holding_allocations()) == {}


def test_a_reader_behind_a_trimmed_holding_log_is_told_to_start_over() -> None:
    model = ClusterModel()
    start = model.holding_position
    for i in range(10_005):
        model.upsert_claim(claim("a", rv=str(2 * i + 1), allocation=allocation("n1", "gpu-0")))
        model.upsert_claim(claim("a", rv=str(2 * i + 2)))
    assert model.holding_changes_since(start) is None
    assert model.holding_changes_since(model.holding_position) == set()


def _pending_pod(name: str, *, created: str | None, gated: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if created is not None:
        meta["creationTimestamp"] = created
    spec: dict[str, object] = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}
    if gated:
        spec["schedulingGates"] = [{"name": "wait"}]
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def test_only_pods_that_newly_wait_for_kube_scheduler_count_as_arriving() -> None:
    """A pod listed long after it was made (one stuck pending when the operator starts) is not an
    arrival; a new pod is, and so is a known pod that starts waiting (its gate removed)."""
    now = time.time()

    def stamp(age: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - age))

    model = ClusterModel()
    model.upsert_pod(_pending_pod("stuck", created=stamp(120)))
    assert ("ns", "stuck") in model.unscheduled
    assert model.pods_arrived == 0
    model.upsert_pod(_pending_pod("stuck", created=stamp(120)))  # seen again: still no arrival
    assert model.pods_arrived == 0
    model.upsert_pod(_pending_pod("new", created=stamp(1)))
    assert model.pods_arrived == 1
    model.upsert_pod(_pending_pod("unknown-age", created=None))
    assert model.pods_arrived == 2
    model.upsert_pod(_pending_pod("gated", created=stamp(120), gated=True))
    assert model.pods_arrived == 2
    model.upsert_pod(_pending_pod("gated", created=stamp(120)))
    assert model.pods_arrived == 3


def test_pending_claims_a_pod_owns_are_kept_apart_until_allocated_or_gone() -> None:
    model = ClusterModel()
    model.upsert_claim(claim("standalone", rv="1"))
    model.upsert_claim(claim("of-pod", rv="2", owner_pod=True))
    model.upsert_claim(claim("of-other-pod", rv="3", owner_pod=True))
    assert {c.name for c in model.pending_claims()} == {"standalone", "of-pod", "of-other-pod"}
    assert {c.name for c in model.pending_pod_claims()} == {"of-pod", "of-other-pod"}
    model.upsert_claim(claim("of-pod", rv="4", owner_pod=True, allocation=allocation("n1", "gpu-0")))
    model.remove_claim(ClaimKey("ns", "of-other-pod"))
    assert [c.name for c in model.pending_pod_claims()] == []
    assert [c.name for c in model.pending_claims()] == ["standalone"]


def test_the_reply_to_an_allocation_write_keeps_the_assumed_object() -> None:
    """The claim as the server returns it after the write holds the very allocation assumed (no
    second parse, no holding change for the placer); one that differs is parsed as written."""
    model = ClusterModel()
    key = ClaimKey("ns", "a")
    model.upsert_claim(claim("a", rv="1"))
    written = AllocationResult.from_json(allocation("n1", "gpu-3"))
    model.assume(key, written)
    after_assume = model.holding_position
    reply = model.upsert_claim(claim("a", rv="2", allocation=allocation("n1", "gpu-3")))
    assert isinstance(reply, ResourceClaim)
    assert reply.status.allocation is written
    assert model.assumed(key) is None
    assert model.holding_changes_since(after_assume) == set()
    assert model.devices_in_use() == {("gpu.nvidia.com", "n1", "gpu-3")}
    # A later update with the same allocation keeps it too.
    again = model.upsert_claim(claim("a", rv="3", allocation=allocation("n1", "gpu-3")))
    assert isinstance(again, ResourceClaim)
    assert again.status.allocation is written
    # The server wrote something else (another allocator, a field dropped): what it says counts.
    model.upsert_claim(claim("b", rv="4"))
    model.assume(ClaimKey("ns", "b"), AllocationResult.from_json(allocation("n1", "gpu-4")))
    other = model.upsert_claim(claim("b", rv="5", allocation=allocation("n1", "gpu-5")))
    assert isinstance(other, ResourceClaim)
    assert other.status.allocation == AllocationResult.from_json(allocation("n1", "gpu-5"))
    assert model.devices_in_use() == {("gpu.nvidia.com", "n1", "gpu-3"), ("gpu.nvidia.com", "n1", "gpu-5")}
    changed = model.upsert_claim(claim("a", rv="6", allocation=allocation("n1", "gpu-6")))
    assert isinstance(changed, ResourceClaim)
    assert changed.status.allocation == AllocationResult.from_json(allocation("n1", "gpu-6"))
    assert ("gpu.nvidia.com", "n1", "gpu-3") not in model.devices_in_use()
