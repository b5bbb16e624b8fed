"""``bench.allocator_bench`` run end to end on a tiny cluster (one subprocess per node count, as it
always runs): a row per mix whose figures add up. Durations are only checked to be there."""

from __future__ import annotations

import re

from bench.allocator_bench import MIXES, capacity
from tests.benchrun import run_bench

_ROW = re.compile(r"^\s*(\d+) (\S+)\s+(\d+)\s+(\d+)((?:\s+\d+(?:\.\d+)?){11})$")


def test_each_mix_is_placed_and_measured() -> None:
    out = run_bench("allocator_bench", "--nodes", "2,4", "--claims", "8")
    assert "failed" not in out
    rows = [m for m in map(_ROW.match, out.splitlines()) if m]
    assert [(int(m[1]), m[2]) for m in rows] == [(n, mix) for n in (2, 4) for mix in MIXES]
    for m in rows:
        nodes, mix, claims, failed = int(m[1]), m[2], int(m[3]), int(m[4])
        rate, p50, p99, top, cpu_rate, cpu_p50, cpu_p99, evals, peak, model, build = map(float, m[5].split())
        assert claims == min(8, capacity(mix, nodes))
        assert failed == 0, "every claim of a mix fits the empty cluster"
        assert rate > 0
        assert cpu_rate > 0
        assert 0 < p50 <= p99 <= top + 0.05  # max is printed with one decimal
        assert 0 <= cpu_p50 <= cpu_p99
        # Selector results are memoized per projection of a device: a handful at most.
        assert evals == int(evals)
        assert evals <= 4
        assert peak > 0
        assert model >= 0
        assert build >= 0
