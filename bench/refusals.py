"""Benchmark: what a claim that cannot fit costs the planner, on a full cluster.

The synthetic cluster of :mod:`bench.allocator_bench` (N nodes x 8 GPUs, H100 and A100 nodes
alternating), filled with claims of one mix; then ``--claims`` more claims of the same mix, none of
which fits, each planned as the operator plans it (:meth:`dra_operator.planner.Planner.plan`): a
search where the index allows one, then the explanation the claim's Event and condition carry.
Two queues, each on the same full cluster:

- ``alike``: every refused claim asks what the others ask (a backlog of one workload's claims, or a
  tenant's flood of copies), as happens when a full cluster's pending claims are tried again after
  a release;
- ``distinct``: each asks for a different product name (a selector no device matches), so no two
  explanations are alike.

Printed per N and mix: refusals, CPU per refusal (p50, p99, mean), the first refusal's CPU, and
how much the process's resident memory grew over the queue (what the cluster's caches keep of it).

    .venv/bin/python -m bench.refusals [--nodes 100,1000] [--claims 200] [--mixes 1gpu-product,...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.allocator_bench import (
    DRIVER,
    GPUS_PER_NODE,
    MIXES,
    capacity,
    claim,
    device_class,
    node_slice,
    rss_bytes,
)


def _distinct(mix: str, i: int) -> dict[str, Any]:
    obj = claim(mix, i)
    exactly = obj["spec"]["devices"]["requests"][0]["exactly"]
    exactly["selectors"] = [
        *exactly.get("selectors", []),
        {"cel": {"expression": f'device.attributes["{DRIVER}"].productName == "model-{i}"'}},
    ]
    obj["metadata"]["name"] = obj["metadata"]["uid"] = f"{mix}-distinct-{i}"
    return obj


def run(nodes: int, mix: str, refusals: int) -> dict[str, Any]:
    """Fill ``nodes`` with ``mix``, then plan ``refusals`` alike and ``refusals`` distinct claims."""
    from dra_api.model import DeviceClass, Node, ResourceClaim, ResourceSlice
    from dra_operator.allocator import SliceIndex
    from dra_operator.cel import compile_selector
    from dra_operator.planner import NotPlaced, Planned, Planner

    compile_selector("true")  # the CEL grammar, once, outside every figure
    slices = SliceIndex([ResourceSlice.from_json(node_slice(n)) for n in range(nodes)])
    planner = Planner(
        classes=[DeviceClass.from_json(device_class())],
        slices=slices,
        nodes=[Node.make(f"node-{n:05d}") for n in range(nodes)],
    )
    room = capacity(mix, nodes)
    for i in range(room):
        placed = planner.plan([ResourceClaim.from_json(claim(mix, i))])
        if not isinstance(placed, Planned):
            raise SystemExit(f"{mix}: claim {i} of {room} did not fit the empty cluster: {placed}")
        planner.note_allocated(placed.allocations[0])
    out: dict[str, Any] = {"nodes": nodes, "mix": mix}
    queues = {
        "alike": [claim(mix, room + i) for i in range(refusals)],
        "distinct": [_distinct(mix, i) for i in range(refusals)],
    }
    for queue, objs in queues.items():
        claims = [ResourceClaim.from_json(o) for o in objs]
        rss = rss_bytes()
        cpu: list[float] = []
        for c in claims:
            started = time.process_time()
            outcome = planner.plan([c])
            cpu.append(time.process_time() - started)
            if not isinstance(outcome, NotPlaced):
                raise SystemExit(f"{mix}: {c.ref} was expected not to fit: {outcome}")
        out[queue] = {
            "first_ms": 1000 * cpu[0],
            "mean_ms": 1000 * statistics.fmean(cpu),
            "p50_ms": 1000 * statistics.median(cpu),
            "p99_ms": 1000 * sorted(cpu)[min(len(cpu) - 1, int(0.99 * len(cpu)))],
            "rss_mib": (rss_bytes() - rss) / 2**20,
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="100,1000", help="comma-separated node counts")
    parser.add_argument("--claims", type=int, default=200, help="refused claims per queue")
    parser.add_argument("--mixes", default=",".join(MIXES), help="comma-separated mixes")
    args = parser.parse_args(argv)
    mixes = [m for m in args.mixes.split(",") if m]
    unknown = sorted(set(mixes) - set(MIXES))
    if unknown:
        parser.error(f"unknown mix {', '.join(unknown)}; known: {', '.join(MIXES)}")
    python = sys.version.split()[0]
    print(f"{GPUS_PER_NODE} GPUs per node, the cluster full; CPU ms per refused claim; python {python}")
    print(
        f"{'nodes':>6} {'mix':<14} {'queue':<8} {'claims':>6} {'first':>7} {'p50':>7} {'p99':>7} {'mean':>7} "
        f"{'RSS+ MiB':>8}"
    )
    for nodes in (int(n) for n in args.nodes.split(",") if n):
        for mix in mixes:
            found = run(nodes, mix, args.claims)
            for queue in ("alike", "distinct"):
                q = found[queue]
                print(
                    f"{nodes:>6} {mix:<14} {queue:<8} {args.claims:>6} {q['first_ms']:>7.3f} "
                    f"{q['p50_ms']:>7.3f} {q['p99_ms']:>7.3f} {q['mean_ms']:>7.3f} {q['rss_mib']:>8.1f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
