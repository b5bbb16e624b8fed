"""``bench.mps_daemon_start`` end to end (root, as the MPS tests of the agent: tmpfs and cgroups):
both ways of starting a claim's daemon are measured over the rounds asked for, and the run leaves
no cgroup, mount or daemon behind."""

from __future__ import annotations

from pathlib import Path

from dra_node_agent.nvidia.cgroups import Hierarchy
from tests.benchrun import NUMBER, find, run_bench


def _bench_cgroups() -> set[str]:
    hierarchy = Hierarchy.detect(Path("/sys/fs/cgroup"))
    assert hierarchy is not None, "the daemons' memory cgroups need a cgroup hierarchy"
    return {p.name for p in hierarchy.root.glob("accel-dra-bench-*")}


def _bench_mounts() -> list[str]:
    return [line for line in Path("/proc/self/mounts").read_text().splitlines() if "/mpsb-" in line]


def test_start_and_stop_in_both_cgroups_and_nothing_left() -> None:
    before = _bench_cgroups()
    out = run_bench("mps_daemon_start", "--rounds", "2")
    find(r"^one MPS claim's daemon \(simulated stand-in\), start and stop, 2 rounds each$", out)
    for step in ("start", "stop"):
        for where in ("in a cgroup of its own", "in the agent's cgroup"):
            find(rf"^{step}, {where}\s+p50\s+{NUMBER} ms   mean\s+{NUMBER} ms   n=2$", out)
    assert _bench_cgroups() == before
    assert _bench_mounts() == []
