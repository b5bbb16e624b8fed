"""``bench.search_lanes`` end to end on ten nodes with a short budget: each way of running the
hopeless search reports, the feasibility check refuses the issue's claim, and ordinary claims are
placed. Only the presence of the durations is checked."""

from __future__ import annotations

from tests.benchrun import NUMBER, find, number, run_bench


def test_every_lane_and_the_feasibility_check_report() -> None:
    out = run_bench("search_lanes", "--nodes", "10", "--budget", "0.2")
    find(r"^--- 10 nodes x 8 GPUs and a node of 48 partitions; search budget 0.2 s$", out)
    find(rf"^inline:  the loop waited up to {NUMBER} ms \({NUMBER} ticks in {NUMBER} s\)$", out)
    thread = find(
        rf"^thread:  the loop waited up to {NUMBER} ms \({NUMBER} ticks of 5 ms in {NUMBER} s\)$", out
    )
    # In a thread the loop keeps ticking while the search runs.
    assert number(thread[2]) >= 1
    find(
        rf"^process: the slices as JSON in {NUMBER} s \({NUMBER} MiB\), parsed and indexed there in {NUMBER}",
        out,
    )
    checked = find(r"^with the check: the issue's claim -> (\w+) in .*; (\d+) nodes searched\)$", out)
    assert checked[1] == "NotPlaced"
    assert int(checked[2]) <= 11
    unchecked = find(r"^without the check: the issue's claim -> (\w+) in .*; (\d+) nodes searched\)$", out)
    assert unchecked[1] in {"NotPlaced", "OutOfBudget"}
    find(
        rf"^a claim for 9 whole GPUs \(no node has 9\): refused with its explanation in p50 {NUMBER} ms CPU$",
        out,
    )
    for claim in ("one", "pair"):
        for way in ("with", "without"):
            find(rf"^  claim {claim}: placement p50 {NUMBER} us {way} the check$", out)
