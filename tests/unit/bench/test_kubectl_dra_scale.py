"""``bench.kubectl_dra_scale`` end to end on three nodes: the lists are built, both commands run
through the pipeline and, against the in-process fake API server, through ``kubectl dra`` itself
with the same output, and the start-up is measured."""

from __future__ import annotations

import re
from pathlib import Path

from tests.benchrun import NUMBER, find, number, run_bench

NODES = 3


def test_both_commands_at_a_tiny_scale(tmp_path: Path) -> None:
    saved = tmp_path / "out"
    out = run_bench(
        "kubectl_dra_scale", "--nodes", str(NODES), "--cache", str(tmp_path / "cache"), "--save", str(saved)
    )
    built = find(rf"^N={NODES}: (\d+) slices, (\d+) claims, (\d+) pods; ", out)
    # Four claims per node hold half its GPUs, one per hundred nodes waits; a quarter of them
    # belongs to a pod.
    assert (int(built[1]), int(built[2]), int(built[3])) == (NODES, 4 * NODES + 1, NODES)
    for command, label in (("devices", "devices   "), ("claims", "claims -A ")):
        line = find(
            rf"^  {re.escape(label)} decode {NUMBER}  parse {NUMBER}  rows {NUMBER}  render {NUMBER}  "
            rf"= {NUMBER} s; "
            rf"e2e {NUMBER} s \((same output|OUTPUT DIFFERS)\)  \[(\d+) lines\]$",
            out,
        )
        assert line[7] == "same output", f"kubectl dra {command} printed something else end to end"
        lines = int(line[8])
        text = (saved / f"{command}-{NODES}.txt").read_text()
        assert len(text.splitlines()) == lines
        assert lines > NODES, f"a row per device or claim and a header: {text}"
    startup = find(rf"^start-up: --help {NUMBER} s wall, imports {NUMBER} s; heaviest:$", out)
    assert number(startup[1]) > 0
    assert re.search(r"^\s+\d+\.\d{3} s  dra_operator", out, re.MULTILINE), "the heaviest imports are listed"
