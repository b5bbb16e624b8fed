"""Benchmark: pod start on real nodes, with one GPU claim and without, in the same run.

The real local control plane, two real nodes (kubelet + containerd each, see
``dra_devcluster.node``) and one node agent per node with 8 simulated H100s (whose device nodes are
real character devices, injected by containerd from the agent's CDI specs). For each pod the time
runs from the API server acknowledging its creation to the pod's phase showing Running on a watch;
the pod runs the local busybox image (``sleep``).

- one at a time: 50 pods of each kind, alternating (DRA, plain, DRA, ...), each deleted (gracefully)
  and gone before the next is created;
- at once: 10 pods of each kind created together (plain first, then DRA, in separate rounds).

It prints p50 and p99 of each kind, and the ratio of the DRA pod's p50 to the plain pod's:

    .venv/bin/python -m bench.pod_start [--sequential 50] [--burst 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from bench.clusters import cluster_for
from dra_api.kube import make_api_client
from dra_devcluster import LocalCluster
from dra_devcluster.images import WORKLOAD_IMAGE
from tests.integration.agent.agentproc import GPU, AgentDirs, AgentProcess, agent_kubeconfig
from tests.integration.objects import device_class

NODES = ("bench-node-1", "bench-node-2")
CLASS = "bench-gpu"
NS = "pod-start"


def pod(name: str, *, gpu: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": WORKLOAD_IMAGE, "command": ["sleep", "3600"]}],
    }
    if gpu:
        spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def template() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}}},
    }


class Timer:
    """Pod creation acknowledged -> Running seen on a watch, per pod name."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.created: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self._waiters: dict[str, asyncio.Event] = {}

    async def watch(self) -> None:
        while True:
            listing = await self.core.list_namespaced_pod(NS)
            w = watch.Watch()
            async with w.stream(
                self.core.list_namespaced_pod,
                NS,
                resource_version=listing.metadata.resource_version,
                timeout_seconds=300,
            ) as stream:
                async for event in stream:
                    obj = event["object"]
                    name = obj.metadata.name
                    if obj.status and obj.status.phase == "Running" and name not in self.running:
                        self.running[name] = time.monotonic()
                        if name in self._waiters:
                            self._waiters[name].set()

    async def start(self, name: str, *, gpu: bool) -> float:
        """Create the pod and wait until it runs; seconds from creation to Running."""
        self._waiters[name] = asyncio.Event()
        await self.core.create_namespaced_pod(NS, pod(name, gpu=gpu))  # type: ignore[arg-type]
        self.created[name] = time.monotonic()
        await asyncio.wait_for(self._waiters[name].wait(), timeout=120)
        return self.running[name] - self.created[name]

    async def delete(self, name: str) -> None:
        # A graceful deletion, as users delete pods: the pod object goes once its kubelet stopped it
        # and unprepared its claims. A forced one frees the claim first, and the next pod given the
        # same device waits until the kubelet unprepares the old claim (the agent refuses to serve
        # one device to two claims).
        try:
            await self.core.delete_namespaced_pod(name, NS)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def wait_gone(self, names: list[str]) -> None:
        for _ in range(600):
            left = {p.metadata.name for p in (await self.core.list_namespaced_pod(NS)).items}
            if not left & set(names):
                return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"pods not gone: {sorted(left & set(names))}")


def summary(label: str, values: list[float]) -> tuple[float, str]:
    ordered = sorted(values)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return p50, f"{label:32s} n={len(values):3d}  p50 {p50 * 1000:7.0f} ms  p99 {p99 * 1000:7.0f} ms"


async def run(cluster: LocalCluster, *, sequential: int, burst: int, nodes: int = len(NODES)) -> None:
    api = await make_api_client(kubeconfig=cluster.kubeconfig)
    core = client.CoreV1Api(api)
    timer = Timer(core)
    watcher = asyncio.create_task(timer.watch())
    results: dict[str, list[float]] = {"dra, one at a time": [], "plain, one at a time": []}
    try:
        # Warm-up: the first pod on each node pays for things later pods do not (image, CNI).
        for i in range(nodes):
            await timer.start(f"warm-{i}", gpu=True)
        await asyncio.gather(*(timer.delete(f"warm-{i}") for i in range(nodes)))
        await timer.wait_gone([f"warm-{i}" for i in range(nodes)])
        for i in range(sequential):
            for gpu in (True, False):
                name = f"{'dra' if gpu else 'plain'}-{i}"
                elapsed = await timer.start(name, gpu=gpu)
                results[f"{'dra' if gpu else 'plain'}, one at a time"].append(elapsed)
                await timer.delete(name)
                await timer.wait_gone([name])
        for gpu in (False, True):
            kind = "dra" if gpu else "plain"
            names = [f"{kind}-burst-{i}" for i in range(burst)]
            results[f"{kind}, {burst} at once"] = list(
                await asyncio.gather(*(timer.start(n, gpu=gpu) for n in names))
            )
            await asyncio.gather(*(timer.delete(n) for n in names))
            await timer.wait_gone(names)
    finally:
        watcher.cancel()
        await api.close()
    p50s = {}
    for label, values in results.items():
        p50s[label], line = summary(label, values)
        print(line)
    for mode in ("one at a time", f"{burst} at once"):
        ratio = p50s[f"dra, {mode}"] / p50s[f"plain, {mode}"]
        print(f"{mode:32s} DRA p50 / plain p50 = {ratio:.2f}x (target <= 1.3x)")


def main(argv: Sequence[str] | None = None, *, cluster: LocalCluster | None = None) -> None:
    """The benchmark on a control plane of its own, or on ``cluster``, left as it was found (see
    :mod:`bench.clusters`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=50)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=len(NODES), choices=range(1, len(NODES) + 1))
    args = parser.parse_args(argv)
    nodes = NODES[: args.nodes]
    with cluster_for(cluster, prefix="bps-") as used:
        agents: list[AgentProcess] = []
        try:
            kubeconfig = agent_kubeconfig(used)
            for name in nodes:
                node = used.add_real_node(name)
                agents.append(AgentProcess(node=name, dirs=AgentDirs.for_node(node), kubeconfig=kubeconfig))
                agents[-1].start()
            used.create_namespace(NS)
            used.apply([device_class(CLASS, driver=GPU), template()])
            print(
                f"pod start on {len(nodes)} real nodes (kubelet + containerd, 8 simulated GPUs each); "
                f"{os.cpu_count()} cores"
            )
            asyncio.run(run(used, sequential=args.sequential, burst=args.burst, nodes=len(nodes)))
        finally:
            if cluster is not None:
                # Deleted while the agents still run: they unprepare the pods' claims.
                used.kubectl("delete", "namespace", NS, "--ignore-not-found", "--timeout=120s", check=False)
                used.kubectl("delete", "deviceclass", CLASS, "--ignore-not-found", check=False)
            for agent in agents:
                agent.stop()
            if cluster is not None:
                for name in nodes:
                    used.remove_real_node(name)


if __name__ == "__main__":
    main()
