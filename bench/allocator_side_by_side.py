"""Benchmark: our placement beside the upstream Go allocator, on the same cluster and claims.

The cluster and the four claim mixes are those of :mod:`bench.allocator_bench` (N nodes with 8
GPUs each, H100/A100 alternating, DeviceClass ``gpu.nvidia.com``). They are written once per N as
JSON; ``bench/go_allocator`` (a small Go program on ``k8s.io/dynamic-resource-allocation`` at the
pinned Kubernetes version) reads that file, and ours parses the same objects. Then, per N and mix,
interleaved (ours, Go loop, Go scheduler, ours, ...), each run in a fresh process:

- ours: the planner, first-fit, one claim at a time, each allocation noted before the next
  (:func:`bench.allocator_bench.place_claims`, the path ``allocator_bench`` measures);
- Go, ``-mode loop``: per claim, what kube-scheduler's DynamicResources plugin does for a pod:
  PreFilter (a fresh copy of the allocated devices, ``structured.NewAllocator`` with the 1.37
  default gates, which picks the "incubating" implementation), then ``Allocate(node, claim)`` node
  after node in name order, the first node with a result winning (first fit, one goroutine);
- Go, ``-mode scheduler``: the same plugin calls driven as kube-scheduler's scheduling cycle drives
  them: PreFilter once per pod, then Filter on 16 goroutines (its default ``parallelism``) from
  where the previous pod's search stopped, until ``numFeasibleNodesToFind`` nodes passed (all
  nodes below 100; at N nodes max(5, 50 - N/125) % of them, at least 100: 100 at 100 nodes, 420 at
  1000, 500 at 5000); the first feasible node in search order is taken (kube-scheduler would score
  them, and here all score alike) and its allocation assumed before the next pod.

What is timed, alike on both sides: the cluster and the claims are parsed before the timer (Go's
``json.Unmarshal`` into the API types; ours ``json.loads`` and ``from_json`` into the model) and
the CEL environment is loaded (Go's by ``cel.NewCache``; ours by compiling ``true``); nothing else
is kept from before. Inside the timer: ours builds its slice index and planner (the operator keeps
them across claims; here they are built once per run) and places the claims; Go runs PreFilter
(which builds its allocator from the slices) and Filter per claim. No ``gc.freeze()``: the
operator does not use it. Each run is a fresh process, so neither side's caches (compiled CEL,
memoized selector results, gathered pools) carry from one mix to the next.

Printed per N and mix, one line per side: claims/s (over the whole timed work, setup included),
p99 per claim, claims per CPU second of the process (Go's scheduler mode and garbage collector use
more than one core), ours' setup (index and planner build), the mean cost of one per-node
``Allocate`` call with the calls per claim, Go's PreFilter per claim, the ratio ours / that side,
and agreement: with the loop, the same node and devices for every claim; with the scheduler mode
(which chooses nodes in another order), the same number of claims placed.

    .venv/bin/python -m bench.allocator_side_by_side [--nodes 100,1000,5000] [--claims N] [--mixes M,...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import gobuild
from bench.allocator_bench import MIXES, capacity, claim, device_class, node_slice, place_claims

# Claims per mix (at most the cluster's room). The Go loop tries nodes in order, so its cost per
# claim grows with the nodes earlier claims filled.
DEFAULT_CLAIMS = 1000
GO_MODES = ("loop", "scheduler")
REPO = Path(__file__).resolve().parent.parent


def scenario(nodes: int, claims_per_mix: int) -> dict[str, Any]:
    """The cluster of N nodes and, per mix, the claims to place, as Kubernetes JSON: what both
    sides read."""
    slices = [node_slice(n) for n in range(nodes)]
    return {
        "nodes": [s["spec"]["nodeName"] for s in slices],
        "deviceClasses": [device_class()],
        "resourceSlices": slices,
        "mixes": {
            mix: [claim(mix, i) for i in range(min(claims_per_mix, capacity(mix, nodes)))] for mix in MIXES
        },
    }


def build_go(*, into: Path | None = None) -> tuple[Path, float]:
    """Build ``bench/go_allocator`` (see :func:`bench.gobuild.build`)."""
    return gobuild.build("go_allocator", into=into)


def run_go(binary: Path, input_path: Path, mix: str, *, mode: str = "loop") -> dict[str, Any]:
    """One mix through the Go program in ``mode`` (a fresh process); its figures and placements."""
    proc = subprocess.run(
        [str(binary), "-input", str(input_path), "-mix", mix, "-mode", mode, "-placements"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"go_allocator {mode} {mix}: {proc.stderr.strip()}")
    figures: dict[str, Any] = json.loads(proc.stdout)
    return figures


def run_ours(input_path: Path, mix: str) -> dict[str, Any]:
    """One mix through ours in a fresh process (``--ours``), as the Go side runs."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.allocator_side_by_side", "--ours", str(input_path), "--mix", mix],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ours {mix}: {proc.stderr.strip()[-2000:]}")
    figures: dict[str, Any] = json.loads(proc.stdout)
    return figures


@dataclass(frozen=True)
class Parsed:
    """One mix's inputs as our model holds them, parsed before any timer (as Go's are)."""

    classes: list[Any]
    slices: list[Any]
    nodes: list[Any]
    claims: list[Any]
    parse_s: float


def parse(data: dict[str, Any], mix: str) -> Parsed:
    """The cluster and the mix's claims, from the JSON objects both sides read; the CEL grammar is
    loaded here too (Go's CEL environment is built before its timer, by ``cel.NewCache``)."""
    from dra_api.model import DeviceClass, Node, ResourceClaim, ResourceSlice
    from dra_operator.cel import compile_selector

    started = time.perf_counter()
    compile_selector("true")
    parsed = Parsed(
        classes=[DeviceClass.from_json(c) for c in data["deviceClasses"]],
        slices=[ResourceSlice.from_json(s) for s in data["resourceSlices"]],
        nodes=[Node.make(name) for name in data["nodes"]],
        claims=[ResourceClaim.from_json(c) for c in data["mixes"][mix]],
        parse_s=0.0,
    )
    return Parsed(**{**parsed.__dict__, "parse_s": time.perf_counter() - started})


def place(parsed: Parsed, mix: str) -> dict[str, Any]:
    """Build the slice index and the planner, then place the mix from an empty cluster: all of it
    timed. Figures and placements."""
    from dra_operator.allocator import SliceIndex
    from dra_operator.planner import Planner

    started, cpu_started = time.perf_counter(), time.process_time()
    planner = Planner(
        classes=parsed.classes, slices=SliceIndex(parsed.slices), nodes=parsed.nodes, policy="first-fit"
    )
    setup_s, setup_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    timed = _TimedCalls(planner.allocator.allocate)
    planner.allocator.allocate = timed  # type: ignore[method-assign]
    placed = place_claims(planner, parsed.claims)
    n = len(parsed.claims)
    total_s = setup_s + placed.total_s
    return {
        "mix": mix,
        "mode": "ours",
        "claims": n,
        "allocated": n - placed.failed,
        "failed": placed.failed,
        "parse_s": parsed.parse_s,
        "setup_s": setup_s,
        "total_s": total_s,
        "cpu_s": setup_cpu_s + placed.cpu_s,
        "claims_per_s": n / total_s if total_s else 0.0,
        "p50_ms": 1000 * _percentile(placed.latencies, 0.5),
        "p99_ms": 1000 * _percentile(placed.latencies, 0.99),
        **timed.figures(),
        "placements": placed.placements,
    }


class _TimedCalls:
    """Wraps a callable, counting calls and the wall-clock seconds spent in them, apart for the
    calls that returned something (hits) and the others (misses: None or an exception)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.calls = self.hits = 0
        self.seconds = self.hit_seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = None
        started = time.perf_counter()
        try:
            result = self.fn(*args, **kwargs)
            return result
        finally:
            took = time.perf_counter() - started
            self.seconds += took
            self.calls += 1
            if result is not None:
                self.hits += 1
                self.hit_seconds += took

    def figures(self) -> dict[str, float | int]:
        misses = self.calls - self.hits
        return {
            "allocate_calls": self.calls,
            "allocate_hits": self.hits,
            "allocate_mean_us": 1e6 * self.seconds / self.calls if self.calls else 0.0,
            "allocate_hit_mean_us": 1e6 * self.hit_seconds / self.hits if self.hits else 0.0,
            "allocate_miss_mean_us": 1e6 * (self.seconds - self.hit_seconds) / misses if misses else 0.0,
        }


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    # The same rank as allocator_bench and the Go program: values[min(n-1, int(q*n))].
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def compare(ours: dict[str, Any], go: dict[str, Any]) -> str:
    """Agreement with one Go run: both placed the same number of claims and, for the loop (which
    chooses nodes as ours does), every claim on the same node and devices. The scheduler mode
    searches from where the previous pod's search stopped, so its nodes may differ by design."""
    if ours["allocated"] != go["allocated"]:
        return f"NO: {ours['allocated']} vs {go['allocated']} placed"
    differ = sum(a != b for a, b in zip(ours["placements"], go["placements"], strict=True))
    if differ == 0:
        return "yes, same nodes and devices"
    if go.get("mode") == "scheduler":
        return f"yes, {go['allocated']} placed ({differ} on other nodes or devices)"
    return f"count yes, {differ} placements differ"


HEADER = (
    f"{'nodes':>5} {'mix':<14} {'claims':>6} {'side':<12} | {'claims/s':>8} {'p99 ms':>7} {'cpu/s':>7} | "
    f"{'setup ms':>8} | {'Allocate us x calls/claim':>30} | {'PreFilter us':>12} | {'ours/side':>9} | "
    "agreement"
)


def row(nodes: int, figures: dict[str, Any], ours: dict[str, Any]) -> str:
    """One line of the table: one side's run of one N and mix, against ours."""
    f = figures
    calls = f["allocate_calls"] / f["claims"] if f["claims"] else 0.0
    allocate = f"{f['allocate_mean_us']:>6.0f} x{calls:>6.1f} (hit {f['allocate_hit_mean_us']:>5.0f})"
    cpu_rate = f["claims"] / f["cpu_s"] if f["cpu_s"] else 0.0
    if f is ours:
        side, setup, prefilter, ratio, agreement = "ours", f"{1000 * f['setup_s']:>8.1f}", "-", "-", ""
    else:
        side = f"Go {f['mode']}"
        setup, prefilter = "-", f"{f['new_allocator_mean_us']:.0f}"
        ratio = f"{ours['claims_per_s'] / f['claims_per_s']:.1f}x" if f["claims_per_s"] else "inf"
        agreement = compare(ours, f)
    return (
        f"{nodes:>5} {f['mix']:<14} {f['claims']:>6} {side:<12} | {f['claims_per_s']:>8.0f} "
        f"{f['p99_ms']:>7.2f} {cpu_rate:>7.0f} | {setup:>8} | {allocate:>30} | {prefilter:>12} | "
        f"{ratio:>9} | {agreement}"
    )


def _ours_one(path: Path, mix: str) -> int:
    """``--ours``: one mix through ours in this process; its figures as JSON on stdout."""
    parsed = parse(json.loads(path.read_text()), mix)
    print(json.dumps(place(parsed, mix)))
    return 0


def _legend(binary: Path, build_s: float) -> None:
    built = f"{build_s:.1f} s" if build_s else "reused"
    print(f"go build of bench/go_allocator: {built} -> {binary}")
    print(
        "Parsed before the timer on both sides (the cluster and the claims; the CEL environment "
        "loaded); timed: ours' index and planner build (setup) and placement, Go's PreFilter and "
        "Filter per claim. Fresh process per run, no gc.freeze(). claims/s: over the timed work. "
        "cpu/s: claims per CPU second of that process (Go's scheduler mode and garbage collector "
        "use more than one core). Allocate: mean time of one per-node call x calls per claim (hit: "
        "mean of the calls that found room; in Go's scheduler mode, wall time on goroutines that share "
        "the cores). Go scheduler: Filter on 16 goroutines until numFeasibleNodesToFind nodes pass, "
        "the first feasible one in search order taken. "
        f"python {sys.version.split()[0]}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="100,1000,5000", help="comma-separated node counts")
    parser.add_argument(
        "--claims", type=int, default=DEFAULT_CLAIMS, help="claims per mix (at most the cluster's room)"
    )
    parser.add_argument("--mixes", default=",".join(MIXES), help="comma-separated claim mixes")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved runs per N, mix and side")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--ours", type=Path, help=argparse.SUPPRESS)  # internal: one run of ours
    parser.add_argument("--mix", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ours is not None:
        return _ours_one(args.ours, args.mix)
    sizes = [int(n) for n in args.nodes.split(",") if n.strip()]
    mixes = [m.strip() for m in args.mixes.split(",") if m.strip()]
    if unknown := set(mixes) - set(MIXES):
        parser.error(f"unknown mixes: {', '.join(sorted(unknown))} (known: {', '.join(MIXES)})")

    binary, build_s = build_go()
    _legend(binary, build_s)
    print(HEADER)
    everything: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="allocator-side-by-side-") as tmp:
        for nodes in sizes:
            path = Path(tmp) / f"cluster-{nodes}.json"
            path.write_text(json.dumps(scenario(nodes, args.claims)))
            for mix in mixes:
                for _ in range(args.rounds):
                    ours = run_ours(path, mix)
                    print(row(nodes, ours, ours), flush=True)
                    entry: dict[str, Any] = {"nodes": nodes, "ours": ours}
                    for mode in GO_MODES:
                        go = run_go(binary, path, mix, mode=mode)
                        print(row(nodes, go, ours), flush=True)
                        entry[f"go_{mode}"] = go
                    everything.append(entry)
            path.unlink()
    if args.json:
        for entry in everything:
            for side in entry.values():
                if isinstance(side, dict):
                    side.pop("placements")
        args.json.write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
