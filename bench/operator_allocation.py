"""Benchmark: 1000 standalone claims at once on 100 nodes with 8 simulated GPUs each.

Runs the real control plane (``dra_devcluster``) and ``dra-operator run`` as a subprocess
under its ServiceAccount (a token, the ClusterRole from ``manifests/base``), in two scenarios:

- burst: the claims are created (50 requests in flight) while the operator runs, so creation and
  allocation share the API server; the time runs from the first creation;
- backlog: the claims exist before the operator starts (a restart or upgrade with pending work);
  the time runs from the operator's process start.

For each it prints the time until every claim that fits is allocated, claims/s, p50/p99 creation to
allocation (client clocks: creation requested -> allocation seen on a watch), the operator's
RSS, and the CPU seconds each process used in the window (and the operator's per allocated claim).

Then, for scale, from the same API server in the same run:

- the reference allocator: both scenarios again with the benchmark itself writing each claim's
  allocation the operator's way, with no placement work (:class:`ReferenceAllocator`);
- the compiled reference: the burst again with ``bench/go_writer`` in the operator's place, a Go
  process on client-go with the operator's identity that watches the claims and writes the same
  allocations the operator's way, once talking JSON as the operator does and once protobuf as
  kube-scheduler does: how close an allocator whose own client costs almost nothing comes to the
  bound (``--no-go`` leaves it out; it needs a Go toolchain);
- the raw rates at which it takes claim creations and claim status updates from one client with
  nothing else running, and from them the burst bound: no allocator, however cheap, can end the
  burst before the server has taken every creation and every allocation write at those rates.

    .venv/bin/python -m bench.operator_allocation [--nodes 100] [--gpus 8] [--claims 1000] [--writes 8]
        [--no-policy] [--no-go]

The claim finalizer policy (``manifests/optional/claim-finalizer-policy``, Kubernetes 1.36+) is
applied, as an installation on 1.36 would, unless ``--no-policy``: with it the API server adds the
operator's finalizer when a claim is created, and allocation is one status write instead of two.

With BENCH_PROFILE=<file> in the environment, the operator runs under cProfile and writes its
profile there when it stops (figures are then about half the speed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, watch

from bench import gobuild
from bench.clusters import cluster_for
from dra_api.kube import make_api_client
from dra_devcluster import LocalCluster
from dra_devcluster.cluster import free_port

GROUP, VERSION = "resource.k8s.io", "v1"
GPU_CLASS = "gpu.nvidia.com"  # the shipped name, which the claim finalizer policy matches
NS = "bench"
BACKLOG_NS = "bench-backlog"
RAW_NS = "bench-raw"
MERGE_PATCH = "application/merge-patch+json"


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


def gpu_claim(name: str, namespace: str, cls: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}},
    }


async def bounded(coros: list[Any], limit: int) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class CpuMeter:
    """CPU seconds used by each control-plane component and the allocator over a window."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster: dict[str, int] = {}
        for pid in cluster.pids():
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            self.cluster[Path(argv0.decode()).name] = pid
        self.pids: dict[str, int] = {}
        self._start: dict[str, float] = {}

    def start(self, allocator_pid: int | None, *, name: str = "operator") -> None:
        """Start the window; ``allocator_pid`` is the allocator's process (``name`` in the figures),
        None when the allocator runs in the benchmark's own process."""
        self.pids = dict(self.cluster)
        if allocator_pid is not None:
            self.pids[name] = allocator_pid
        self._start = {process: _cpu_s(pid) for process, pid in self.pids.items()}
        self._start["benchmark client"] = time.process_time()

    def used(self) -> dict[str, float]:
        now = {process: _cpu_s(pid) for process, pid in self.pids.items()}
        now["benchmark client"] = time.process_time()
        return {process: now[process] - self._start[process] for process in now}


@dataclass(frozen=True)
class Window:
    """One burst as measured: when it started, how long the creations took, the CPU seconds of
    each process and the claim PATCH requests the API server answered in it."""

    start: float
    created_in: float
    cpu: dict[str, float]
    patches: float


class Run:
    """One allocation run: claims in namespace ``ns``, their allocation times from a watch."""

    def __init__(self, custom: Any, ns: str, expected: int, *, cls: str = GPU_CLASS) -> None:
        self.custom, self.ns, self.expected, self.cls = custom, ns, expected, cls
        self.created: dict[str, float] = {}
        self.allocated: dict[str, float] = {}
        self.done = asyncio.Event()

    def seen(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name not in self.allocated and (obj.get("status") or {}).get("allocation"):
            self.allocated[name] = time.monotonic()
            if len(self.allocated) >= self.expected:
                self.done.set()

    async def watch(self) -> None:
        # A watch can end (server timeout, compaction): list to catch up, then watch again.
        custom, ns = self.custom, self.ns
        while not self.done.is_set():
            listing = await custom.list_namespaced_custom_object(GROUP, VERSION, ns, "resourceclaims")
            for obj in listing.get("items", []):
                self.seen(obj)
            w = watch.Watch()
            async with w.stream(
                custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                ns,
                "resourceclaims",
                resource_version=listing["metadata"]["resourceVersion"],
                timeout_seconds=60,
            ) as stream:
                async for event in stream:
                    if isinstance(event.get("object"), dict):
                        self.seen(event["object"])
                    if self.done.is_set():
                        return

    async def create(
        self, count: int, *, created: Callable[[int, dict[str, Any]], None] | None = None
    ) -> float:
        """Create ``count`` claims, 50 requests in flight; returns how long it took. ``created`` is
        called with each claim's index and the object the API server returned."""

        async def one(i: int) -> None:
            name = f"c{i:04d}"
            # From the request on: a fast allocator's write can be seen on the watch before this
            # coroutine hears the creation's reply, which made latencies below zero.
            self.created[name] = time.monotonic()
            obj = await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.ns, "resourceclaims", gpu_claim(name, self.ns, self.cls)
            )
            if created is not None:
                created(i, obj)

        start = time.monotonic()
        await bounded([one(i) for i in range(count)], 50)
        return time.monotonic() - start


async def measure_burst(api: Any, meter: CpuMeter, run: Run, *, claims: int, pid: int, name: str) -> Window:
    """Watch ``run``'s namespace, then create ``claims`` claims while the allocator in process
    ``pid`` runs, until the expected ones are allocated; the time runs from the first creation."""
    watcher = asyncio.create_task(run.watch())
    await asyncio.sleep(1.0)
    start = time.monotonic()
    meter.start(pid, name=name)
    patches = await _claim_patches(api)
    created_in = await run.create(claims)
    await asyncio.wait_for(run.done.wait(), timeout=1200)
    cpu = meter.used()
    watcher.cancel()
    return Window(start, created_in, cpu, await _claim_patches(api) - patches)


def _allocation(i: int, *, gpus: int) -> dict[str, Any]:
    """An allocation as the operator writes it: claim ``i`` gets GPU ``i % gpus`` of node ``i // gpus``."""
    node = f"bench-node-{i // gpus:03d}"
    return {
        "devices": {
            "results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": f"gpu-{i % gpus}"}
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
        "allocationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


class ReferenceAllocator:
    """An allocator with no placement work and no watch of its own, in the benchmark's process: it
    knows each claim from the reply to its creation and writes a precomputed allocation the
    operator's way (merge patch of the status with a resourceVersion precondition, at most
    ``writes`` at once). The claims that do not fit get no write, as the operator's condition writes
    come after its window too. Not a ceiling: its HTTP client costs CPU on the same cores (the burst
    bound printed from the raw rates is the ceiling); it shows what the operator's own work adds."""

    def __init__(self, custom: Any, *, allocatable: int, gpus: int, writes: int) -> None:
        self.custom, self.allocatable, self.gpus = custom, allocatable, gpus
        self._writes = asyncio.Semaphore(writes)
        self._tasks: list[asyncio.Task[None]] = []

    def allocate(self, i: int, obj: dict[str, Any]) -> None:
        if i < self.allocatable:
            self._tasks.append(asyncio.create_task(self._write(i, obj)))

    async def _write(self, i: int, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        async with self._writes:
            await self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                meta["namespace"],
                "resourceclaims",
                meta["name"],
                {
                    "metadata": {"resourceVersion": meta["resourceVersion"]},
                    "status": {"allocation": _allocation(i, gpus=self.gpus)},
                },
                _content_type=MERGE_PATCH,
            )

    async def wait(self) -> None:
        await asyncio.gather(*self._tasks)


async def _claim_patches(api: Any) -> float:
    """PATCH requests on resourceclaims the API server has carried out so far (answered 2xx; a
    write refused with a conflict and tried again counts once), from its own metrics (in each
    window only the allocator being measured patches claims)."""
    response = await api.call_api("/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False)
    raw = response[0] if isinstance(response, tuple) else response
    total = 0.0
    for line in (await raw.text()).splitlines():
        if (
            line.startswith("apiserver_request_total{")
            and 'resource="resourceclaims"' in line
            and 'verb="PATCH"' in line
            and 'code="2' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _event_count(core: Any, ns: str) -> int:
    """How many Events the namespace holds (read raw: the client's Event model is slow to build)."""
    response = await core.list_namespaced_event(ns, _preload_content=False)
    return len((await response.json())["items"])


def _report(
    title: str,
    run: Run,
    *,
    claims: int,
    start: float,
    cpu: dict[str, float],
    rss: float | None,
    patches: float,
    extra: str = "",
) -> tuple[float, float]:
    """Print one scenario's figures; returns its claims/s and claim writes/s."""
    total = max(run.allocated.values()) - start
    latencies = sorted(run.allocated[n] - run.created[n] for n in run.allocated)
    rate = run.expected / total
    print(f"--- {title}")
    if extra:
        print(extra)
    first = min(run.allocated.values()) - start
    print(
        f"{run.expected} claims allocated ({claims - run.expected} cannot fit) after {total:.1f} s "
        f"-> {rate:.0f} claims/s (first allocation after {first:.1f} s)"
    )
    print(
        f"creation->allocation p50 {statistics.median(latencies):.2f} s, "
        f"p99 {latencies[int(0.99 * (len(latencies) - 1))]:.2f} s, max {latencies[-1]:.2f} s"
    )
    if total > first:
        # Without the start-up (the operator's process start, or the first creations): the rate
        # at which allocations land once they flow.
        print(f"from the first allocation to the last: {(run.expected - 1) / (total - first):.0f} claims/s")
    print(f"claim writes (PATCH) in the window: {patches:.0f} -> {patches / total:.0f}/s")
    if rss is not None:
        print(f"operator RSS after allocating: {rss:.0f} MiB")
    if cpu.get("operator"):
        print(f"operator CPU per allocated claim: {1000 * cpu['operator'] / run.expected:.2f} ms")
    print(
        "CPU seconds in the window: "
        + ", ".join(f"{name} {seconds:.1f}" for name, seconds in sorted(cpu.items(), key=lambda kv: -kv[1]))
        + f" (window {total:.1f} s, {os.cpu_count()} cores)"
    )
    return rate, patches / total


async def _raw_rates(custom: Any, claims: int, in_flight: int, *, round_: int) -> tuple[float, float]:
    """The same API server, one client: claim creations (50 in flight), then plain claim status
    writes (``in_flight``) on them, the ceiling for any allocator. Returns both rates. Each round
    writes the allocation of claims of its own (an allocation is immutable)."""
    names = [f"r{round_}-{i:04d}" for i in range(claims)]
    start = time.monotonic()
    await bounded(
        [
            custom.create_namespaced_custom_object(
                GROUP, VERSION, RAW_NS, "resourceclaims", gpu_claim(name, RAW_NS, "bench-raw")
            )
            for name in names
        ],
        50,
    )
    create_rate = claims / (time.monotonic() - start)

    async def status(name: str) -> None:
        result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "raw", "device": name}
        await custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            RAW_NS,
            "resourceclaims",
            name,
            {"status": {"allocation": {"devices": {"results": [result]}}}},
            _content_type=MERGE_PATCH,
        )

    start = time.monotonic()
    await bounded([status(name) for name in names], in_flight)
    return create_rate, claims / (time.monotonic() - start)


async def _reference_run(
    api: Any, meter: CpuMeter, *, backlog: bool, claims: int, allocatable: int, gpus: int, writes: int
) -> float:
    """The burst or the backlog with the reference allocator in the operator's place, measured as
    the operator's runs are (the same watch, the same clocks); returns its claims/s."""
    custom: Any = client.CustomObjectsApi(api)
    core: Any = client.CoreV1Api(api)
    ns = "bench-reference-backlog" if backlog else "bench-reference"
    await core.create_namespace({"metadata": {"name": ns}})
    run = Run(custom, ns, allocatable)
    allocator = ReferenceAllocator(custom, allocatable=allocatable, gpus=gpus, writes=writes)
    objects: list[tuple[int, dict[str, Any]]] = []
    if backlog:
        await run.create(claims, created=lambda i, obj: objects.append((i, obj)))
    watcher = asyncio.create_task(run.watch())
    await asyncio.sleep(1.0)
    start = time.monotonic()
    meter.start(None)
    patches = await _claim_patches(api)
    extra = ""
    if backlog:
        for i, obj in objects:
            allocator.allocate(i, obj)
    else:
        created_in = await run.create(claims, created=allocator.allocate)
        extra = f"claims created in {created_in:.1f} s"
    await allocator.wait()
    await asyncio.wait_for(run.done.wait(), timeout=1200)
    cpu = meter.used()
    title = "backlog: claims created first" if backlog else "burst: claims created while it writes"
    rate, _ = _report(
        f"reference allocator, {title}",
        run,
        claims=claims,
        start=start,
        cpu=cpu,
        rss=None,
        patches=await _claim_patches(api) - patches,
        extra=extra,
    )
    watcher.cancel()
    return rate


async def compiled_run(
    api: Any,
    meter: CpuMeter,
    *,
    binary: Path,
    kubeconfig: Path,
    protobuf: bool,
    claims: int,
    allocatable: int,
    gpus: int,
    writes: int,
    cls: str = GPU_CLASS,
) -> tuple[float, float]:
    """The burst with ``bench/go_writer`` in the operator's place (the operator's identity, its
    way of writing, ``writes`` in flight), measured as the operator's burst is; returns its
    claims/s and its CPU milliseconds per allocated claim. The claims ask for class ``cls``: one
    the operator does not allocate when it runs beside it."""
    custom: Any = client.CustomObjectsApi(api)
    core: Any = client.CoreV1Api(api)
    ns = "bench-go-protobuf" if protobuf else "bench-go-json"
    await core.create_namespace({"metadata": {"name": ns}})
    run = Run(custom, ns, allocatable, cls=cls)
    argv = [
        str(binary),
        f"-kubeconfig={kubeconfig}",
        f"-namespace={ns}",
        f"-allocatable={allocatable}",
        f"-gpus={gpus}",
        f"-writes={writes}",
        f"-protobuf={str(protobuf).lower()}",
    ]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr
    if stdin is None or stdout is None or stderr is None:
        raise RuntimeError("go_writer: no pipes")  # not reached: all three are asked for
    try:
        ready = await asyncio.wait_for(stdout.readline(), timeout=60)
        if ready.strip() != b"ready":
            raise RuntimeError(f"go_writer did not start: {(await stderr.read()).decode().strip()}")
        # Measured before it exits: it stays until its stdin closes.
        window = await measure_burst(api, meter, run, claims=claims, pid=proc.pid, name="go writer")
        stdin.close()
        if await proc.wait() != 0:
            raise RuntimeError(f"go_writer failed: {(await stderr.read()).decode().strip()}")
        figures = json.loads(await stdout.readline())
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    encoding = "protobuf" if protobuf else "JSON"
    rate, _ = _report(
        f"compiled reference ({encoding}), burst: bench/go_writer in the operator's place",
        run,
        claims=claims,
        start=window.start,
        cpu=window.cpu,
        rss=None,
        patches=window.patches,
        extra=f"claims created in {window.created_in:.1f} s; it wrote {figures['written']} allocations",
    )
    cpu_ms = 1000 * window.cpu["go writer"] / run.expected
    print(f"go writer CPU per allocated claim: {cpu_ms:.2f} ms")
    return rate, cpu_ms


MANIFESTS = Path(__file__).resolve().parent.parent / "manifests" / "base"


def service_account_kubeconfigs(cluster: LocalCluster) -> tuple[Path, Path]:
    """Credentials as in a cluster: the operator's ServiceAccount with its ClusterRole from
    ``manifests/base``, and one bound to cluster-admin for the benchmark's own client. Both use
    bearer tokens, whose verification the API server caches; with the local cluster's admin client
    certificate it would verify an ECDSA signature on every request (about a tenth of its CPU)."""
    for name in (
        "namespace",
        "operator-serviceaccount",
        "operator-clusterrole",
        "operator-clusterrolebinding",
    ):
        cluster.kubectl("apply", "-f", str(MANIFESTS / f"{name}.yaml"))
    # Applied, not created: benchmarks run one after another on one cluster call this each.
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "bench-client", "namespace": "accel-dra"},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "bench-client"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "bench-client", "namespace": "accel-dra"}],
            },
        ]
    )

    def token(account: str) -> str:
        return cluster.kubectl("create", "token", account, "-n", "accel-dra", "--duration=2h").stdout.strip()

    return (
        cluster.kubeconfig_for_token(token("accel-dra-operator"), name="bench-operator"),
        cluster.kubeconfig_for_token(token("bench-client"), name="bench-client"),
    )


def apply_claim_finalizer_policy(cluster: LocalCluster) -> None:
    """The optional MutatingAdmissionPolicy that adds the operator's finalizer at creation (one
    write per allocation instead of two); waits until the API server applies it."""
    cluster.kubectl("apply", "-k", str(MANIFESTS.parent / "optional" / "claim-finalizer-policy"))
    probe = json.dumps(gpu_claim("policy-probe", "default", GPU_CLASS))

    def in_effect() -> bool:
        created = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=probe)
        return "finalizers" in json.loads(created.stdout)["metadata"]

    cluster.wait_for(in_effect, what="the claim finalizer policy in effect")


async def bench(
    cluster: LocalCluster, *, nodes: int, gpus: int, claims: int, writes: int, policy: bool, go: bool
) -> None:
    operator_kubeconfig, client_kubeconfig = service_account_kubeconfigs(cluster)
    if policy:
        apply_claim_finalizer_policy(cluster)
    api = await make_api_client(kubeconfig=client_kubeconfig)
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    for ns in (NS, BACKLOG_NS, RAW_NS):
        await core.create_namespace({"metadata": {"name": ns}})
    names = [f"bench-node-{i:03d}" for i in range(nodes)]
    await bounded(
        [core.create_node({"metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}}) for n in names],
        32,
    )
    await bounded(
        [
            custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", _slice(n, gpus))
            for n in names
        ],
        32,
    )
    meter = CpuMeter(cluster)
    go_writer: Path | None = None
    if go:
        go_writer, build_s = gobuild.build("go_writer")
        print(f"go build of bench/go_writer: {build_s:.1f} s")
    allocatable = min(claims, nodes * gpus)  # more claims than GPUs: the rest must be explained
    proc = start_operator(operator_kubeconfig, writes=writes)
    try:
        # The class exists once the operator has listed the cluster and ensured its classes.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                await custom.get_cluster_custom_object(GROUP, VERSION, "deviceclasses", GPU_CLASS)
                break
            except client.ApiException:
                await asyncio.sleep(0.5)
        rss_idle = rss_mib(proc.pid)
        print(f"nodes x GPUs: {nodes} x {gpus}; claims: {claims}; operator --max-concurrent-writes={writes}")
        print(
            "claim finalizer policy: "
            + ("applied (one write per allocation)" if policy else "left out (two writes per allocation)")
        )
        print(f"operator RSS idle: {rss_idle:.0f} MiB")

        # 1. Burst: the claims are created while the operator runs; creation and allocation share
        # the API server.
        burst = Run(custom, NS, allocatable)
        window = await measure_burst(api, meter, burst, claims=claims, pid=proc.pid, name="operator")
        rss = rss_mib(proc.pid)
        events = await _event_count(core, NS)
        burst_rate, burst_writes = _report(
            "burst: claims created while the operator runs (time from the first creation)",
            burst,
            claims=claims,
            start=window.start,
            cpu=window.cpu,
            rss=rss,
            patches=window.patches,
            extra=f"claims created in {window.created_in:.1f} s; Events posted in the window: {events}",
        )
        # Free the devices for the second run: delete the burst's claims and let the operator
        # release them (its finalizer), then stop it.
        await custom.delete_collection_namespaced_custom_object(GROUP, VERSION, NS, "resourceclaims")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            left = await custom.list_namespaced_custom_object(GROUP, VERSION, NS, "resourceclaims")
            if not left["items"]:
                break
            await asyncio.sleep(1.0)
        stop_operator(proc)

        # 2. Backlog: the claims exist before the operator starts (a restart or an upgrade with
        # pending work); the time runs from the operator's process start.
        backlog = Run(custom, BACKLOG_NS, allocatable)
        await backlog.create(claims)
        watcher = asyncio.create_task(backlog.watch())
        await asyncio.sleep(1.0)
        start = time.monotonic()
        patches = await _claim_patches(api)
        proc = start_operator(operator_kubeconfig, writes=writes)
        meter.start(proc.pid)
        await asyncio.wait_for(backlog.done.wait(), timeout=1200)
        cpu, rss = meter.used(), rss_mib(proc.pid)
        backlog_rate, backlog_writes = _report(
            "backlog: claims created first, then the operator started (time from its process start)",
            backlog,
            claims=claims,
            start=start,
            cpu=cpu,
            rss=rss,
            patches=await _claim_patches(api) - patches,
        )
        watcher.cancel()
        stop_operator(proc)

        # 3. The same two scenarios with the reference allocator in the operator's place.
        reference = [
            await _reference_run(
                api, meter, backlog=backlog, claims=claims, allocatable=allocatable, gpus=gpus, writes=writes
            )
            for backlog in (False, True)
        ]
        # 4. The burst with the compiled reference, JSON then protobuf.
        compiled = [
            (
                await compiled_run(
                    api,
                    meter,
                    binary=go_writer,
                    kubeconfig=operator_kubeconfig,
                    protobuf=protobuf,
                    claims=claims,
                    allocatable=allocatable,
                    gpus=gpus,
                    writes=writes,
                )
            )[0]
            for protobuf in (False, True)
            if go_writer is not None
        ]

        raw = [await _raw_rates(custom, claims, 16, round_=i) for i in range(3)]
        rounds = [status for _, status in raw]
        print("--- raw claim status updates, one client (16 in flight), nothing else running")
        print(f"3 rounds of {claims}: " + ", ".join(f"{r:.0f}/s" for r in rounds))
        print("their creations (50 in flight): " + ", ".join(f"{c:.0f}/s" for c, _ in raw))
        best = statistics.median(rounds)
        # The burst asks the API server for every creation and every allocation write inside its
        # window: with the server's CPU the bottleneck (both cores are busy in the burst), even an
        # allocator that costs nothing ends no sooner than the two at their raw rates, one after
        # the other.
        creations = statistics.median(c for c, _ in raw)
        bound = allocatable / (claims / creations + allocatable / best)
        print(
            f"burst bound for any allocator: {allocatable} / ({claims} / {creations:.0f}/s + "
            f"{allocatable} / {best:.0f}/s) = {bound:.0f} claims/s, {100 * bound / best:.0f} % of raw"
        )

        def vs(rate: float, base: float) -> str:
            return f"{100 * rate / base:.0f} %"

        print(
            "operator claims/s vs raw (median): "
            f"burst {vs(burst_rate, best)}, backlog {vs(backlog_rate, best)}"
        )
        # Without the claim finalizer policy each allocated claim takes two writes (finalizer, then
        # status.allocation), and claims/s can reach at most half the raw rate; the writes' ratio
        # shows how close the operator gets either way.
        print(
            "operator claim writes/s vs raw (median): "
            f"burst {vs(burst_writes, best)}, backlog {vs(backlog_writes, best)}"
        )
        print(
            "reference allocator claims/s vs raw (median): "
            f"burst {vs(reference[0], best)}, backlog {vs(reference[1], best)}"
        )
        print(
            "operator claims/s vs the reference allocator: "
            f"burst {vs(burst_rate, reference[0])}, backlog {vs(backlog_rate, reference[1])}"
        )
        print(f"operator burst claims/s vs the burst bound: {vs(burst_rate, bound)}")
        print(f"reference allocator burst claims/s vs the burst bound: {vs(reference[0], bound)}")
        if compiled:
            print(
                "compiled reference burst claims/s vs the burst bound: "
                f"JSON {vs(compiled[0], bound)}, protobuf {vs(compiled[1], bound)}"
            )
            print(f"operator burst claims/s vs the compiled reference (JSON): {vs(burst_rate, compiled[0])}")
    finally:
        stop_operator(proc)
        await api.close()


def stop_operator(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def start_operator(kubeconfig: Path, *, writes: int) -> subprocess.Popen[bytes]:
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
                "dra_operator.entry.cli",
                "run",
                f"--kubeconfig={kubeconfig}",
                f"--metrics-port={port}",
                "--metrics-host=127.0.0.1",
                f"--gpu-class={GPU_CLASS}",
                "--standalone=true",
                f"--max-concurrent-writes={writes}",
                "--log-level=WARNING",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def main(argv: Sequence[str] | None = None, *, cluster: LocalCluster | None = None) -> None:
    """The benchmark on a control plane of its own, or on ``cluster`` (see :mod:`bench.clusters`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--writes", type=int, default=8, help="the operator's --max-concurrent-writes")
    parser.add_argument(
        "--no-policy",
        dest="policy",
        action="store_false",
        help="leave out the claim finalizer policy (two writes per allocation)",
    )
    parser.add_argument(
        "--no-go",
        dest="go",
        action="store_false",
        help="leave out the compiled reference (bench/go_writer, built with the Go toolchain)",
    )
    args = parser.parse_args(argv)
    with cluster_for(cluster, prefix="bench-cluster-") as used:
        asyncio.run(
            bench(
                used,
                nodes=args.nodes,
                gpus=args.gpus,
                claims=args.claims,
                writes=args.writes,
                policy=args.policy,
                go=args.go,
            )
        )


if __name__ == "__main__":
    main()
