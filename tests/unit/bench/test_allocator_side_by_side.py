"""The side-by-side benchmark's inputs and agreement (no timing): the JSON the Python side writes
is what both allocators read, and on a small cluster the upstream Go allocator (built here from
``bench/go_allocator``) and our planner place every claim of every mix on the same node and
devices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.allocator_bench import GPUS_PER_NODE, MIXES, capacity
from bench.allocator_side_by_side import Ours, build_go, compare, run_go, scenario

NODES = 10


@pytest.fixture(scope="module")
def go_binary() -> Path:
    binary, _ = build_go()  # the per-user cache: built once per version of its sources
    return binary


@pytest.fixture(scope="module")
def cluster_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    data = scenario(NODES, 1000)
    path = tmp_path_factory.mktemp("scenario") / "cluster.json"
    path.write_text(json.dumps(data))
    return path, data


def test_scenario_round_trips_and_fills_the_cluster(cluster_file: tuple[Path, dict[str, Any]]) -> None:
    path, data = cluster_file
    assert json.loads(path.read_text()) == data
    assert data["nodes"] == [f"node-{n:05d}" for n in range(NODES)]
    assert [s["spec"]["nodeName"] for s in data["resourceSlices"]] == data["nodes"]
    assert all(len(s["spec"]["devices"]) == GPUS_PER_NODE for s in data["resourceSlices"])
    assert {mix: len(cs) for mix, cs in data["mixes"].items()} == {m: capacity(m, NODES) for m in MIXES}
    ours = Ours(json.loads(path.read_text()))
    assert len(ours.nodes) == NODES
    assert len(list(ours.index.all_entries())) == NODES * GPUS_PER_NODE
    assert {mix: [c.name for c in cs] for mix, cs in ours.claims.items()} == {
        mix: [c["metadata"]["name"] for c in cs] for mix, cs in data["mixes"].items()
    }


@pytest.mark.parametrize("mix", MIXES)
def test_go_and_ours_place_the_same_claims(
    mix: str, go_binary: Path, cluster_file: tuple[Path, dict[str, Any]]
) -> None:
    path, data = cluster_file
    go = run_go(go_binary, path, mix)
    ours = Ours(data).run(mix)
    # 1.37's default gates select upstream's "incubating" implementation, as kube-scheduler's.
    assert go["allocator"] == "*incubating.Allocator"
    # The empty cluster holds exactly this many claims of the mix: all fit, both sides.
    assert go["allocated"] == ours["allocated"] == capacity(mix, NODES)
    assert ours["placements"] == go["placements"]
    assert compare(ours, go) == "yes"
    # First fit: the first claim goes to the first node that has a matching device.
    assert go["placements"][0].startswith("node-00000 ")
