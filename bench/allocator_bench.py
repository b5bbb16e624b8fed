"""Benchmark: cluster-wide placement through the planner on a synthetic GPU cluster.

N nodes with 8 GPUs each (H100 80GB and A100 40GB nodes alternating), attributes as NVIDIA's DRA
driver publishes them, the DeviceClass ``gpu.nvidia.com``, and four claim mixes, each allocated one
claim at a time through :class:`dra_operator.planner.Planner` (the operator's path: choose a node,
allocate, note the allocation):

- ``1gpu-product``: one GPU by product name;
- ``2gpu-pcieroot``: two GPUs behind one PCIe root (``matchAttribute``);
- ``4gpu-mem40``: four GPUs with ``memory >= 40Gi`` (a capacity selector);
- ``all-node``: every GPU of a node (``allocationMode: All``).

Each N runs in a fresh subprocess (memory figures do not accumulate). Printed per N and mix:
claims/s, p50/p99/max wall-clock latency per claim, the same in CPU time of the process (what one
core does, free of the waits a shared machine adds), CEL evaluations (``evaluation_count()``: the
CEL layer memoizes per projection of a device, so identical devices cost one evaluation), peak RSS
of that process, and the RSS of the cluster model (parsed slices + slice index + planner) measured
right after building it. The first claim of a mix also builds its index entry (lazily, per node).

    .venv/bin/python -m bench.allocator_bench [--nodes 10,100,1000,5000] [--claims 2000]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DRIVER = "gpu.nvidia.com"
V1 = "resource.k8s.io/v1"
GPUS_PER_NODE = 8
MODELS = (
    # productName, architecture, compute capability, memory
    ("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi"),
    ("NVIDIA A100-SXM4-40GB", "Ampere", "8.0.0", "40Gi"),
)
MIXES = ("1gpu-product", "2gpu-pcieroot", "4gpu-mem40", "all-node")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def node_slice(n: int) -> dict[str, Any]:
    node = f"node-{n:05d}"
    product, arch, cc, memory = MODELS[n % 2]
    devices = []
    for i in range(GPUS_PER_NODE):
        uid = hashlib.sha1(f"{node}/{i}".encode()).hexdigest()
        bus = 0x18 + 0x10 * i
        devices.append(
            {
                "name": f"gpu-{i}",
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": f"GPU-{uid[:8]}-{uid[8:12]}-{uid[12:16]}-{uid[16:20]}-{uid[20:32]}"},
                    "productName": {"string": product},
                    "brand": {"string": "Nvidia"},
                    "architecture": {"string": arch},
                    "cudaComputeCapability": {"version": cc},
                    "driverVersion": {"version": "580.65.6"},
                    "cudaDriverVersion": {"version": "13.0.0"},
                    "resource.kubernetes.io/pciBusID": {"string": f"0000:{bus:02x}:00.0"},
                    # two GPUs per PCIe root complex
                    "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{(i // 2) * 0x40:02x}"},
                },
                "capacity": {"memory": {"value": memory}},
            }
        )
    return {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-0"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_class() -> dict[str, Any]:
    return {
        "apiVersion": V1,
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def claim(mix: str, i: int) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    constraints: list[dict[str, Any]] = []
    if mix == "1gpu-product":
        exactly["selectors"] = [
            {"cel": {"expression": f'device.attributes["{DRIVER}"].productName == "{MODELS[0][0]}"'}}
        ]
    elif mix == "2gpu-pcieroot":
        exactly["count"] = 2
        constraints = [{"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    elif mix == "4gpu-mem40":
        exactly["count"] = 4
        exactly["selectors"] = [
            {"cel": {"expression": f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'}}
        ]
    else:
        exactly["allocationMode"] = "All"
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    return {
        "apiVersion": V1,
        "kind": "ResourceClaim",
        "metadata": {"name": f"{mix}-{i}", "namespace": "bench", "uid": f"{mix}-{i}"},
        "spec": spec,
    }


def capacity(mix: str, nodes: int) -> int:
    """How many claims of the mix the empty cluster holds."""
    h100_nodes = (nodes + 1) // 2
    return {
        "1gpu-product": h100_nodes * GPUS_PER_NODE,
        "2gpu-pcieroot": nodes * GPUS_PER_NODE // 2,
        "4gpu-mem40": nodes * GPUS_PER_NODE // 4,
        "all-node": nodes,
    }[mix]


@dataclass(frozen=True)
class Placement:
    """What placing one mix took: sorted per-claim wall and CPU seconds, totals, and where each
    claim went (``"node pool/device,..."``, ``"-"`` when it did not fit)."""

    latencies: list[float]
    cpu: list[float]
    failed: int
    total_s: float
    cpu_s: float
    placements: list[str]


def place_claims(planner: Any, claims: list[Any]) -> Placement:
    """Place ``claims`` one at a time through ``planner`` (a :class:`dra_operator.planner.Planner`),
    noting each allocation before the next, as the operator does."""
    from dra_operator.planner import Planned

    latencies: list[float] = []
    cpu: list[float] = []
    outcomes: list[Any] = []
    failed = 0
    t0 = time.perf_counter()
    c0 = time.process_time()
    for c in claims:
        s = time.perf_counter()
        sc = time.process_time()
        outcome = planner.plan([c])
        if isinstance(outcome, Planned):
            planner.note_allocated(outcome.allocations[0])
        else:
            failed += 1
        latencies.append(time.perf_counter() - s)
        cpu.append(time.process_time() - sc)
        outcomes.append(outcome)
    total = time.perf_counter() - t0
    total_cpu = time.process_time() - c0
    latencies.sort()
    cpu.sort()
    return Placement(latencies, cpu, failed, total, total_cpu, [_where(o) for o in outcomes])


def _where(outcome: Any) -> str:
    from dra_operator.planner import Planned

    if not isinstance(outcome, Planned):
        return "-"
    devices = ",".join(f"{d.pool}/{d.device}" for d in outcome.allocations[0].devices)
    return f"{outcome.node} {devices}"


def run_one(nodes: int, claims_per_mix: int, policy: str) -> dict[str, Any]:
    """Everything for one N, in this (fresh) process."""
    from dra_api.model import DeviceClass, Node, ResourceClaim, ResourceSlice
    from dra_operator.allocator import SliceIndex
    from dra_operator.cel import compile_selector, evaluation_count
    from dra_operator.planner import Planner

    compile_selector("true")  # load the CEL grammar once, outside every figure
    gc.collect()
    base = rss_bytes()
    started = time.perf_counter()
    slices = [ResourceSlice.from_json(node_slice(n)) for n in range(nodes)]
    classes = [DeviceClass.from_json(device_class())]
    node_objs = [Node.make(f"node-{n:05d}") for n in range(nodes)]
    index = SliceIndex(slices)
    planner = Planner(classes=classes, slices=index, nodes=node_objs, policy=policy)
    build_s = time.perf_counter() - started
    gc.collect()
    model_bytes = rss_bytes() - base
    gc.freeze()  # the cluster model is long-lived: keep the collector off it
    out: dict[str, Any] = {"nodes": nodes, "model_mib": model_bytes / 2**20, "build_s": build_s, "mixes": []}
    for mix in MIXES:
        count = min(claims_per_mix, capacity(mix, nodes))
        claims = [ResourceClaim.from_json(claim(mix, i)) for i in range(count)]
        planner = Planner(classes=classes, slices=index, nodes=node_objs, policy=policy)
        cel_before = evaluation_count()
        placed = place_claims(planner, claims)
        latencies, cpu, failed = placed.latencies, placed.cpu, placed.failed
        total, total_cpu = placed.total_s, placed.cpu_s
        out["mixes"].append(
            {
                "mix": mix,
                "claims": count,
                "failed": failed,
                "claims_per_s": count / total if total else 0.0,
                "p50_ms": 1000 * statistics.median(latencies),
                "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
                "max_ms": 1000 * latencies[-1],
                # CPU time of this process: what one core does, without the waits of a shared machine
                "cpu_claims_per_s": count / total_cpu if total_cpu else 0.0,
                "cpu_p50_ms": 1000 * statistics.median(cpu),
                "cpu_p99_ms": 1000 * cpu[min(len(cpu) - 1, int(0.99 * len(cpu)))],
                "cel_evals": evaluation_count() - cel_before,
            }
        )
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="10,100,1000,5000", help="comma-separated node counts")
    parser.add_argument(
        "--claims", type=int, default=2000, help="claims per mix (at most the cluster's room)"
    )
    parser.add_argument("--policy", default="first-fit", choices=("first-fit", "bin-pack", "spread"))
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: run one N, print JSON
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(run_one(args.one, args.claims, args.policy)))
        return 0
    print(
        f"policy {args.policy}; {GPUS_PER_NODE} GPUs per node; one process per N; "
        f"python {sys.version.split()[0]}"
    )
    header = (
        f"{'nodes':>6} {'mix':<14} {'claims':>6} {'fail':>4} {'claims/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'max ms':>7} {'cpu/s':>6} {'cpu p50':>7} {'cpu p99':>7} {'CEL evals':>9} {'peak RSS MiB':>12} "
        f"{'model MiB':>9} {'build s':>7}"
    )
    print(header)
    for nodes in (int(n) for n in args.nodes.split(",") if n.strip()):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                str(nodes),
                "--claims",
                str(args.claims),
                "--policy",
                args.policy,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            print(f"{nodes:>6} failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        for m in r["mixes"]:
            print(
                f"{nodes:>6} {m['mix']:<14} {m['claims']:>6} {m['failed']:>4} {m['claims_per_s']:>9.0f} "
                f"{m['p50_ms']:>7.2f} {m['p99_ms']:>7.2f} {m['max_ms']:>7.1f} {m['cpu_claims_per_s']:>6.0f} "
                f"{m['cpu_p50_ms']:>7.2f} {m['cpu_p99_ms']:>7.2f} {m['cel_evals']:>9} "
                f"{r['peak_rss_mib']:>12.0f} {r['model_mib']:>9.1f} {r['build_s']:>7.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
