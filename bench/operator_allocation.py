"""Benchmark: 1000 standalone claims created at once on 100 nodes with 8 simulated GPUs each.

Runs the real control plane (``dra_api.localcluster``) and ``dra-operator run`` as a subprocess, and
prints: time until every claim is allocated, claims/s, p50/p99 creation-to-allocation (client
clocks: creation acknowledged -> allocation seen on a watch), the operator's RSS, and - for scale -
the raw rate at which the same API server takes claim status updates from one client.

    .venv/bin/python -m bench.operator_allocation [--nodes 100] [--gpus 8] [--claims 1000]

With BENCH_PROFILE=<file> in the environment, the operator runs under cProfile and writes its
profile there when it stops (figures are then about half the speed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, watch

from dra_api.kube import make_api_client
from dra_api.localcluster import LocalCluster
from dra_api.localcluster.cluster import free_port

GROUP, VERSION = "resource.k8s.io", "v1"
GPU_CLASS = "bench-gpu"
NS = "bench"
RAW_NS = "bench-raw"


def _slice(node: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "index": {"int": i}}}
                for i in range(gpus)
            ],
        },
    }


def _claim(name: str, namespace: str, cls: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}},
    }


async def _bounded(coros: list[Any], limit: int) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def bench(
    cluster: LocalCluster, proc: subprocess.Popen[bytes], *, nodes: int, gpus: int, claims: int
) -> None:
    api = await make_api_client(kubeconfig=cluster.kubeconfig)
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    for ns in (NS, RAW_NS):
        await core.create_namespace({"metadata": {"name": ns}})
    names = [f"bench-node-{i:03d}" for i in range(nodes)]
    await _bounded(
        [core.create_node({"metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}}) for n in names],
        32,
    )
    await _bounded(
        [
            custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", _slice(n, gpus))
            for n in names
        ],
        32,
    )

    try:
        # The class exists once the operator has listed the cluster and ensured its classes.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                await custom.get_cluster_custom_object(GROUP, VERSION, "deviceclasses", GPU_CLASS)
                break
            except client.ApiException:
                await asyncio.sleep(0.5)
        rss_idle = _rss_mib(proc.pid)

        # More claims than GPUs (1000 on 800): the rest must be explained, not allocated.
        allocatable = min(claims, nodes * gpus)
        created: dict[str, float] = {}
        allocated: dict[str, float] = {}
        done = asyncio.Event()

        def seen(obj: dict[str, Any]) -> None:
            name = obj["metadata"]["name"]
            if name not in allocated and (obj.get("status") or {}).get("allocation"):
                allocated[name] = time.monotonic()
                if len(allocated) >= allocatable:
                    done.set()

        async def watcher() -> None:
            # A watch can end (server timeout, compaction): list to catch up, then watch again.
            while not done.is_set():
                listing = await custom.list_namespaced_custom_object(GROUP, VERSION, NS, "resourceclaims")
                for obj in listing.get("items", []):
                    seen(obj)
                w = watch.Watch()
                async with w.stream(
                    custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    NS,
                    "resourceclaims",
                    resource_version=listing["metadata"]["resourceVersion"],
                    timeout_seconds=60,
                ) as stream:
                    async for event in stream:
                        if isinstance(event.get("object"), dict):
                            seen(event["object"])
                        if done.is_set():
                            return

        watch_task = asyncio.create_task(watcher())
        await asyncio.sleep(1.0)

        async def create(i: int) -> None:
            name = f"c{i:04d}"
            await custom.create_namespaced_custom_object(
                GROUP, VERSION, NS, "resourceclaims", _claim(name, NS, GPU_CLASS)
            )
            created[name] = time.monotonic()

        start = time.monotonic()
        cpu_start = _cpu_s(proc.pid)
        await _bounded([create(i) for i in range(claims)], 50)
        created_all = time.monotonic() - start
        await asyncio.wait_for(done.wait(), timeout=1200)
        total = max(allocated.values()) - start
        rss_busy = _rss_mib(proc.pid)
        cpu_busy = _cpu_s(proc.pid) - cpu_start
        latencies = sorted(allocated[n] - created[n] for n in allocated)
        watch_task.cancel()

        # The same API server, one client, plain status writes: the ceiling for any allocator.
        await _bounded(
            [
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, RAW_NS, "resourceclaims", _claim(f"r{i:04d}", RAW_NS, "bench-raw")
                )
                for i in range(claims)
            ],
            50,
        )

        async def status(i: int) -> None:
            body = {
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "request": "gpu",
                                    "driver": "gpu.nvidia.com",
                                    "pool": "raw",
                                    "device": f"d{i}",
                                }
                            ]
                        }
                    }
                }
            }
            await custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                RAW_NS,
                "resourceclaims",
                f"r{i:04d}",
                body,
                _content_type="application/merge-patch+json",
            )

        raw_start = time.monotonic()
        await _bounded([status(i) for i in range(claims)], 16)
        raw_rate = claims / (time.monotonic() - raw_start)

        print(f"nodes x GPUs: {nodes} x {gpus}; claims: {claims}")
        print(f"claims created in {created_all:.1f} s")
        print(
            f"{allocatable} claims allocated ({claims - allocatable} cannot fit) after {total:.1f} s "
            f"-> {allocatable / total:.0f} claims/s"
        )
        print(
            f"creation->allocation p50 {statistics.median(latencies):.2f} s, "
            f"p99 {latencies[int(0.99 * (len(latencies) - 1))]:.2f} s, max {latencies[-1]:.2f} s"
        )
        print(f"operator RSS: {rss_idle:.0f} MiB idle, {rss_busy:.0f} MiB after allocating")
        print(f"operator CPU while allocating: {cpu_busy:.1f} s ({100 * cpu_busy / total:.0f} % of one core)")
        print(f"raw claim status updates (one client, 16 in flight): {raw_rate:.0f}/s")
    finally:
        await api.close()


def start_operator(cluster: LocalCluster) -> subprocess.Popen[bytes]:
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="bench-operator-")) / "operator.log"
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                *(
                    ["-m", "cProfile", "-o", os.environ["BENCH_PROFILE"]]
                    if os.environ.get("BENCH_PROFILE")
                    else []
                ),
                "-m",
                "dra_operator.cli",
                "run",
                f"--kubeconfig={cluster.kubeconfig}",
                f"--metrics-port={port}",
                "--metrics-host=127.0.0.1",
                f"--gpu-class={GPU_CLASS}",
                "--standalone=true",
                "--log-level=WARNING",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--claims", type=int, default=1000)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    with LocalCluster(workdir=workdir) as cluster:
        os.environ.pop("KUBECONFIG", None)
        proc = start_operator(cluster)
        try:
            asyncio.run(bench(cluster, proc, nodes=args.nodes, gpus=args.gpus, claims=args.claims))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
