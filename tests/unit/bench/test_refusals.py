"""``bench.refusals`` run end to end on tiny full clusters: a row per node count, mix and queue, with
every refused claim planned. Durations are only checked to be there."""

from __future__ import annotations

import re
import subprocess
import sys

from bench.allocator_bench import MIXES
from tests.benchrun import REPO, run_bench

_ROW = re.compile(r"^\s*(\d+) (\S+)\s+(alike|distinct)\s+(\d+)((?:\s+\d+\.\d+){4})\s+(-?\d+\.\d)$")


def test_each_mix_and_queue_is_refused_and_measured() -> None:
    out = run_bench("refusals", "--nodes", "2,3", "--claims", "3")
    rows = [m for m in map(_ROW.match, out.splitlines()) if m]
    assert [(int(m[1]), m[2], m[3]) for m in rows] == [
        (n, mix, queue) for n in (2, 3) for mix in MIXES for queue in ("alike", "distinct")
    ]
    for m in rows:
        assert int(m[4]) == 3
        first, p50, p99, mean = map(float, m[5].split())
        assert min(first, p50, p99, mean) >= 0
        assert p50 <= p99


def test_an_unknown_mix_is_named() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.refusals", "--mixes", "1gpu-product,8gpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "unknown mix 8gpu" in proc.stderr
