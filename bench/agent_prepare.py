"""Node agent prepare/unprepare latency through the real control plane, and the agent's memory.

Starts a local control plane, one Node, and the agent as a subprocess with 8 simulated GPUs and
8 simulated TPUs. A standalone ResourceClaim is allocated by writing its status (one GPU, then all
eight), and the kubelet test client prepares and unprepares it ``--rounds`` times over the real
sockets: every prepare is a fresh one (GET the claim, checkpoint PrepareStarted, CDI spec,
PrepareCompleted). Beside it, in the same run, the cost of what a prepare cannot avoid: one GET of
the claim with kubernetes_asyncio plus one fsync'd small-file write. Prints p50/p99 of each and the
agent's resident memory (VmRSS) after the rounds. With ``--mps`` it measures instead a one-GPU
claim whose GpuConfig asks for MPS: each prepare starts the claim's control daemon (the simulated
node's stand-in) and each unprepare stops it.

    .venv/bin/python -m bench.agent_prepare [--rounds 200] [--mps]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from bench.clusters import cluster_for
from dra_api.kube import make_api_client
from dra_api.kubeletapi.model import ClaimRef
from dra_devcluster import LocalCluster
from dra_devcluster.kubelet import KubeletPluginClient

GPU = "gpu.nvidia.com"
NODE = "bench-node"
NAMESPACE = "bench"


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def describe(name: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return (
        f"{name:<34} p50 {percentile(ms, 0.5):7.2f} ms   p99 {percentile(ms, 0.99):7.2f} ms   "
        f"mean {statistics.fmean(ms):7.2f} ms   n={len(ms)}"
    )


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def start_agent(
    cluster: LocalCluster, root: Path, cdi_dir: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    for sub in ("reg", "plg", "state"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "dra_node_agent.cli",
        "run",
        f"--node-name={NODE}",
        f"--kubeconfig={cluster.kubeconfig}",
        "--simulate-profile=h100-80gb-x8,tpu-v6e-2x4",
        f"--kubelet-registry-dir={root / 'reg'}",
        f"--kubelet-plugins-dir={root / 'plg'}",
        f"--cdi-dir={cdi_dir}",
        f"--state-dir={root / 'state'}",
        "--metrics-address=",
        "--log-level=WARNING",
    ]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_AGENT_")} | (env or {})
    log = (root / "agent.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    deadline = time.monotonic() + 120
    sockets = [root / "reg" / f"{d}-reg.sock" for d in (GPU, "tpu.google.com")]
    while not all(s.exists() for s in sockets):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"agent did not start:\n{(root / 'agent.log').read_text()}")
        time.sleep(0.1)
    return proc


MPS_CONFIG: dict[str, Any] = {
    "opaque": {
        "driver": GPU,
        "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
        },
    },
    "source": "FromClaim",
    "requests": ["gpu"],
}


def allocate(
    cluster: LocalCluster, *, name: str, devices: list[str], config: list[dict[str, Any]] | None = None
) -> ClaimRef:
    """A standalone claim whose status.allocation names ``devices`` of this node's GPU pool (with
    ``config`` as its allocation's device config)."""
    cluster.kubectl(
        "apply",
        "-n",
        NAMESPACE,
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {"deviceClassName": "bench-gpu", "count": len(devices)},
                            }
                        ]
                    }
                },
            }
        ),
    )
    status = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": GPU, "pool": NODE, "device": device}
                        for device in devices
                    ],
                    "config": config or [],
                }
            }
        }
    }
    cluster.kubectl(
        "patch", "resourceclaim", name, "-n", NAMESPACE, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip
    obj = cluster.get_json("resourceclaim", name, "-n", NAMESPACE)
    return ClaimRef(namespace=NAMESPACE, name=name, uid=obj["metadata"]["uid"])


async def measure_prepare(
    kubelet: KubeletPluginClient, ref: ClaimRef, rounds: int
) -> tuple[list[float], list[float]]:
    prepare_s: list[float] = []
    unprepare_s: list[float] = []
    for _ in range(rounds):
        began = time.perf_counter()
        result = (await kubelet.prepare([ref]))[ref.uid]
        prepare_s.append(time.perf_counter() - began)
        if result.error:
            raise RuntimeError(f"prepare failed: {result.error}")
        began = time.perf_counter()
        error = (await kubelet.unprepare([ref]))[ref.uid]
        unprepare_s.append(time.perf_counter() - began)
        if error:
            raise RuntimeError(f"unprepare failed: {error}")
    return prepare_s, unprepare_s


def write_and_fsync(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


async def measure_baseline(api: client.ApiClient, ref: ClaimRef, folder: Path, rounds: int) -> list[float]:
    """One claim GET plus one fsync'd write, the floor of any prepare."""
    custom = client.CustomObjectsApi(api)
    target = folder / "baseline.json"
    samples: list[float] = []
    for _ in range(rounds):
        began = time.perf_counter()
        obj: Any = await custom.get_namespaced_custom_object(
            "resource.k8s.io", "v1", ref.namespace, "resourceclaims", ref.name
        )
        await asyncio.to_thread(write_and_fsync, target, json.dumps(obj).encode())
        samples.append(time.perf_counter() - began)
    return samples


async def bench_mps(cluster: LocalCluster, root: Path, cdi_dir: Path, rounds: int) -> None:
    """Prepare and unprepare of a one-GPU MPS claim: the daemon's start and stop included (in a
    cgroup of its own under a parent of the bench's, removed afterwards)."""
    parent = f"accel-dra-bench-{os.getpid()}"
    agent = start_agent(cluster, root, cdi_dir, env={"DRA_AGENT_MPS_CGROUP_PARENT": parent})
    try:
        mps = allocate(cluster, name="mps", devices=["gpu-5"], config=[MPS_CONFIG])
        async with await KubeletPluginClient.register_driver(root / "reg", driver=GPU) as kubelet:
            await measure_prepare(kubelet, mps, 3)  # warm-up
            prepare, unprepare = await measure_prepare(kubelet, mps, rounds)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        for hierarchy in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")):
            with contextlib.suppress(OSError):
                (hierarchy / parent).rmdir()
    print(f"node agent MPS claim prepare/unprepare, {rounds} rounds (kubelet client -> agent -> API server)")
    print(describe("prepare, 1 GPU with MPS", prepare))
    print(describe("unprepare, 1 GPU with MPS", unprepare))


def set_up_cluster(cluster: LocalCluster) -> None:
    cluster.add_node(NODE)
    cluster.create_namespace(NAMESPACE)
    cluster.apply(
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "bench-gpu"},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GPU}"'}}]},
            }
        ]
    )


async def bench(cluster: LocalCluster, root: Path, cdi_dir: Path, rounds: int) -> None:
    agent = start_agent(cluster, root, cdi_dir)
    try:
        one = allocate(cluster, name="one", devices=["gpu-3"])
        eight = allocate(cluster, name="eight", devices=[f"gpu-{i}" for i in range(8)])
        api = await make_api_client(kubeconfig=cluster.kubeconfig)
        async with await KubeletPluginClient.register_driver(root / "reg", driver=GPU) as kubelet:
            await measure_prepare(kubelet, one, 10)  # warm-up: connections, imports, caches
            await measure_baseline(api, one, root / "state", 10)
            base = await measure_baseline(api, one, root / "state", rounds)
            p1, u1 = await measure_prepare(kubelet, one, rounds)
            p8, u8 = await measure_prepare(kubelet, eight, rounds)
        await api.close()
        rss = rss_mib(agent.pid)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    print(f"node agent prepare/unprepare, {rounds} rounds each (kubelet client -> agent -> API server)")
    print(describe("claim GET + one fsync'd write", base))
    print(describe("prepare, 1 device", p1))
    print(describe("unprepare, 1 device", u1))
    print(describe("prepare, 8 devices", p8))
    print(describe("unprepare, 8 devices", u8))
    ratio = percentile(p1, 0.5) / percentile(base, 0.5)
    print(f"prepare p50 / (GET + fsync) p50: {ratio:.2f}x (target <= 2x)")
    print(f"agent RSS with 8 simulated GPUs and 8 TPUs: {rss:.1f} MiB (target <= 80 MiB)")


def tear_down(cluster: LocalCluster) -> None:
    """Remove what :func:`set_up_cluster` and the agent made (its slices go with their Node), so
    that a cluster the benchmark was given is left as it was."""
    cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s", check=False)
    cluster.kubectl("delete", "deviceclass", "bench-gpu", "--ignore-not-found", check=False)
    cluster.kubectl("delete", "node", NODE, "--ignore-not-found", check=False)
    cluster.kubectl(
        "delete",
        "resourceslices",
        f"--field-selector=spec.nodeName={NODE}",
        "--ignore-not-found",
        check=False,
    )


def main(argv: Sequence[str] | None = None, *, cluster: LocalCluster | None = None) -> None:
    """The benchmark on a control plane of its own, or on ``cluster``, cleaned up after (see
    :mod:`bench.clusters`)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument(
        "--state-on-tmpfs",
        action="store_true",
        help="put the checkpoint on tmpfs too, to see the cost of everything but the fsyncs",
    )
    parser.add_argument("--mps", action="store_true", help="measure a one-GPU MPS claim instead")
    args = parser.parse_args(argv)
    # The checkpoint lives on disk (the DaemonSet's hostPath state folder); CDI specs go to a tmpfs,
    # as /var/run/cdi is on a node.
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="dra-bench-", dir=shm if args.state_on_tmpfs else "/tmp"))
    cdi_dir = Path(tempfile.mkdtemp(prefix="dra-bench-cdi-", dir=shm)) if shm.is_dir() else root / "cdi"
    print(f"state (checkpoint) in {root}, CDI specs in {cdi_dir}")
    try:
        with cluster_for(cluster, prefix="bench-agent-") as used:
            set_up_cluster(used)
            try:
                run = bench_mps if args.mps else bench
                asyncio.run(run(used, root, cdi_dir, args.rounds))
            finally:
                if cluster is not None:
                    tear_down(cluster)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(cdi_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
