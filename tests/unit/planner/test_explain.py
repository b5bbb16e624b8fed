"""Explanations: per-request counts through each check, the failing constraint, advice, length."""

from __future__ import annotations

from dra_operator.planner import EVENT_MESSAGE_LIMIT, truncate
from tests.unit.planner.builders import (
    DRIVER,
    allocation,
    gpu,
    gpus,
    make_planner,
    node_slice,
    not_placed,
    rc,
    request,
)


def test_counts_per_stage_on_the_closest_node_and_cluster_wide() -> None:
    planner = make_planner(
        [node_slice("n1", gpus("n1", 8)), node_slice("n2", gpus("n2", 8))],
        allocated=[
            allocation("n1", *(f"gpu-{i}" for i in range(6))),
            allocation("n2", *(f"gpu-{i}" for i in range(7))),
        ],
    )
    why = not_placed(planner.plan([rc("big", request(count=4))])).explanation
    lines = why.full.splitlines()
    assert lines[0] == (
        "claim default/big cannot be allocated on any of 2 nodes (0 searched; the others have too few "
        "free matching devices)."
    )
    assert lines[1] == (
        f"cluster: request gpu wants 4 of class {DRIVER}: 16 match the class, 16 match the selectors, "
        "3 free; most free on one node: 2"
    )
    # the node with the most free matching devices comes first
    assert lines[3] == (
        f"  n1: request gpu: 8 devices, 8 match class {DRIVER}, 8 match the selectors, 2 free; needs 4"
    )
    assert "lower the count of request gpu or wait for other claims to release devices" in why.full
    assert len(why.short) <= EVENT_MESSAGE_LIMIT
    assert "\n" not in why.short
    assert why.short.startswith("claim default/big cannot be allocated on any of 2 nodes")


def test_selectors_that_keep_nothing_are_named() -> None:
    planner = make_planner([node_slice("n1", gpus("n1", 4, product="A100"))])
    selector = 'device.attributes["gpu.nvidia.com"].productName == "H100"'
    why = not_placed(planner.plan([rc("c", request(selectors=(selector,)))])).explanation
    assert f"n1: request gpu: 4 devices, 4 match class {DRIVER}, 0 match the selectors; needs 1" in why.full
    assert "relax the selectors of request gpu" in why.full


def test_failing_constraint_is_named_with_what_it_turned_away() -> None:
    planner = make_planner([node_slice("n1", [gpu(f"gpu-{i}", root=f"r{i}") for i in range(3)])])
    pair = rc(
        "pair",
        request(count=2),
        constraints=[{"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
    )
    outcome = not_placed(planner.plan([pair]))
    assert outcome.tried == 1
    full = outcome.explanation.full
    assert "constraint (matchAttribute resource.kubernetes.io/pcieRoot on gpu) turned away" in full
    assert "to change: relax constraint (matchAttribute resource.kubernetes.io/pcieRoot on gpu)" in full


def test_taints_are_the_bottleneck_when_nothing_tolerates_them() -> None:
    tainted = gpu("gpu-0")
    tainted["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    planner = make_planner([node_slice("n1", [tainted])])
    why = not_placed(planner.plan([rc("c")])).explanation
    assert "1 free, 0 untainted; needs 1" in why.full
    assert "add a toleration to request gpu" in why.full


def test_incomplete_pools_are_reported() -> None:
    half = node_slice("n1", gpus("n1", 2))
    half["spec"]["pool"]["resourceSliceCount"] = 2
    planner = make_planner([half])
    why = not_placed(planner.plan([rc("c")])).explanation
    assert "unusable pools: gpu.nvidia.com/n1 (incomplete)" in why.full
    assert "wait for pools gpu.nvidia.com/n1 (incomplete) to be complete and valid" in why.full


def test_short_form_fits_an_event_even_for_many_claims() -> None:
    planner = make_planner([node_slice("n1", gpus("n1", 1))])
    claims = [rc(f"claim-with-a-rather-long-name-{i:03d}", request(count=1)) for i in range(40)]
    why = not_placed(planner.plan(claims)).explanation
    assert len(why.full) > EVENT_MESSAGE_LIMIT
    assert len(why.short) <= EVENT_MESSAGE_LIMIT
    assert why.short.endswith("...")


def test_truncate() -> None:
    assert truncate("a  b\nc") == "a b c"
    assert truncate("x" * 2000) == "x" * 1021 + "..."
    assert len(truncate("word " * 500)) <= EVENT_MESSAGE_LIMIT


def test_no_nodes() -> None:
    planner = make_planner([], nodes=[])
    why = not_placed(planner.plan([rc("c")])).explanation
    assert why.full == "the cluster has no nodes"


def test_count_above_any_node_says_so() -> None:
    planner = make_planner([node_slice("n1", gpus("n1", 2)), node_slice("n2", gpus("n2", 4))])
    why = not_placed(planner.plan([rc("c", request(count=6))])).explanation
    assert "n2: request gpu: 4 devices, 4 match class gpu.nvidia.com; needs 6" in why.full
    assert "the closest node, n2, has only 4 devices for request gpu: lower its count" in why.full


def test_requests_that_fit_only_on_different_nodes_are_named() -> None:
    planner = make_planner(
        [node_slice("n1", gpus("n1", 2, product="A")), node_slice("n2", gpus("n2", 2, product="B"))]
    )
    want = 'device.attributes["gpu.nvidia.com"].productName == "{}"'
    claims = [
        rc("x", request(selectors=(want.format("A"),))),
        rc("y", request(selectors=(want.format("B"),))),
    ]
    why = not_placed(planner.plan(claims)).explanation
    assert (
        "to change: no node has room for all requests together (claim default/x request gpu on n1, "
        "claim default/y request gpu on n2 at best): free devices or split them"
    ) in why.full
    assert "cluster: (claim default/x request gpu) wants 1 of class gpu.nvidia.com" in why.full
