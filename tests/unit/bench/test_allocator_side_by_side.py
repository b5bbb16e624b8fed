"""The side-by-side benchmark's inputs, agreement and output (no timing): the JSON the Python side
writes is what both allocators read; on a small cluster the upstream Go allocator (built here from
``bench/go_allocator``), in both of its modes, and our planner place every claim of every mix on the
same node and devices; the scheduler mode looks for as many feasible nodes as kube-scheduler does;
and ``main`` prints a line per side with figures that add up."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench.allocator_bench import GPUS_PER_NODE, MIXES, capacity
from bench.allocator_side_by_side import build_go, compare, main, parse, place, run_go, scenario

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
    for mix in MIXES:
        parsed = parse(json.loads(path.read_text()), mix)
        assert [n.name for n in parsed.nodes] == data["nodes"]
        assert sum(len(s.devices) for s in parsed.slices) == NODES * GPUS_PER_NODE
        assert [c.name for c in parsed.claims] == [c["metadata"]["name"] for c in data["mixes"][mix]]


@pytest.mark.parametrize("mix", MIXES)
def test_go_and_ours_place_the_same_claims(
    mix: str, go_binary: Path, cluster_file: tuple[Path, dict[str, Any]]
) -> None:
    path, data = cluster_file
    loop = run_go(go_binary, path, mix, mode="loop")
    scheduler = run_go(go_binary, path, mix, mode="scheduler")
    ours = place(parse(data, mix), mix)
    # 1.37's default gates select upstream's "incubating" implementation, as kube-scheduler's.
    assert loop["allocator"] == scheduler["allocator"] == "*incubating.Allocator"
    assert (loop["mode"], scheduler["mode"]) == ("loop", "scheduler")
    # The empty cluster holds exactly this many claims of the mix: all fit, on every side.
    assert loop["allocated"] == scheduler["allocated"] == ours["allocated"] == capacity(mix, NODES)
    assert ours["placements"] == loop["placements"]
    assert compare(ours, loop) == "yes, same nodes and devices"
    # Below 100 nodes kube-scheduler filters every node, so each search covers the cluster and
    # starts at the first node again: the first feasible node is first fit's node.
    assert scheduler["nodes_to_find"] == NODES
    assert scheduler["parallelism"] == 16
    assert scheduler["allocate_calls"] == NODES * scheduler["claims"]
    assert ours["placements"] == scheduler["placements"]
    # First fit: the first claim goes to the first node that has a matching device.
    assert loop["placements"][0].startswith("node-00000 ")
    # Ours built its index inside the timer: the setup is part of the total.
    assert 0 < ours["setup_s"] <= ours["total_s"]
    assert ours["claims_per_s"] == pytest.approx(ours["claims"] / ours["total_s"])


@pytest.mark.parametrize(("nodes", "to_find"), [(99, 99), (250, 120), (1000, 420)])
def test_the_scheduler_mode_looks_for_as_many_nodes_as_kube_scheduler(
    nodes: int, to_find: int, go_binary: Path, tmp_path: Path
) -> None:
    # numFeasibleNodesToFind with the adaptive percentage: all nodes below 100, else
    # max(5, 50 - nodes/125) % of them, at least 100.
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(scenario(nodes, 1)))
    figures = run_go(go_binary, path, "all-node", mode="scheduler")
    assert figures["nodes_to_find"] == to_find
    assert figures["allocated"] == 1
    assert figures["feasible_mean"] == to_find
    node = figures["placements"][0].split(" ", 1)[0]
    if to_find == nodes:
        # Every node is filtered: the first claim goes to the first node (all are empty and fit).
        assert node == "node-00000"
    else:
        # Filters run on 16 goroutines until enough nodes fit, as in kube-scheduler: which nodes
        # those are depends on the goroutines' timing (a loaded machine gave node-00015).
        assert re.fullmatch(r"node-\d{5}", node), node
        assert int(node[5:]) < nodes, node


_NUMBER = r"(\d+(?:\.\d+)?)"
_ROW = re.compile(
    rf"^\s*(\d+) (\S+)\s+(\d+) (ours|Go loop|Go scheduler)\s+\|\s+{_NUMBER}\s+{_NUMBER}\s+{_NUMBER} \|"
    rf"\s+(\S+) \|\s+{_NUMBER} x\s*{_NUMBER} \(hit\s+{_NUMBER}\) \|\s+(\S+) \|\s+(\S+) \| ?(.*)$"
)


def test_main_prints_each_side_of_each_mix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    mixes = ("2gpu-pcieroot", "all-node")
    assert main(["--nodes", "4", "--claims", "3", "--mixes", ",".join(mixes), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Parsed before the timer on both sides" in text
    rows = [m for m in (_ROW.match(line) for line in text.splitlines()) if m]
    assert [(m[2], m[4]) for m in rows] == [
        (mix, side) for mix in mixes for side in ("ours", "Go loop", "Go scheduler")
    ]
    for m in rows:
        nodes, claims, rate, p99, cpu_rate = int(m[1]), int(m[3]), float(m[5]), float(m[6]), float(m[7])
        calls = float(m[10])
        assert nodes == 4
        assert claims == min(3, capacity(m[2], 4))
        assert rate > 0
        assert p99 > 0
        assert cpu_rate > 0
        if m[4] == "ours":
            assert float(m[8]) > 0, "ours' setup is timed"
            assert calls == 1.0, "ours calls Allocate once per claim (its index offers only nodes that fit)"
        else:
            assert m[8] == "-"
            assert float(m[12]) > 0, "Go's PreFilter is timed"
            assert m[13].endswith("x")
            assert m[14] == "yes, same nodes and devices"
            assert 1 <= calls <= 4
    figures = json.loads(out.read_text())
    assert [entry["ours"]["mix"] for entry in figures] == list(mixes)
    assert all(set(entry) == {"nodes", "ours", "go_loop", "go_scheduler"} for entry in figures)
