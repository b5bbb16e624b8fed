"""Ordinary claims beside hostile ones: allocation latency and the operator's CPU, with and without
ten hostile claims present (issue 37).

A cluster of N Node objects with eight simulated GPUs each (the agent's publisher, as in
``bench/scale.py``), plus a hostile tenant's two nodes: one of partitionable devices in two counter
sets (no polynomial check sees that at most 24 of them fit) and one of devices with many attributes
(a selector over all of them is evaluated again for each). One ``dra-operator run`` with its
defaults (a 5 s search budget per claim). Two rounds of ordinary one-GPU claims, ``--rate`` a
second for ``--seconds``, each timed from its creation to its allocation seen on a watch:

- ``without``: nothing else there;
- ``with``: ten hostile claims (:func:`bench_hostile`) created just before the round, so their
  searches overlap it; those that use their budget come back after their back-off, within it.

Printed per round: p50/p99/max of the ordinary claims' creation to allocation, the operator's CPU
seconds in the round (and per ordinary claim), and ``/healthz`` probes (every 0.5 s) that failed.
Nothing is asserted on time; ``tests/integration/operator/test_hostile_claims.py`` checks the
behaviour (each hostile claim's answer, nothing lost) with the same objects.

    .venv/bin/python -m bench.hostile_claims --nodes 100
    .venv/bin/python -m bench.hostile_claims --nodes 1000 --json hostile-1000.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.clusters import cluster_for
from bench.operator_allocation import GROUP, VERSION, Run, _cpu_s, service_account_kubeconfigs
from bench.scale import Scale, ScaleConfig, percentile
from dra_api.kube import make_api_client
from dra_devcluster import LocalCluster, resolve_kubernetes_version

DRIVER = "gpu.nvidia.com"
PRODUCT = "NVIDIA H100 80GB HBM3"  # what the simulated profile's GPUs say
RESERVED_GPUS = 64  # left free by a round's ordinary claims
NESTED = (
    f'device.attributes["{DRIVER}"].size() > 20 && device.attributes["{DRIVER}"].all(a, '
    f'device.attributes["{DRIVER}"].all(b, device.attributes["{DRIVER}"].all(c, a + b + c != "x")))'
)


def product(name: str) -> str:
    return f'device.attributes["{DRIVER}"].productName == "{name}"'


def resource_slice(
    node: str, devices: list[dict[str, Any]], *, name: str | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            **({"devices": devices} if devices else {}),
            **spec,
        },
    }


def parts_slices(node: str) -> list[dict[str, Any]]:
    """48 partitions in two counter sets of room 12 each: no more than 24 fit at once. The counters
    and the devices are two slices of one pool (a slice carries one or the other)."""
    devices = [
        {
            "name": f"part-{s}-{i}",
            "attributes": {"type": {"string": "gpu"}, "productName": {"string": "Hostile Part"}},
            "consumesCounters": [{"counterSet": s, "counters": {"units": {"value": "1"}}}],
        }
        for s in ("a", "b")
        for i in range(24)
    ]
    counters = [{"name": s, "counters": {"units": {"value": "12"}}} for s in ("a", "b")]
    pool = {"name": node, "generation": 1, "resourceSliceCount": 2}
    return [
        resource_slice(node, devices, name=f"{node}-devices", pool=pool),
        resource_slice(node, [], name=f"{node}-counters", pool=pool, sharedCounters=counters),
    ]


def wide_slice(node: str) -> dict[str, Any]:
    """Devices with 30 attributes each, all values their own: a selector over every attribute
    is evaluated again for each device."""
    devices = []
    for i in range(24):
        attributes: dict[str, Any] = {"type": {"string": "gpu"}, "productName": {"string": "Hostile Wide"}}
        attributes.update({f"a{k}": {"string": f"{node}-{i}-{k}"} for k in range(28)})
        devices.append({"name": f"wide-{i}", "attributes": attributes})
    return resource_slice(node, devices)


def request(name: str, count: int | None, *selectors: str, cls: str, **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, **extra}
    if count is not None:
        exactly["count"] = count
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": exactly}


def claim(name: str, namespace: str, requests: list[dict[str, Any]], **devices: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": requests, **devices}},
    }


def bench_hostile(namespace: str, *, cls: str, gpus: str, per_node: int) -> list[dict[str, Any]]:
    """Ten hostile claims of different kinds; ``gpus`` selects the ordinary GPUs, ``per_node`` of
    them on a node."""
    parts = product("Hostile Part")
    half = per_node // 2 + 1
    return [
        # Two requests that select the same devices and together want one more than a node has.
        claim(
            "same-devices",
            namespace,
            [
                request("a", half, gpus, f'device.attributes["{DRIVER}"].uuid.startsWith("GPU-")', cls=cls),
                request(
                    "b", per_node + 1 - half, gpus, f'device.attributes["{DRIVER}"].type == "gpu"', cls=cls
                ),
            ],
        ),
        claim("counters-hard", namespace, [request("parts", 25, parts, cls=cls)]),
        claim("counters-hard-again", namespace, [request("parts", 26, parts, cls=cls)]),
        claim(
            "first-available-explosion",
            namespace,
            [
                {
                    "name": "parts",
                    "firstAvailable": [
                        {
                            "name": f"s{i}",
                            "deviceClassName": cls,
                            "count": 25,
                            "selectors": [{"cel": {"expression": f"{parts} && {i} < 10"}}],
                        }
                        for i in range(8)
                    ],
                }
            ],
        ),
        claim("cel-at-cost-limit", namespace, [request("wide", 1, NESTED, cls=cls)]),
        claim("many-requests", namespace, [request(f"r{i}", 1, gpus, cls=cls) for i in range(per_node + 1)]),
        claim(
            "match-and-distinct",
            namespace,
            [request("gpu", 2, gpus, cls=cls)],
            constraints=[
                {"matchAttribute": "resource.kubernetes.io/pcieRoot"},
                {"distinctAttribute": "resource.kubernetes.io/pcieRoot"},
            ],
        ),
        claim(
            "long-selector",
            namespace,
            [
                request(
                    "gpu",
                    1,
                    "[" + ",".join(["[1,2,3]"] * 1100) + "].size() > 0 && " + product("Nothing"),
                    cls=cls,
                )
            ],
        ),
        claim("huge-all", namespace, [request("parts", None, parts, cls=cls, allocationMode="All")]),
        claim("over-claim-limit", namespace, [request("gpu", 33, gpus, cls=cls)]),
    ]


@dataclass
class Round:
    name: str
    claims: int
    p50_s: float
    p99_s: float
    max_s: float
    cpu_s: float
    probes: int
    failed_probes: int

    def line(self) -> str:
        return (
            f"{self.name:8} {self.claims:5d} claims: p50 {self.p50_s:.3f} s, p99 {self.p99_s:.3f} s, "
            f"max {self.max_s:.3f} s; operator CPU {self.cpu_s:.1f} s "
            f"({1000 * self.cpu_s / max(1, self.claims):.1f} ms per ordinary claim); "
            f"/healthz {self.failed_probes} of {self.probes} probes failed"
        )


class Prober:
    """/healthz every 0.5 s from a thread."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.probes = 0
        self.failures = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            self.probes += 1
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=3) as response:
                    if response.status != 200:
                        self.failures += 1
            except (urllib.error.URLError, OSError):
                self.failures += 1


async def ordinary_round(
    scale: Scale, *, name: str, rate: float, seconds: float, pid: int, port: int
) -> Round:
    ns = await scale.namespace(f"ordinary-{name}")
    count = min(int(rate * seconds), await scale.free_devices() - RESERVED_GPUS)
    run = Run(scale.custom, ns, count, cls=scale.config.gpu_class)
    watcher = asyncio.create_task(run.watch())
    await asyncio.sleep(1.0)
    prober = Prober(port)
    prober.thread.start()
    cpu_before = _cpu_s(pid)

    async def one(i: int) -> None:
        body = claim(f"c{i:05d}", ns, [request("gpu", 1, product(PRODUCT), cls=scale.config.gpu_class)])
        await scale.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "resourceclaims", body)
        run.created[body["metadata"]["name"]] = time.monotonic()

    started = time.monotonic()
    tasks = []
    for i in range(count):
        delay = started + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    await asyncio.wait_for(run.done.wait(), timeout=scale.config.timeout_s)
    cpu = _cpu_s(pid) - cpu_before
    prober.stop.set()
    prober.thread.join(timeout=5)
    watcher.cancel()
    latencies = sorted(run.allocated[n] - run.created[n] for n in run.allocated)
    slowest = sorted(run.allocated, key=lambda n: run.created[n] - run.allocated[n])[:5]
    print(
        "slowest: "
        + ", ".join(
            f"{run.allocated[n] - run.created[n]:.2f} s at +{run.created[n] - started:.1f} s" for n in slowest
        ),
        flush=True,
    )
    await scale.clear_claims(ns)
    return Round(
        name=name,
        claims=count,
        p50_s=statistics.median(latencies),
        p99_s=percentile(latencies, 0.99),
        max_s=latencies[-1],
        cpu_s=cpu,
        probes=prober.probes,
        failed_probes=prober.failures,
    )


async def bench(cluster: LocalCluster, args: argparse.Namespace, workdir: Path) -> list[Round]:
    config = ScaleConfig(nodes=args.nodes, namespace_prefix="hostile-bench", timeout_s=args.timeout)
    operator_kubeconfig, client_kubeconfig = service_account_kubeconfigs(cluster)
    api = await make_api_client(kubeconfig=client_kubeconfig)
    scale = Scale(
        cluster=cluster,
        api=api,
        config=config,
        workdir=workdir,
        operator_kubeconfig=operator_kubeconfig,
        client_kubeconfig=client_kubeconfig,
    )
    rounds: list[Round] = []
    try:
        scale.install_peering()
        print(f"--- the cluster: {args.nodes} nodes x 8 GPUs, and the hostile tenant's two nodes", flush=True)
        await scale.populate()
        for node in ("hostile-parts", "hostile-wide"):
            cluster.add_node(node)
        cluster.apply([*parts_slices("hostile-parts"), wide_slice("hostile-wide")])
        operator = scale.start_operator("hostile-bench", priority=2_000_000)
        await scale.active()
        for name in ("without", "with"):
            if name == "with":
                ns = await scale.namespace("hostile")
                hostile = bench_hostile(ns, cls=config.gpu_class, gpus=product(PRODUCT), per_node=8)
                for obj in hostile:
                    await scale.custom.create_namespaced_custom_object(
                        GROUP, VERSION, ns, "resourceclaims", obj
                    )
                print(f"--- {len(hostile)} hostile claims created", flush=True)
            print(f"--- round {name}: {args.rate:g} ordinary claims/s for {args.seconds:g} s", flush=True)
            found = await ordinary_round(
                scale,
                name=name,
                rate=args.rate,
                seconds=args.seconds,
                pid=operator.proc.pid,
                port=operator.port,
            )
            print(found.line(), flush=True)
            rounds.append(found)
        searched = operator.metric("dra_operator_allocation_searches_off_loop_total")
        print(f"placements searched in worker threads: {searched:.0f}", flush=True)
    finally:
        for inst in scale.instances:
            inst.stop()
        await api.close()
    return rounds


def main(argv: Sequence[str] | None = None, *, cluster: LocalCluster | None = None) -> None:
    """The benchmark on a control plane of its own, or on ``cluster`` (see :mod:`bench.clusters`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0, help="ordinary claims created a second")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each round creates claims")
    parser.add_argument("--timeout", type=float, default=600.0, help="the longest any one wait may take")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.nodes * 8 <= RESERVED_GPUS:
        parser.error(f"--nodes: at least {RESERVED_GPUS // 8 + 1} (a round leaves {RESERVED_GPUS} GPUs free)")
    workdir = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    with cluster_for(cluster, prefix="bench-hostile-", kubernetes=resolve_kubernetes_version()) as used:
        rounds = asyncio.run(bench(used, args, workdir))
    print(f"\n{args.nodes} nodes x 8 GPUs, operator defaults:")
    for r in rounds:
        print("  " + r.line())
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rounds], indent=2))


if __name__ == "__main__":
    main()
