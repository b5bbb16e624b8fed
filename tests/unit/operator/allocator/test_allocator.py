"""Allocator behaviour beyond the upstream table: gates, state bookkeeping, caches, node selection."""

from __future__ import annotations

from typing import Any

import pytest

from dra_api.model import DeviceClass, Node, ResourceClaim, ResourceSlice
from dra_api.quantity import Quantity
from dra_operator.allocator import (
    AllocatedState,
    AllocationError,
    Allocator,
    FailedAllocationOnNode,
    FeatureGates,
    SliceIndex,
    parse_device_id,
)
from dra_operator.allocator.pools import SELECTOR_RESULTS_PER_DEVICE

V1 = "resource.k8s.io/v1"
GPU_CLASS = DeviceClass.from_json(
    {
        "apiVersion": V1,
        "kind": "DeviceClass",
        "metadata": {"name": "gpu"},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]},
    }
)


def _slice(name: str, *, devices: int, **placement: Any) -> ResourceSlice:
    return ResourceSlice.from_json(
        {
            "apiVersion": V1,
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": "gpu.example.com",
                "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                **placement,
                "devices": [
                    {
                        "name": f"gpu-{i}",
                        "attributes": {"index": {"int": i}},
                        "capacity": {"memory": {"value": "80Gi"}},
                    }
                    for i in range(devices)
                ],
            },
        }
    )


def _claim(name: str, *, count: int = 1, selector: str | None = None) -> ResourceClaim:
    exactly: dict[str, Any] = {"deviceClassName": "gpu", "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return ResourceClaim.from_json(
        {
            "apiVersion": V1,
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
    )


def test_feature_gates() -> None:
    defaults = FeatureGates()
    assert defaults.consumable_capacity
    assert defaults.device_binding_and_status
    assert not defaults.list_type_attributes
    gates = FeatureGates.from_flag("DRAConsumableCapacity=false,SomeOtherGate=true")
    assert not gates.consumable_capacity
    assert gates.admin_access
    only = FeatureGates.only(["DRADeviceBindingConditions+DRAResourceClaimDeviceStatus"])
    assert only.device_binding_and_status
    assert not only.prioritized_list
    assert only.to_mapping()["DRADeviceBindingConditions"]
    with pytest.raises(ValueError, match="unknown feature gate 'DRAPrioritisedList'"):
        FeatureGates.from_mapping({"DRAPrioritisedList": True})
    with pytest.raises(ValueError, match="expected Name=true"):
        FeatureGates.from_flag("DRAAdminAccess")


def test_parse_device_id_keeps_slashes_in_pool() -> None:
    assert parse_device_id("d/a/b/dev") == ("d", "a/b", "dev")
    with pytest.raises(ValueError, match="driver/pool/device"):
        parse_device_id("d/dev")


def test_note_allocated_and_released_keep_the_allocator_coherent() -> None:
    index = SliceIndex([_slice("node-1", devices=2, nodeName="node-1")])
    allocator = Allocator(classes=[GPU_CLASS], slices=index)
    node = Node.make("node-1")
    first = allocator.allocate(node=node, claims=[_claim("a")])
    assert first is not None
    allocator.note_allocated(first[0])
    second = allocator.allocate(node=node, claims=[_claim("b")])
    assert second is not None
    assert second[0].devices[0].device != first[0].devices[0].device
    allocator.note_allocated(second[0])
    assert allocator.allocate(node=node, claims=[_claim("c")]) is None
    allocator.note_released(first[0])
    third = allocator.allocate(node=node, claims=[_claim("c")])
    assert third is not None
    assert third[0].devices[0].device == first[0].devices[0].device


def test_state_from_claims_ignores_admin_access_and_unallocated() -> None:
    index = SliceIndex([_slice("node-1", devices=2, nodeName="node-1")])
    allocator = Allocator(classes=[GPU_CLASS], slices=index)
    results = allocator.allocate(node=Node.make("node-1"), claims=[_claim("a")])
    assert results is not None
    allocated = _claim("a").to_json()
    allocated["status"] = {"allocation": results[0].to_json()}
    state = AllocatedState.from_claims([ResourceClaim.from_json(allocated), _claim("b")])
    assert state.devices == {("gpu.example.com", "node-1", "gpu-0")}
    state.remove_claim(ResourceClaim.from_json(allocated))
    assert not state.devices


def test_node_selection_and_result_node_selector() -> None:
    slices = [
        _slice("node-1", devices=1, nodeName="node-1"),
        _slice(
            "rack-a",
            devices=1,
            nodeSelector={
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["a"]}]}
                ]
            },
        ),
        _slice("everywhere", devices=1, allNodes=True),
    ]
    allocator = Allocator(classes=[GPU_CLASS], slices=SliceIndex(slices))
    in_rack = Node.make("node-2", {"rack": "a"})
    assert [p.id[1] for p in allocator.pools(in_rack)] == ["everywhere", "rack-a"]
    results = allocator.allocate(node=in_rack, claims=[_claim("a", count=2)])
    assert results is not None
    selector = results[0].to_json()["nodeSelector"]
    assert selector == {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["a"]}]}]
    }
    everywhere = allocator.allocate(node=Node.make("node-3"), claims=[_claim("b")])
    assert everywhere is not None
    assert everywhere[0].node_selector is None
    assert allocator.allocate(node=Node.make("node-3"), claims=[_claim("c", count=2)]) is None


def test_class_results_are_cached_across_allocators_sharing_an_index() -> None:
    from dra_operator.cel import evaluation_count

    # The selector reads a per-device attribute, so CEL's own projection memo cannot hide evaluations.
    by_index = DeviceClass.from_json(
        {
            "apiVersion": V1,
            "kind": "DeviceClass",
            "metadata": {"name": "gpu"},
            "spec": {
                "selectors": [{"cel": {"expression": 'device.attributes["gpu.example.com"].index < 40'}}]
            },
        }
    )
    index = SliceIndex([_slice("node-1", devices=4, nodeName="node-1")])
    node = Node.make("node-1")
    before = evaluation_count()
    assert Allocator(classes=[by_index], slices=index).allocate(node=node, claims=[_claim("a", count=4)])
    assert evaluation_count() - before == 4
    before = evaluation_count()
    assert Allocator(classes=[by_index], slices=index).allocate(node=node, claims=[_claim("a", count=4)])
    assert evaluation_count() == before


def test_cel_runtime_error_is_fatal_and_names_the_device() -> None:
    allocator = Allocator(classes=[GPU_CLASS], slices=[_slice("node-1", devices=1, nodeName="node-1")])
    claim = _claim("a", selector='device.attributes["gpu.example.com"].missing == 1')
    with pytest.raises(
        AllocationError, match=r"claim ns/a: selector #0 on device gpu.example.com/node-1/gpu-0"
    ):
        allocator.allocate(node=Node.make("node-1"), claims=[claim])


def test_search_effort_is_reported() -> None:
    slices = [_slice("node-1", devices=4, nodeName="node-1")]
    allocator = Allocator(classes=[GPU_CLASS], slices=slices, feasibility=False)
    assert allocator.allocate(node=Node.make("node-1"), claims=[_claim("a", count=5)]) is None
    assert allocator.last_invocations == 16  # combinations of 4 devices, as upstream incubating
    # With the feasibility check (the default), a search that outgrows its easy start (2 x 13 + 8
    # steps here, where upstream's would take 2^12) is cut short and the claim refused.
    many = [_slice("node-1", devices=12, nodeName="node-1")]
    checked = Allocator(classes=[GPU_CLASS], slices=many)
    assert checked.allocate(node=Node.make("node-1"), claims=[_claim("a", count=13)]) is None
    assert checked.last_invocations == 2 * 13 + 8
    assert str(checked.last_shortfall) == "request gpu wants 13 devices; 12 devices of the node can serve it"


def test_funnel_counts_each_check() -> None:
    tainted = _slice("node-1", devices=4, nodeName="node-1").to_json()
    tainted["spec"]["devices"][3]["taints"] = [{"key": "bad", "effect": "NoSchedule"}]
    index = SliceIndex([ResourceSlice.from_json(tainted)])
    state = AllocatedState(devices={("gpu.example.com", "node-1", "gpu-0")})
    allocator = Allocator(classes=[GPU_CLASS], slices=index, allocated=state)
    claim = _claim("a", count=3, selector='device.attributes["gpu.example.com"].index >= 1')
    assert allocator.allocate(node=Node.make("node-1"), claims=[claim]) is None
    (funnel,) = allocator.funnel(node=Node.make("node-1"), claims=[claim])
    assert (funnel.claim, funnel.request, funnel.wanted) == ("ns/a", "gpu", 3)
    assert (funnel.devices, funnel.class_matched, funnel.selectors_kept) == (4, 4, 3)
    assert (funnel.free, funnel.untainted, funnel.within_counters, funnel.within_capacity) == (3, 2, 2, 2)


def test_constraint_rejections_are_counted() -> None:
    allocator = Allocator(
        classes=[GPU_CLASS], slices=[_slice("node-1", devices=3, nodeName="node-1")], feasibility=False
    )
    body = _claim("a", count=2).to_json()
    body["spec"]["devices"]["constraints"] = [{"matchAttribute": "gpu.example.com/index"}]
    assert allocator.allocate(node=Node.make("node-1"), claims=[ResourceClaim.from_json(body)]) is None
    assert allocator.last_constraint_rejections[("ns/a", 0)] > 0


def test_rebuilt_index_keeps_cel_results_of_unchanged_devices() -> None:
    unchanged = _slice("node-1", devices=2, nodeName="node-1")
    first = SliceIndex([unchanged, _slice("node-2", devices=2, nodeName="node-2")])
    claim = _claim("a", count=2)
    for name in ("node-1", "node-2"):
        assert Allocator(classes=[GPU_CLASS], slices=first).allocate(node=Node.make(name), claims=[claim])
    changed = _slice("node-2", devices=2, nodeName="node-2").to_json()
    changed["spec"]["devices"][1]["attributes"]["index"] = {"int": 7}
    second = SliceIndex([unchanged, ResourceSlice.from_json(changed)], previous=first)
    cached = {"/".join(e.id): e.class_matches is not None for e in second.all_entries()}
    assert cached == {
        "gpu.example.com/node-1/gpu-0": True,
        "gpu.example.com/node-1/gpu-1": True,
        "gpu.example.com/node-2/gpu-0": True,
        "gpu.example.com/node-2/gpu-1": False,  # changed: evaluated again on first use
    }
    for name in ("node-1", "node-2"):
        assert Allocator(classes=[GPU_CLASS], slices=second).allocate(node=Node.make(name), claims=[claim])


def test_a_device_keeps_a_bounded_number_of_selector_results_and_answers_right_after() -> None:
    """Selectors come from claims: a tenant sending a new one with every claim must not grow every
    device's cache without end. The oldest results go, and asking again gives the same answers."""
    slices = SliceIndex([_slice("node-1", devices=2, nodeName="node-1")])
    allocator = Allocator(classes=[GPU_CLASS], slices=slices)
    node = Node.make("node-1")
    for i in range(3 * SELECTOR_RESULTS_PER_DEVICE):
        # index 1 matches the even selectors, index 0 none of them
        claim = _claim(
            f"c{i}", selector=f"device.attributes['gpu.example.com'].index == {1 if i % 2 else 7} || {i} < 0"
        )
        results = allocator.allocate(node=node, claims=[claim])
        assert (results is not None) == bool(i % 2), i
    for entry in slices.all_entries():
        assert entry.class_matches is not None
        assert len(entry.class_matches) <= SELECTOR_RESULTS_PER_DEVICE
    # An evicted selector set is evaluated again, with the same answer.
    again = allocator.allocate(
        node=node,
        claims=[_claim("again", selector="device.attributes['gpu.example.com'].index == 1 || 1 < 0")],
    )
    assert again is not None
    assert [r.device for r in again[0].devices] == ["gpu-1"]


def test_hopeless_search_times_out() -> None:
    from dra_operator.allocator import AllocationTimeout

    # 24 devices for a request of 25: the combination search visits all 2^24 subsets (the
    # feasibility check, off here, would refuse it at once).
    allocator = Allocator(
        classes=[GPU_CLASS], slices=[_slice("node-1", devices=24, nodeName="node-1")], feasibility=False
    )
    with pytest.raises(AllocationTimeout, match="filter operation aborted"):
        allocator.allocate(node=Node.make("node-1"), claims=[_claim("a", count=25)], timeout=0.05)
    assert allocator.last_invocations < 2**24


def test_many_claims_in_one_call() -> None:
    allocator = Allocator(classes=[GPU_CLASS], slices=[_slice("node-1", devices=128, nodeName="node-1")])
    claims = [_claim(f"c{i}", count=4) for i in range(32)]
    results = allocator.allocate(node=Node.make("node-1"), claims=claims)
    assert results is not None
    assert len({d.device for r in results for d in r.devices}) == 128


def _partitioned_pool(*, counter_set: str = "gpu-0-counters") -> list[ResourceSlice]:
    """One pool on node-1: a counter slice, and a device slice with a whole GPU that consumes no
    counters and one partition that does."""
    pool = {"name": "node-1", "generation": 1, "resourceSliceCount": 2}
    counters = ResourceSlice.from_json(
        {
            "apiVersion": V1,
            "kind": "ResourceSlice",
            "metadata": {"name": "node-1-counters"},
            "spec": {
                "driver": "gpu.example.com",
                "pool": pool,
                "nodeName": "node-1",
                "sharedCounters": [{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}],
            },
        }
    )
    devices = ResourceSlice.from_json(
        {
            "apiVersion": V1,
            "kind": "ResourceSlice",
            "metadata": {"name": "node-1-devices"},
            "spec": {
                "driver": "gpu.example.com",
                "pool": pool,
                "nodeName": "node-1",
                "devices": [
                    {"name": "gpu-1", "attributes": {"kind": {"string": "whole"}}},
                    {
                        "name": "gpu-0-part",
                        "attributes": {"kind": {"string": "partition"}},
                        "consumesCounters": [
                            {"counterSet": counter_set, "counters": {"memory": {"value": "40Gi"}}}
                        ],
                    },
                ],
            },
        }
    )
    return [counters, devices]


PARTITIONABLE_OFF = FeatureGates.from_mapping({"DRAPartitionableDevices": False})
ONLY_PARTITION = 'device.attributes["gpu.example.com"].kind == "partition"'


def test_partitionable_devices_off_skips_counter_consumers_but_keeps_the_pool() -> None:
    allocator = Allocator(classes=[GPU_CLASS], slices=_partitioned_pool(), gates=PARTITIONABLE_OFF)
    node = Node.make("node-1")
    (pool,) = allocator.pools(node)
    assert not pool.unusable
    assert not pool.counter_sets  # the gate hides counters: not read, not validated
    one = allocator.allocate(node=node, claims=[_claim("a")])
    assert one is not None
    assert [d.device for d in one[0].devices] == ["gpu-1"]
    # The partition never counts: two devices do not fit, and that is no error.
    assert allocator.allocate(node=node, claims=[_claim("b", count=2)]) is None
    partition = _claim("c", selector=ONLY_PARTITION)
    assert allocator.allocate(node=node, claims=[partition]) is None
    (funnel,) = allocator.funnel(node=node, claims=[partition])
    assert (funnel.selectors_kept, funnel.free, funnel.untainted) == (1, 1, 1)
    assert (funnel.within_counters, funnel.counters_excluded, funnel.short_counters) == (0, 1, ())
    assert not funnel.unavailable_pools


def test_partitionable_devices_off_makes_all_mode_over_a_counter_consumer_unallocatable() -> None:
    # Upstream lists the partition among "all" devices (the gate is checked only when a device is
    # taken), so the request cannot be met; it is not an error.
    allocator = Allocator(classes=[GPU_CLASS], slices=_partitioned_pool(), gates=PARTITIONABLE_OFF)
    body = _claim("a").to_json()
    body["spec"]["devices"]["requests"][0]["exactly"] = {"deviceClassName": "gpu", "allocationMode": "All"}
    assert allocator.allocate(node=Node.make("node-1"), claims=[ResourceClaim.from_json(body)]) is None


def test_partitionable_devices_on_allocates_counter_consumers() -> None:
    allocator = Allocator(classes=[GPU_CLASS], slices=_partitioned_pool(), gates=FeatureGates())
    node = Node.make("node-1")
    (pool,) = allocator.pools(node)
    assert dict(pool.counter_sets["gpu-0-counters"]) == {"memory": Quantity.parse("80Gi")}
    both = allocator.allocate(node=node, claims=[_claim("a", count=2)])
    assert both is not None
    assert sorted(d.device for d in both[0].devices) == ["gpu-0-part", "gpu-1"]
    partition = allocator.allocate(node=node, claims=[_claim("b", selector=ONLY_PARTITION)])
    assert partition is not None
    assert [d.device for d in partition[0].devices] == ["gpu-0-part"]


def test_counter_references_are_validated_only_with_partitionable_devices_on() -> None:
    broken = _partitioned_pool(counter_set="no-such-counters")
    node = Node.make("node-1")
    off = Allocator(classes=[GPU_CLASS], slices=broken, gates=PARTITIONABLE_OFF)
    assert off.allocate(node=node, claims=[_claim("a", selector=ONLY_PARTITION)]) is None
    on = Allocator(classes=[GPU_CLASS], slices=broken, gates=FeatureGates())
    with pytest.raises(FailedAllocationOnNode, match="invalid resource pools were encountered"):
        on.allocate(node=node, claims=[_claim("a", selector=ONLY_PARTITION)])


def test_feature_gates_of_1_37() -> None:
    defaults = FeatureGates()
    assert not defaults.compatibility_groups
    assert not defaults.optional_node_operations
    assert not defaults.derived_attributes
    assert not defaults.fractional_capacity_range
    on = FeatureGates.from_mapping({"DRADeviceCompatibilityGroups": True, "DRAOptionalNodeOperations": True})
    assert on.compatibility_groups
    assert on.optional_node_operations
    assert FeatureGates.from_flag("DRADerivedAttributes=false,DRAFractionalCapacityRange=false") == defaults
    both = FeatureGates.from_flag("DRADerivedAttributes=true,DRAFractionalCapacityRange=true")
    assert both.derived_attributes
    assert both.fractional_capacity_range


def _derived_claim() -> ResourceClaim:
    body = _claim("a").to_json()
    body["spec"]["devices"]["requests"][0]["exactly"]["derivedAttributes"] = [
        {"name": "example.com/numa", "expression": 'device.attributes["gpu.example.com"].index'}
    ]
    body["spec"]["devices"]["constraints"] = [{"matchAttribute": "example.com/numa"}]
    return ResourceClaim.from_json(body)


def test_derived_attributes_are_refused_with_the_gate_off_and_derived_with_it_on() -> None:
    claim = _derived_claim()
    assert claim.spec.requests[0].exactly is not None
    assert claim.spec.requests[0].exactly.derived_attributes[0].name == "example.com/numa"
    slices = [_slice("node-1", devices=1, nodeName="node-1")]
    # Every upstream variant refuses them rather than ignore what the constraint needs.
    allocator = Allocator(classes=[GPU_CLASS], slices=slices)
    with pytest.raises(AllocationError, match="request gpu: cannot handle request with derived attributes"):
        allocator.allocate(node=Node.make("node-1"), claims=[claim])
    # With the gate on, the request derives the attribute the device lacks.
    derived = FeatureGates.from_mapping({"DRADerivedAttributes": True})
    results = Allocator(classes=[GPU_CLASS], slices=slices, gates=derived).allocate(
        node=Node.make("node-1"), claims=[claim]
    )
    assert results is not None


def test_skip_node_operations_needs_the_node_feature_with_the_gate_on_and_is_ignored_with_it_off() -> None:
    skipping = _slice("node-1", devices=1, nodeName="node-1").to_json()
    skipping["spec"]["skipNodeOperations"] = ["NodePrepareResources"]
    index = SliceIndex([ResourceSlice.from_json(skipping)])
    declared = Node.make("node-1", declared_features=["DRAOptionalNodeOperations"])
    on = FeatureGates.from_mapping({"DRAOptionalNodeOperations": True})
    # Gate on, node without the feature: left out (upstream's experimental variant).
    allocator = Allocator(classes=[GPU_CLASS], slices=index, gates=on)
    assert allocator.allocate(node=Node.make("node-1"), claims=[_claim("a")]) is None
    (funnel,) = allocator.funnel(node=Node.make("node-1"), claims=[_claim("a")])
    assert (funnel.devices, funnel.node_operations_excluded, funnel.class_matched) == (1, 1, 0)
    results = Allocator(classes=[GPU_CLASS], slices=index, gates=on).allocate(
        node=declared, claims=[_claim("a")]
    )
    assert results is not None
    assert results[0].devices[0].skip_node_operations == ("NodePrepareResources",)
    assert results[0].to_json()["devices"]["results"][0]["skipNodeOperations"] == ["NodePrepareResources"]
    # Gate off: the field is ignored, as kube-scheduler's default variant ignores it; not copied.
    for node in (Node.make("node-1"), declared):
        plain = Allocator(classes=[GPU_CLASS], slices=index).allocate(node=node, claims=[_claim("a")])
        assert plain is not None
        assert plain[0].devices[0].skip_node_operations == ()
        assert "skipNodeOperations" not in plain[0].to_json()["devices"]["results"][0]


def test_node_declared_features_come_from_its_status() -> None:
    node = Node.from_json(
        {"metadata": {"name": "n"}, "status": {"declaredFeatures": ["DRAOptionalNodeOperations"]}}
    )
    assert node.declared_features == ("DRAOptionalNodeOperations",)
    assert Node.from_json({"metadata": {"name": "n"}}).declared_features == ()
