"""Cluster-wide placement: policies, pruning, incremental counts, shared devices, errors."""

from __future__ import annotations

from typing import Any

import pytest

from dra_api.model import AllocationResult, DeviceClass, Node, ResourceClaim, ResourceSlice
from dra_operator.allocator import Allocator, SliceIndex
from dra_operator.planner import PlanError
from tests.unit.operator.planner.builders import (
    DRIVER,
    allocation,
    device_class,
    devices_of,
    gpu,
    gpus,
    make_planner,
    node_slice,
    not_placed,
    placed,
    rc,
    request,
    shared_slice,
)

# Free GPUs: n1: 4, n2: 2, n3: 6
UNEVEN = [node_slice("n1", gpus("n1", 4)), node_slice("n2", gpus("n2", 2)), node_slice("n3", gpus("n3", 6))]


@pytest.mark.parametrize(
    ("policy", "count", "node"),
    [
        ("first-fit", 2, "n1"),
        ("bin-pack", 2, "n2"),
        ("spread", 2, "n3"),
        ("first-fit", 5, "n3"),
        ("bin-pack", 3, "n1"),
        ("spread", 1, "n3"),
    ],
)
def test_policies_choose_the_expected_node(policy: str, count: int, node: str) -> None:
    planner = make_planner(UNEVEN, policy=policy)
    outcome = placed(planner.plan([rc("c", request(count=count))]))
    assert outcome.node == node
    assert outcome.node_bound
    assert len(outcome.allocations[0].devices) == count


def test_only_nodes_with_enough_free_devices_are_searched() -> None:
    planner = make_planner(UNEVEN)
    calls: list[str] = []
    real = planner.allocator.allocate

    def counting(**kwargs: Any) -> Any:
        calls.append(kwargs["node"].name)
        return real(**kwargs)

    planner.allocator.allocate = counting  # type: ignore[method-assign]
    outcome = placed(planner.plan([rc("c", request(count=5))]))
    assert outcome.node == "n3"
    assert calls == ["n3"]
    calls.clear()
    not_placed(planner.plan([rc("c", request(count=7))]))
    assert calls == []


def test_notes_keep_counts_current_until_full_and_after_release() -> None:
    planner = make_planner([node_slice("n1", gpus("n1", 2)), node_slice("n2", gpus("n2", 2))])
    results = []
    for i in range(4):
        outcome = placed(planner.plan([rc(f"c{i}")]))
        planner.note_allocated(outcome.allocations[0])
        results.append((outcome.node, devices_of(outcome)))
        assert outcome.tried == 1  # a full node is never searched again
    assert results == [
        ("n1", ["n1/gpu-0"]),
        ("n1", ["n1/gpu-1"]),
        ("n2", ["n2/gpu-0"]),
        ("n2", ["n2/gpu-1"]),
    ]
    full = not_placed(planner.plan([rc("late")]))
    assert full.tried == 0
    assert "0 free" in full.explanation.full
    planner.note_released(
        AllocationResult.from_json(allocation("n2", "gpu-0")),
    )
    again = placed(planner.plan([rc("late")]))
    assert (again.node, devices_of(again)) == ("n2", ["n2/gpu-0"])


def test_existing_allocations_are_not_free() -> None:
    planner = make_planner(
        [node_slice("n1", gpus("n1", 2)), node_slice("n2", gpus("n2", 2))],
        allocated=[allocation("n1", "gpu-0", "gpu-1")],
    )
    outcome = placed(planner.plan([rc("c", request(count=2))]))
    assert outcome.node == "n2"
    assert outcome.tried == 1


def test_shared_devices_make_every_node_a_candidate() -> None:
    planner = make_planner(
        [shared_slice("net", [gpu("nic-0"), gpu("nic-1")]), node_slice("n1", gpus("n1", 1))],
        nodes=["a-empty", "n1"],
    )
    outcome = placed(planner.plan([rc("c", request(count=2))]))
    # a node without local devices reaches the shared pool; the result is usable anywhere
    assert outcome.node == "a-empty"
    assert not outcome.node_bound
    assert devices_of(outcome) == ["net/nic-0", "net/nic-1"]
    planner.note_allocated(outcome.allocations[0])
    # now only n1's own GPU is left: three devices are too many anywhere
    not_placed(planner.plan([rc("d", request(count=2))]))
    assert devices_of(placed(planner.plan([rc("e")]))) == ["n1/gpu-0"]


def test_fixed_node_is_the_only_one_tried() -> None:
    planner = make_planner(UNEVEN)
    outcome = placed(planner.plan([rc("c", request(count=2))], node="n3"))
    assert outcome.node == "n3"
    refused = not_placed(planner.plan([rc("c", request(count=3))], node="n2"))
    assert refused.explanation.full.startswith("claim default/c cannot be allocated on node n2")
    assert "needs 3" in refused.explanation.full
    unknown = not_placed(planner.plan([rc("c")], node="nowhere"))
    assert "0 devices" in unknown.explanation.full


def test_constraint_failing_on_first_node_moves_on_to_the_next() -> None:
    spread_roots = [gpu(f"gpu-{i}", root=f"r{i}") for i in range(4)]
    paired = [gpu(f"gpu-{i}", root="r0") for i in range(2)]
    planner = make_planner([node_slice("n1", spread_roots), node_slice("n2", paired)])
    pair = rc(
        "pair",
        request(count=2),
        constraints=[{"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
    )
    outcome = placed(planner.plan([pair]))
    assert outcome.node == "n2"
    assert outcome.tried == 2


def test_first_fit_agrees_with_trying_every_node_in_order() -> None:
    """The index only prunes: first-fit must pick what a plain loop over all nodes picks."""
    slices = [
        node_slice("n1", [gpu(f"gpu-{i}", product="A", root=f"r{i % 2}") for i in range(3)]),
        node_slice("n2", [gpu(f"gpu-{i}", product="B", memory="40Gi", root="r0") for i in range(4)]),
        node_slice(
            "n3", [gpu(f"gpu-{i}", product="A" if i % 2 else "B", root=f"r{i // 2}") for i in range(6)]
        ),
        shared_slice("pool", [gpu("s-0", product="B")]),
    ]
    planner = make_planner(slices)
    index = SliceIndex([ResourceSlice.from_json(s) for s in slices])
    naive = Allocator(classes=[DeviceClass.from_json(device_class())], slices=index)
    nodes = [Node.make(n) for n in ("n1", "n2", "n3")]
    product_b = 'device.attributes["gpu.nvidia.com"].productName == "B"'
    big = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("64Gi")) >= 0'
    sequence = [
        rc("a", request(count=2, selectors=(product_b,))),
        rc("b", request(count=3)),
        rc("c", request(count=2, selectors=(big,))),
        rc("d", request(count=1, selectors=(product_b,)), request("x", count=2)),
        rc("e", request(count=4)),
        rc("f", request(mode="All", selectors=(big,))),
        rc("g", request(count=1)),
        rc("h", request(count=2, selectors=(product_b,))),
        rc("i", request(count=3)),
    ]
    seen_fail = False
    for c in sequence:
        expected = None
        for node in nodes:
            results = naive.allocate(node=node, claims=[c])
            if results is not None:
                expected = (node.name, results)
                break
        outcome = planner.plan([c])
        if expected is None:
            not_placed(outcome)
            seen_fail = True
            continue
        got = placed(outcome)
        assert (got.node, got.allocations[0]) == (expected[0], expected[1][0]), c.name
        naive.note_allocated(expected[1][0])
        planner.note_allocated(got.allocations[0])
    assert seen_fail  # the sequence exhausts the cluster, so pruning is exercised both ways


def test_first_available_and_all_mode_are_pruned_correctly() -> None:
    planner = make_planner(
        [node_slice("n1", gpus("n1", 2)), node_slice("n2", gpus("n2", 3))],
        allocated=[allocation("n2", "gpu-0")],
    )
    # All: n1 is entirely free; n2 has a device in use, so All cannot succeed there
    everything = placed(planner.plan([rc("all", request(mode="All"))]))
    assert (everything.node, devices_of(everything)) == ("n1", ["n1/gpu-0", "n1/gpu-1"])
    planner.note_allocated(everything.allocations[0])
    not_placed(planner.plan([rc("all2", request(mode="All"))]))
    prioritized = ResourceClaim.from_json(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "fa", "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "firstAvailable": [
                                {"name": "many", "deviceClassName": DRIVER, "count": 4},
                                {"name": "two", "deviceClassName": DRIVER, "count": 2},
                            ],
                        }
                    ]
                }
            },
        }
    )
    outcome = placed(planner.plan([prioritized]))
    assert outcome.node == "n2"
    assert {r.request for r in outcome.allocations[0].devices} == {"gpu/two"}


def test_claims_of_a_pod_are_allocated_together_on_one_node() -> None:
    planner = make_planner(UNEVEN)
    outcome = placed(planner.plan([rc("a", request(count=3)), rc("b", request(count=2))]))
    assert outcome.node == "n3"
    assert len(outcome.allocations) == 2
    assert not set(devices_of(outcome, 0)) & set(devices_of(outcome, 1))


def test_node_selector_slices_follow_node_labels() -> None:
    zoned = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "zone-a"},
        "spec": {
            "driver": DRIVER,
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            },
            "pool": {"name": "zone-a", "generation": 1, "resourceSliceCount": 1},
            "devices": [gpu("z-0")],
        },
    }
    planner = make_planner([zoned], nodes=["b1", "b2", "in-a"], labels={"in-a": {"zone": "a"}})
    outcome = placed(planner.plan([rc("c")]))
    assert outcome.node == "in-a"
    assert outcome.node_bound
    assert outcome.tried == 3  # the shared pool makes every node a candidate; the allocator decides


@pytest.mark.parametrize(
    ("make", "reason", "text"),
    [
        (lambda: rc("c", request(cls="missing")), "DeviceClassNotFound", "device class missing not found"),
        (lambda: rc("c", request(selectors=("device.driver ==",))), "InvalidSelector", "CEL compile error"),
    ],
)
def test_errors_in_claims_are_errors(make: Any, reason: str, text: str) -> None:
    outcome = make_planner(UNEVEN).plan([make()])
    assert isinstance(outcome, PlanError), outcome
    assert outcome.reason == reason
    assert text in outcome.message


def test_invalid_class_selector_is_an_error() -> None:
    planner = make_planner(UNEVEN, classes=[device_class(DRIVER, "device.attributes[")])
    outcome = planner.plan([rc("c")])
    assert isinstance(outcome, PlanError)
    assert outcome.reason == "InvalidDeviceClass"
    assert outcome.message.startswith(f"class {DRIVER}: selector #0: CEL compile error")


def test_cel_runtime_error_is_an_error_not_unallocatable() -> None:
    planner = make_planner(UNEVEN)
    outcome = planner.plan([rc("c", request(selectors=('device.attributes["gpu.nvidia.com"].nope == "x"',)))])
    assert isinstance(outcome, PlanError), outcome
    assert "CEL runtime error" in outcome.message
    assert "nope" in outcome.message


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown placement policy"):
        make_planner(UNEVEN, policy="random")


def test_first_fit_evaluates_only_the_nodes_it_reaches() -> None:
    planner = make_planner([node_slice(f"n{i}", gpus(f"n{i}", 2)) for i in range(5)])
    outcome = placed(planner.plan([rc("c")]))
    assert outcome.node == "n0"
    (counts,) = [planner.index.counts(k) for k in list(planner.index._keys)]
    assert counts.pending == [1, 2, 3, 4]
    # an allocation noted on a node not evaluated yet is counted when that node is reached
    planner.note_allocated(AllocationResult.from_json(allocation("n1", "gpu-0")))
    pair = placed(planner.plan([rc("d", request(count=2))]))
    assert pair.node == "n0"
    planner.note_allocated(pair.allocations[0])
    calls: list[str] = []
    real = planner.allocator.allocate

    def counting(**kwargs: Any) -> Any:
        calls.append(kwargs["node"].name)
        return real(**kwargs)

    planner.allocator.allocate = counting  # type: ignore[method-assign]
    # n0 is full and n1 has one free device: n2 is the first node searched
    assert placed(planner.plan([rc("e", request(count=2))])).node == "n2"
    assert calls == ["n2"]
    assert counts.free[:3] == [0, 1, 2]
    assert counts.pending == [3, 4]
    planner.index.complete(counts)
    assert counts.pending == []
    assert counts.free == [0, 1, 2, 2, 2]


@pytest.mark.parametrize(("policy", "node"), [("first-fit", "n1"), ("bin-pack", "n2"), ("spread", "n3")])
def test_policies_with_several_keys_sum_the_free_matching_devices(policy: str, node: str) -> None:
    def mixed(name: str, each: int) -> dict[str, Any]:
        devices = [gpu(f"a-{i}", product="A") for i in range(each)] + [
            gpu(f"b-{i}", product="B") for i in range(each)
        ]
        return node_slice(name, devices)

    planner = make_planner([mixed("n1", 2), mixed("n2", 1), mixed("n3", 4)], policy=policy)
    want = 'device.attributes["gpu.nvidia.com"].productName == "{}"'
    claims = [
        rc("x", request(selectors=(want.format("A"),))),
        rc("y", request(selectors=(want.format("B"),))),
    ]
    outcome = placed(planner.plan(claims))
    assert outcome.node == node
    assert [d.split("/")[1][0] for d in devices_of(outcome, 0) + devices_of(outcome, 1)] == ["a", "b"]
