"""``bench.model_memory`` end to end on three nodes, fed directly and as the operator re-lists
(``--feed kopf`` is left out to keep the run short): the slices reach the model, the probe claim is
placed (off the loop when its slice of the loop is not enough, as the operator does), the claims
are added, and each phase reports its memory. The amounts are only checked to be there."""

from __future__ import annotations

from tests.benchrun import NUMBER, find, run_bench

NODES = 3
DEVICES = NODES * 8


def _phases(out: str, claims: int) -> None:
    find(rf"^{NODES} nodes, {NODES} slices discovered \({NUMBER} s\)$", out)
    find(rf"^placer built, probe placed \({NUMBER} s\)$", out)
    find(rf"^placer index: RSS \+{NUMBER} MiB \({NUMBER} B/device\)", out)
    if claims:
        find(rf"^{claims} claims allocated \({NUMBER} s\)$", out)
        find(rf"^allocated claims: RSS \+{NUMBER} MiB \({NUMBER} B/claim\)", out)


def test_fed_directly_with_the_walk_by_type() -> None:
    out = run_bench("model_memory", "--nodes", str(NODES), "--claims", "6", "--top", "3")
    _phases(out, 6)
    find(rf"^{NODES} slices, {DEVICES} devices in the model$", out)
    find(rf"^slices in the model: RSS \+{NUMBER} MiB", out)
    for part, unit in (("held by the model, by type", "device"), ("held by the model for claims", "claim")):
        section = out.split(part, 1)[1]
        find(rf"^    total {NUMBER} MiB \({NUMBER} B/{unit}\)$", section)
        find(
            rf"^\s+{NUMBER} KiB\s+{NUMBER} objects \(\s*{NUMBER} B/{unit},\s+{NUMBER}/{unit}\)  \w+", section
        )
    assert "held by the placer beyond the model:" in out


def test_fed_as_the_operator_relists_with_tracemalloc() -> None:
    out = run_bench(
        "model_memory",
        "--nodes",
        str(NODES),
        "--claims",
        "2",
        "--feed",
        "relist",
        "--chunk",
        "2",
        "--no-walk",
        "--trace",
    )
    _phases(out, 2)
    find(rf"^{NODES} slices, {DEVICES} devices in the model$", out)
    for when in ("into the empty model", "again, the model full"):
        find(
            rf"^re-list {when}: {NODES} slices, {NODES} nodes; peak RSS \+{NUMBER} MiB, RSS after \+{NUMBER}",
            out,
        )
    # With --trace each phase names its top allocation sites.
    find(rf"^placer index: RSS .*; traced \+{NUMBER} MiB", out)
    find(r"^\s+\d+ KiB\s+\+\d+ blocks  \S+:\d+$", out)
