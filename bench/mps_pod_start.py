"""What a pod per MPS claim would add to a prepare: how long a pod pinned to a real node takes to be
Ready on the local cluster (a real kubelet and containerd, the image already on the node).

NVIDIA's driver runs each claim's MPS control daemon as a Deployment pinned to the node
(``nodeName``) and polls for it to be ready before the prepare returns. This times that path's floor
with a pod that does nothing: a bare Pod with ``nodeName`` set (no scheduler), and a Deployment of
one such pod (the controller-manager makes its ReplicaSet and Pod first). An MPS daemon's own start
comes on top. Compare with ``bench/agent_prepare.py --mps``, whose prepare starts the daemon in a
cgroup of its own.

    .venv/bin/python -m bench.mps_pod_start [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import Any

from kubernetes_asyncio import client

from bench.clusters import cluster_for
from dra_api.kube import make_api_client
from dra_devcluster import LocalCluster
from dra_devcluster.images import WORKLOAD_IMAGE

NODE = "bench-mps-pod"
NAMESPACE = "bench"


def pod_spec() -> dict[str, Any]:
    return {
        "nodeName": NODE,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "daemon", "image": WORKLOAD_IMAGE, "command": ["sleep", "3600"]}],
    }


async def ready_pods(core: client.CoreV1Api, selector: str) -> int:
    pods = await core.list_namespaced_pod(NAMESPACE, label_selector=selector)
    return sum(
        1
        for pod in pods.items
        if any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
    )


async def wait_ready(core: client.CoreV1Api, selector: str) -> None:
    deadline = time.monotonic() + 120
    while await ready_pods(core, selector) < 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no Ready pod for {selector}")
        await asyncio.sleep(0.02)


async def time_pod(core: client.CoreV1Api, name: str) -> float:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"run": name}}}
    body["spec"] = pod_spec()
    began = time.perf_counter()
    await core.create_namespaced_pod(NAMESPACE, body)  # type: ignore[arg-type]  # sent as it is
    await wait_ready(core, f"run={name}")
    took = time.perf_counter() - began
    await core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
    return took


async def time_deployment(apps: client.AppsV1Api, core: client.CoreV1Api, name: str) -> float:
    labels = {"run": name}
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec()},
        },
    }
    began = time.perf_counter()
    await apps.create_namespaced_deployment(NAMESPACE, body)  # type: ignore[arg-type]  # sent as it is
    await wait_ready(core, f"run={name}")
    took = time.perf_counter() - began
    await apps.delete_namespaced_deployment(name, NAMESPACE, propagation_policy="Foreground")
    return took


def describe(what: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    return f"{what:<40} p50 {statistics.median(ms):8.1f} ms   max {ms[-1]:8.1f} ms   n={len(ms)}"


async def bench(cluster: LocalCluster, rounds: int) -> None:
    api = await make_api_client(kubeconfig=cluster.kubeconfig)
    try:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        await time_pod(core, "warm-up")  # the first sandbox on a node is slower
        pods = [await time_pod(core, f"pod-{i}") for i in range(rounds)]
        deployments = [await time_deployment(apps, core, f"deploy-{i}") for i in range(rounds)]
    finally:
        await api.close()
    print(f"a pod per MPS claim, its floor: until Ready on a real node, {rounds} rounds each")
    print(describe("bare Pod with nodeName", pods))
    print(describe("Deployment of one Pod with nodeName", deployments))


def main(argv: Sequence[str] | None = None, *, cluster: LocalCluster | None = None) -> None:
    """The benchmark on a control plane of its own, or on ``cluster``, left as it was found (see
    :mod:`bench.clusters`)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    with cluster_for(cluster, prefix="bench-mps-pod-") as used:
        used.add_real_node(NODE)
        try:
            used.create_namespace(NAMESPACE)
            asyncio.run(bench(used, args.rounds))
        finally:
            if cluster is not None:
                used.kubectl(
                    "delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s", check=False
                )
                used.remove_real_node(NODE)


if __name__ == "__main__":
    main()
