"""Explanations: per-request counts through each check, the failing constraint, advice, length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_api.model import AllocationResult
from dra_node_agent.publisher import chunk_pool
from dra_node_agent.simulated.discovery import SimulatedBackend
from dra_operator.allocator import FeatureGates
from dra_operator.planner import EVENT_MESSAGE_LIMIT, truncate
from tests.unit.operator.planner.builders import (
    DRIVER,
    allocation,
    devices_of,
    gpu,
    gpus,
    make_planner,
    node_slice,
    not_placed,
    placed,
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
    """Refused by the feasibility check; the search's own count of turned-away devices is in
    test_constraint_rejections_are_named_when_the_search_runs."""
    planner = make_planner([node_slice("n1", [gpu(f"gpu-{i}", root=f"r{i}") for i in range(3)])])
    pair = rc(
        "pair",
        request(count=2),
        constraints=[{"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
    )
    outcome = not_placed(planner.plan([pair]))
    assert outcome.tried == 1
    full = outcome.explanation.full
    assert (
        "request gpu wants 2 devices sharing one value under constraint (matchAttribute "
        "resource.kubernetes.io/pcieRoot on gpu); no value has that many that can serve it together "
        "(the most sharing one value: 1)"
    ) in full
    assert "to change: relax constraint (matchAttribute resource.kubernetes.io/pcieRoot on gpu)" in full


def test_constraint_rejections_are_named_when_the_search_runs() -> None:
    # The same claim with the feasibility check off: the search runs and counts what it turned away.
    planner = make_planner(
        [node_slice("n1", [gpu(f"gpu-{i}", root=f"r{i}") for i in range(3)])], feasibility=False
    )
    pair = rc(
        "pair",
        request(count=2),
        constraints=[{"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
    )
    full = not_placed(planner.plan([pair])).explanation.full
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


def _mig_pool(node: str) -> list[dict[str, Any]]:
    """An A100's dynamic MIG as NVIDIA publishes it: a counter set of eight memory slices and the
    multiprocessors, in a slice of its own, and one device per placement consuming them."""
    counters = {f"memory-slice-{i}": {"value": "1"} for i in range(8)} | {"multiprocessors": {"value": "98"}}

    def placement(profile: str, start: int, size: int, sms: int) -> dict[str, Any]:
        used = {f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)}
        return {
            "name": f"gpu-0-mig-{profile}-{start}",
            "attributes": {"profile": {"string": profile}},
            "consumesCounters": [
                {
                    "counterSet": "gpu-0-counter-set",
                    "counters": used | {"multiprocessors": {"value": str(sms)}},
                }
            ],
        }

    placements = [
        placement("3g.20gb", 0, 4, 42),
        placement("3g.20gb", 4, 4, 42),
        placement("4g.20gb", 0, 4, 56),
    ]
    counter_slice = node_slice(node, [])
    counter_slice["metadata"]["name"] = f"{node}-counters"
    del counter_slice["spec"]["devices"]
    counter_slice["spec"]["sharedCounters"] = [{"name": "gpu-0-counter-set", "counters": counters}]
    device_slice = node_slice(node, placements)
    for piece in (counter_slice, device_slice):
        piece["spec"]["pool"]["resourceSliceCount"] = 2
    return [counter_slice, device_slice]


def test_partitions_that_fit_the_counters_are_placed_and_an_overlapping_one_names_the_counters() -> None:
    three_g = 'device.attributes["gpu.nvidia.com"].profile == "3g.20gb"'
    planner = make_planner(_mig_pool("n1"))
    # Two 3g placements side by side fit the GPU's eight memory slices.
    pair = placed(planner.plan([rc("pair", request(count=2, selectors=(three_g,)))]))
    assert sorted(devices_of(pair)) == ["n1/gpu-0-mig-3g.20gb-0", "n1/gpu-0-mig-3g.20gb-4"]

    allocated = [allocation("n1", "gpu-0-mig-3g.20gb-0", "gpu-0-mig-3g.20gb-4")]
    planner = make_planner(_mig_pool("n1"), allocated=allocated)
    four_g = 'device.attributes["gpu.nvidia.com"].profile == "4g.20gb"'
    why = not_placed(planner.plan([rc("third", request(selectors=(four_g,)))])).explanation
    # The 4g placement is free itself, but the slices it needs are taken by the 3g partitions.
    assert "1 match the selectors, 1 free, 1 untainted, 0 within counters; needs 1" in why.full
    used_up = why.full.split("(counters used up: ", 1)[1].split(")", 1)[0]
    pool = f"{DRIVER}/n1 gpu-0-counter-set"
    # Memory slices 0-3 (the 3g partition at 0 holds them) and the multiprocessors (84 of 98 taken).
    assert used_up == ", ".join(
        f"{pool}/{c} for 1 device" for c in [*(f"memory-slice-{i}" for i in range(4)), "multiprocessors"]
    )
    assert "release other partitions of the same devices (counters used up:" in why.full


def test_partitions_are_left_out_not_the_pool_when_partitionable_devices_is_off() -> None:
    off = FeatureGates.from_mapping({"DRAPartitionableDevices": False})
    planner = make_planner(_mig_pool("n1"), gates=off)
    why = not_placed(planner.plan([rc("c")])).explanation
    # Each placement consumes counters: the gate keeps all three out, the pool itself stays usable.
    assert (
        f"n1: request gpu: 3 devices, 3 match class {DRIVER}, 3 match the selectors, 3 free, 3 untainted, "
        "0 within counters; needs 1 (3 consuming counters left out: DRAPartitionableDevices is off)"
    ) in why.full
    assert (
        "to change: 3 devices for request gpu consume counters, which the allocator skips while feature "
        "gate DRAPartitionableDevices is off: ask for devices that consume no counters, or turn the gate on"
    ) in why.full
    assert "unusable pools" not in why.full
    assert "invalid" not in why.full
    assert "release other partitions" not in why.full


def test_the_agents_dynamic_mig_pool_holds_two_3g_placements_and_refuses_a_third(tmp_path: Path) -> None:
    """The pool exactly as the agent publishes it for the simulated A100 40GB, A100 80GB and H100
    (``--dynamic-mig``): counter slices first, then the placements."""
    inventory = SimulatedBackend(
        profile="mig-dynamic", node_name="n1", state_dir=tmp_path, driver=DRIVER, dynamic_mig=True
    ).discover_sync()
    chunks = chunk_pool(inventory.slice_devices(), inventory.slice_counter_sets())
    pool = []
    for index, chunk in enumerate(chunks):
        piece = node_slice("n1", [])
        piece["metadata"]["name"] = f"n1-{DRIVER}-{index}"
        del piece["spec"]["devices"]
        piece["spec"].update(chunk.spec(api_version="v1"))
        piece["spec"]["pool"]["resourceSliceCount"] = len(chunks)
        pool.append(piece)
    three_g = f'device.attributes["{DRIVER}"].profile == "3g.20gb"'
    pair = placed(make_planner(pool).plan([rc("pair", request(count=2, selectors=(three_g,)))]))
    assert sorted(devices_of(pair)) == ["n1/gpu-0-mig-3g20gb-9-0", "n1/gpu-0-mig-3g20gb-9-4"]

    planner = make_planner(pool, allocated=[allocation("n1", *(d.split("/")[1] for d in devices_of(pair)))])
    third = not_placed(planner.plan([rc("third", request(selectors=(three_g,)))])).explanation
    assert "2 match the selectors, 0 free; needs 1" in third.full
    # The GPU's 1g placements are free devices, but the memory slices they need are used up.
    one_g = f'device.attributes["{DRIVER}"].profile == "1g.5gb"'
    why = not_placed(planner.plan([rc("small", request(selectors=(one_g,)))])).explanation
    assert "7 match the selectors, 7 free, 7 untainted, 0 within counters; needs 1" in why.full
    assert f"{DRIVER}/n1 gpu-0-counter-set/memory-slice-" in why.full
    # Those of the other GPUs are not.
    one_g_80 = f'device.attributes["{DRIVER}"].profile == "1g.10gb"'
    assert placed(planner.plan([rc("elsewhere", request(selectors=(one_g_80,)))]))


def _parsed(obj: dict[str, Any]) -> AllocationResult:
    found = rc("holder", allocation=obj).status.allocation
    assert found is not None
    return found


def _full_cluster(planner_nodes: int = 3) -> list[dict[str, Any]]:
    return [node_slice(f"n{i}", gpus(f"n{i}", 2)) for i in range(planner_nodes)]


def test_alike_claims_that_cannot_fit_get_the_same_words_as_a_fresh_planner_gives() -> None:
    """The memo: the second claim's explanation is the first's body under its own name, and equals
    what a planner that explained nothing before says about it."""
    slices = _full_cluster()
    held = [allocation(f"n{i}", "gpu-0", "gpu-1") for i in range(3)]
    planner = make_planner(slices, allocated=held)
    first = not_placed(planner.plan([rc("first", request(count=2))])).explanation
    second = not_placed(planner.plan([rc("second", request(count=2))])).explanation
    fresh = not_placed(
        make_planner(slices, allocated=held).plan([rc("second", request(count=2))])
    ).explanation
    assert second == fresh
    assert first.full.startswith("claim default/first cannot be allocated")
    assert second.full.startswith("claim default/second cannot be allocated")
    assert first.full.split("\n")[1:] == second.full.split("\n")[1:]
    # A claim of another spec is explained on its own.
    other = not_placed(planner.plan([rc("third", request(count=3))])).explanation
    assert "needs 3" in other.full


def test_an_explanation_is_not_reused_once_the_cluster_changed() -> None:
    slices = _full_cluster()
    planner = make_planner(slices, allocated=[allocation(f"n{i}", "gpu-0", "gpu-1") for i in range(3)])
    before = not_placed(planner.plan([rc("a", request(count=2))])).explanation
    assert "0 free" in before.full
    # n0's devices are released, then one is taken again: the counts the text gives move each time.
    planner.note_released(_parsed(allocation("n0", "gpu-0", "gpu-1")))
    planner.note_allocated(_parsed(allocation("n0", "gpu-0")))
    after = not_placed(planner.plan([rc("b", request(count=2))])).explanation
    assert "1 free" in after.full, after.full
    fresh = not_placed(
        make_planner(
            slices,
            allocated=[allocation("n0", "gpu-0"), *(allocation(f"n{i}", "gpu-0", "gpu-1") for i in (1, 2))],
        ).plan([rc("b", request(count=2))])
    ).explanation
    assert after == fresh


def test_several_claims_together_are_explained_afresh_each_time() -> None:
    planner = make_planner(
        _full_cluster(), allocated=[allocation(f"n{i}", "gpu-0", "gpu-1") for i in range(3)]
    )
    one = not_placed(planner.plan([rc("x", request()), rc("y", request())])).explanation
    two = not_placed(planner.plan([rc("u", request()), rc("v", request())])).explanation
    assert "claim default/x request gpu" in one.full
    assert "claim default/u request gpu" in two.full
    assert "default/x" not in two.full


def test_a_queue_of_alike_claims_reads_the_funnels_once(monkeypatch: pytest.MonkeyPatch) -> None:
    planner = make_planner(
        _full_cluster(), allocated=[allocation(f"n{i}", "gpu-0", "gpu-1") for i in range(3)]
    )
    calls = []
    funnel = planner.allocator.funnel

    def counted(**kwargs: Any) -> Any:
        calls.append(kwargs["node"].name)
        return funnel(**kwargs)

    monkeypatch.setattr(planner.allocator, "funnel", counted)
    for i in range(20):
        not_placed(planner.plan([rc(f"c{i}", request(count=2))]))
    assert len(calls) == 3  # the three closest nodes, once


def _scenarios() -> list[tuple[str, Any, Any]]:
    """(name, planner builder, claim builder by name): refusals of several kinds."""
    pcie = [{"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    tainted = gpu("gpu-0")
    tainted["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    half = node_slice("n1", gpus("n1", 2))
    half["spec"]["pool"]["resourceSliceCount"] = 2
    roots = [node_slice("n1", [gpu(f"gpu-{i}", root=f"r{i}") for i in range(3)])]
    return [
        (
            "count",
            lambda: make_planner(
                [node_slice("n1", gpus("n1", 8)), node_slice("n2", gpus("n2", 8))],
                allocated=[
                    allocation("n1", *(f"gpu-{i}" for i in range(6))),
                    allocation("n2", *(f"gpu-{i}" for i in range(7))),
                ],
            ),
            lambda name: rc(name, request(count=4)),
        ),
        (
            "selectors",
            lambda: make_planner([node_slice("n1", gpus("n1", 4, product="A100"))]),
            lambda name: rc(
                name, request(selectors=('device.attributes["gpu.nvidia.com"].productName == "H"',))
            ),
        ),
        (
            "feasibility",
            lambda: make_planner(roots),
            lambda name: rc(name, request(count=2), constraints=pcie),
        ),
        (
            "search",
            lambda: make_planner(roots, feasibility=False),
            lambda name: rc(name, request(count=2), constraints=pcie),
        ),
        ("taints", lambda: make_planner([node_slice("n1", [tainted])]), lambda name: rc(name)),
        ("incomplete", lambda: make_planner([half]), lambda name: rc(name)),
        ("fixed node", lambda: make_planner(roots), lambda name: rc(name, request(count=5))),
    ]


@pytest.mark.parametrize(("name", "build", "make"), _scenarios(), ids=[s[0] for s in _scenarios()])
def test_a_remembered_explanation_reads_as_a_fresh_one(name: str, build: Any, make: Any) -> None:
    node = "n1" if name == "fixed node" else None
    planner = build()
    first = not_placed(planner.plan([make("first")], node=node)).explanation
    second = not_placed(planner.plan([make("second")], node=node)).explanation
    fresh = not_placed(build().plan([make("second")], node=node)).explanation
    assert second == fresh
    assert "first" not in second.full
    assert first.full.split("\n", 1)[1] == second.full.split("\n", 1)[1]
