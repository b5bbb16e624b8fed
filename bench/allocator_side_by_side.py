"""Benchmark: our placement beside the upstream Go allocator, on the same cluster and claims.

The cluster and the four claim mixes are those of :mod:`bench.allocator_bench` (N nodes with 8
GPUs each, H100/A100 alternating, DeviceClass ``gpu.nvidia.com``). They are written once per N as
JSON; ``bench/go_allocator`` (a small Go program on ``k8s.io/dynamic-resource-allocation`` at the
pinned Kubernetes version) reads that file, and ours parses the same objects. Then, per N and mix,
interleaved (ours, Go, ours, Go...):

- ours: the planner, first-fit, one claim at a time, each allocation noted before the next
  (:func:`bench.allocator_bench.place_claims`, the path ``allocator_bench`` measures);
- Go: per claim, what kube-scheduler's DynamicResources plugin does for a pod: PreFilter (a fresh
  copy of the allocated devices, ``structured.NewAllocator`` with the 1.37 default gates, which
  picks the "incubating" implementation), then Filter, ``Allocate(node, claim)`` node after node
  in name order, the first node with a result winning (one goroutine, no scoring).

Printed per N and mix: claims/s and p99 of each, the ratio ours / Go, the mean cost of one
per-node ``Allocate`` call of each with the calls per claim, and whether both placed the same
number of claims (and the same claims on the same nodes and devices).

    .venv/bin/python -m bench.allocator_side_by_side [--nodes 100,1000,5000] [--claims N]
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import gobuild
from bench.allocator_bench import MIXES, capacity, claim, device_class, node_slice, place_claims

# Claims per mix (at most the cluster's room). The Go emulation tries nodes in order, so its cost
# per claim grows with the nodes earlier claims filled: 1000 keeps 100,1000,5000 at about 3 min.
DEFAULT_CLAIMS = 1000


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


def run_go(binary: Path, input_path: Path, mix: str) -> dict[str, Any]:
    """One mix through the Go program (a fresh process); its JSON figures and placements."""
    proc = subprocess.run(
        [str(binary), "-input", str(input_path), "-mix", mix, "-placements"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"go_allocator {mix}: {proc.stderr.strip()}")
    figures: dict[str, Any] = json.loads(proc.stdout)
    return figures


class Ours:
    """Our cluster model for one scenario, parsed from the same JSON objects the Go side reads."""

    def __init__(self, data: dict[str, Any]) -> None:
        from dra_api.model import DeviceClass, Node, ResourceClaim, ResourceSlice
        from dra_operator.allocator import SliceIndex
        from dra_operator.cel import compile_selector

        compile_selector("true")  # load the CEL grammar once, outside every figure
        self.classes = [DeviceClass.from_json(c) for c in data["deviceClasses"]]
        self.index = SliceIndex([ResourceSlice.from_json(s) for s in data["resourceSlices"]])
        self.nodes = [Node.make(name) for name in data["nodes"]]
        self.claims = {mix: [ResourceClaim.from_json(c) for c in cs] for mix, cs in data["mixes"].items()}
        gc.collect()
        gc.freeze()  # the cluster model is long-lived: keep the collector off it

    def run(self, mix: str) -> dict[str, Any]:
        """Place one mix from an empty cluster through a fresh planner; figures and placements."""
        from dra_operator.planner import Planner

        planner = Planner(classes=self.classes, slices=self.index, nodes=self.nodes, policy="first-fit")
        timed = _TimedCalls(planner.allocator.allocate)
        planner.allocator.allocate = timed  # type: ignore[method-assign]
        claims = self.claims[mix]
        placed = place_claims(planner, claims)
        n = len(claims)
        return {
            "mix": mix,
            "claims": n,
            "allocated": n - placed.failed,
            "failed": placed.failed,
            "total_s": placed.total_s,
            "cpu_s": placed.cpu_s,
            "claims_per_s": n / placed.total_s if placed.total_s else 0.0,
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
    """``yes`` when both placed every claim on the same node and devices; otherwise what differs."""
    if ours["allocated"] != go["allocated"]:
        return f"NO: {ours['allocated']} vs {go['allocated']} allocated"
    differ = sum(a != b for a, b in zip(ours["placements"], go["placements"], strict=True))
    return "yes" if differ == 0 else f"count yes, {differ} placements differ"


HEADER = (
    f"{'nodes':>5} {'mix':<14} {'claims':>6} | {'ours/s':>6} {'p99 ms':>6} {'cpu/s':>6} | "
    f"{'Go/s':>6} {'p99 ms':>6} {'cpu/s':>6} | {'ours/Go':>7} | {'ours Allocate us':>22} | "
    f"{'Go Allocate us':>22} {'NewAlloc':>8} {'Go best/s':>9} | same"
)


def row(nodes: int, ours: dict[str, Any], go: dict[str, Any]) -> str:
    def allocate(f: dict[str, Any]) -> str:
        # mean of all calls x calls per claim (mean of the calls that found room)
        calls = f["allocate_calls"] / f["claims"] if f["claims"] else 0.0
        return f"{f['allocate_mean_us']:>5.0f} x{calls:>5.1f} (hit {f['allocate_hit_mean_us']:>4.0f})"

    def cpu_rate(f: dict[str, Any]) -> float:
        return float(f["claims"] / f["cpu_s"]) if f["cpu_s"] else 0.0

    ratio = ours["claims_per_s"] / go["claims_per_s"] if go["claims_per_s"] else float("inf")
    return (
        f"{nodes:>5} {ours['mix']:<14} {ours['claims']:>6} | {ours['claims_per_s']:>6.0f} "
        f"{ours['p99_ms']:>6.2f} {cpu_rate(ours):>6.0f} | {go['claims_per_s']:>6.0f} {go['p99_ms']:>6.2f} "
        f"{cpu_rate(go):>6.0f} | {ratio:>6.1f}x | {allocate(ours)} | {allocate(go)} "
        f"{go['new_allocator_mean_us']:>5.0f} us {go_best(go):>9.0f} | {compare(ours, go)}"
    )


def go_best(go: dict[str, Any]) -> float:
    """Go's claims/s had it known the node: one PreFilter and the one Allocate call that fits."""
    per_claim_us = go["new_allocator_mean_us"] + go["allocate_hit_mean_us"]
    return 1e6 / per_claim_us if per_claim_us else 0.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="100,1000,5000", help="comma-separated node counts")
    parser.add_argument(
        "--claims", type=int, default=DEFAULT_CLAIMS, help="claims per mix (at most the cluster's room)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="interleaved pairs per N and mix")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.nodes.split(",") if n.strip()]

    binary, build_s = build_go()
    built = f"{build_s:.1f} s" if build_s else "reused"
    print(f"go build of bench/go_allocator: {built} -> {binary}")
    print(
        "cpu/s: claims per CPU second of that process (Go's garbage collector may use the second "
        "core). Allocate: mean time of one per-node call x calls per claim (hit: mean of the calls "
        "that found room). NewAlloc: Go's PreFilter per claim. Go best/s: had Go known the node "
        f"(PreFilter + the one fitting Allocate). python {sys.version.split()[0]}"
    )
    print(HEADER)
    everything: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="allocator-side-by-side-") as tmp:
        for nodes in sizes:
            data = scenario(nodes, args.claims)
            path = Path(tmp) / f"cluster-{nodes}.json"
            path.write_text(json.dumps(data))
            ours_model = Ours(data)
            del data
            for mix in MIXES:
                for _ in range(args.rounds):
                    ours = ours_model.run(mix)
                    go = run_go(binary, path, mix)
                    print(row(nodes, ours, go), flush=True)
                    everything.append({"nodes": nodes, "ours": ours, "go": go})
            del ours_model
            gc.unfreeze()
            gc.collect()
            path.unlink()
    if args.json:
        for entry in everything:
            entry["ours"].pop("placements")
            entry["go"].pop("placements")
        args.json.write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
