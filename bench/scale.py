"""Scale: the operator on a large cluster, through the real API server.

The local control plane (``dra_devcluster``) gets N Node objects without kubelets (marked Ready, so
kube-scheduler binds pods to them) and, for each, the ResourceSlices its node agent would publish
for eight simulated GPUs: the agent's simulated discovery (profile ``h100-80gb-x8``, UUIDs from the
node name) runs per node and the agent's own :class:`SlicePublisher` writes the pool, many nodes at
once with bounded concurrency. Then ``dra-operator run`` starts on that cluster under its
ServiceAccount (two instances for the takeover, with peering as deployed), and the phases measure,
on the one cluster (creating it takes minutes):

- ``startup``: the operator's process start to its first allocation (a claim waits for it), how
  long its initial listing of the cluster took (its ``dra_operator_model_sync_duration_seconds``)
  and when Kopf's watches had listed every slice; its RSS with the cluster loaded;
- ``steady``: standalone claims created at a steady ``--rate`` for ``--steady-s``: creation to
  allocation p50/p99 (client clocks: creation acknowledged -> allocation seen on a watch);
- ``burst``: ``--burst`` claims at once (50 creations in flight): claims/s, p50/p99, and the
  operator's CPU per allocated claim beside ``bench/go_writer``'s (a compiled watch-and-write
  allocator with no placement work, ``bench/operator_allocation.py``) in the same burst
  (``--no-go`` leaves it out);
- ``rss``: ``--claims-for-rss`` claims (at most the free GPUs but 200, which the takeover's claims
  need) allocated and kept: the operator's RSS;
- ``kubectl``: wall time of ``kubectl dra devices`` and ``kubectl dra claims -A`` (the project's
  plugin, with the claims of ``rss`` in place);
- ``takeover``: a standby instance joins and lists the cluster (its RSS as a standby with the model
  kept), the active one is SIGKILLed while claims keep arriving (one every 0.5 s): the signal to
  the standby's first allocation, when it became active, and from then to its first allocation
  (it lists nothing at the takeover); then every claim must be allocated exactly once, no
  device twice, and the new active instance's model must match the API (claims and devices it
  counts as allocated, see :func:`model_mismatches`);
- ``scheduler``: ``--pods`` pods with a ResourceClaimTemplate and no nodeName, all at once: the rate
  at which kube-scheduler allocates their claims and binds them (``spec.nodeName`` set; no kubelets
  run them), beside the operator's claims/s of the burst. Anchor: upstream's scheduler_perf DRA
  thresholds at 500 nodes are 40-64 pods/s. kube-controller-manager runs with ``--kube-api-qps 100``
  (``--controller-manager-qps``, as in ``bench/scheduler_busy.py``): at its default of 20 its claim
  controller, which makes a claim and writes a pod status per pod, would be the bottleneck;
  kube-scheduler keeps its own default (``--scheduler-qps`` raises it);
- ``simulate``: ``dra-operator simulate`` of one claim against the exported cluster
  (``kubectl get deviceclasses,resourceslices,nodes``), from JSON and from YAML.

The figures end in one table, each beside its target (the issue's, for 5,000 nodes on a 2-core
machine). Nothing is asserted on time; a behaviour problem (a claim allocated twice, a device in two
claims, a model that disagrees with the API) is printed and makes the exit status 1.

    .venv/bin/python -m bench.scale --nodes 1000
    .venv/bin/python -m bench.scale --nodes 5000 --json scale-5000.json
    .venv/bin/python -m bench.scale --nodes 50 --phases startup,takeover --no-go

The claim finalizer policy (``manifests/optional/claim-finalizer-policy``) is applied as in
``bench/operator_allocation.py`` unless ``--no-policy``. The short version that CI runs, behaviour
only, is ``tests/integration/operator/test_scale.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence, Set
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from bench import gobuild
from bench.operator_allocation import (
    CpuMeter,
    Run,
    apply_claim_finalizer_policy,
    bounded,
    compiled_run,
    gpu_claim,
    measure_burst,
    rss_mib,
    service_account_kubeconfigs,
)
from bench.operator_chaos import claim_template, double_booked, template_pod
from bench.operator_failover import FailoverConfig, Instance, allocation_counts, once_problems
from dra_api.kube import make_api_client, preferred_resource_version
from dra_api.names import GPU_CLASS, GPU_DRIVER, OPERATOR_FINALIZER, TPU_CLASS
from dra_devcluster import LocalCluster, resolve_kubernetes_version
from dra_devcluster.cluster import node_object
from dra_node_agent.publisher import SlicePublisher, chunk_pool
from dra_node_agent.simulated.discovery import Profile, SimulatedBackend, load_profile

REPO = Path(__file__).resolve().parent.parent
GROUP, VERSION = "resource.k8s.io", "v1"
PROFILE = "h100-80gb-x8"
PHASES = ("startup", "steady", "burst", "rss", "kubectl", "takeover", "scheduler", "simulate")
GO_WRITER_CLASS = "scale-go-writer"
"""The class of go_writer's claims: one no operator allocates, so it can run beside them."""
DeviceID = tuple[str, str, str]


@dataclass(frozen=True)
class ScaleConfig:
    nodes: int
    node_prefix: str = "scale-node"
    namespace_prefix: str = "scale"
    driver: str = GPU_DRIVER
    gpu_class: str = GPU_CLASS
    tpu_class: str = TPU_CLASS
    profile: str = PROFILE
    concurrency: int = 32
    """Nodes created, and pools published, at once."""
    verify_index: bool = False
    """The operators compare their placer's index with their model after every event (tests)."""
    operator_args: tuple[str, ...] = ()
    timeout_s: float = 900.0
    """How long any one wait may take (creating the cluster, a phase's allocations)."""

    def node_names(self) -> list[str]:
        return [f"{self.node_prefix}-{i:05d}" for i in range(self.nodes)]

    def namespace(self, phase: str) -> str:
        return f"{self.namespace_prefix}-{phase}"


@dataclass(frozen=True)
class Target:
    limit: float
    text: str


TARGETS = {
    "startup_s": Target(15.0, "<= 15 s"),
    "takeover_s": Target(15.0, "<= 15 s"),
    "rss_claims_mib": Target(500.0, "<= 500 MiB"),
    "steady_p99_s": Target(1.0, "<= 1 s"),
    "cpu_vs_go": Target(2.0, "<= 2x"),
    "kubectl_devices_s": Target(5.0, "<= 5 s"),
    "kubectl_claims_s": Target(5.0, "<= 5 s"),
}
"""The issue's targets, for 5,000 nodes on a 2-core machine."""


@dataclass
class Figure:
    key: str
    what: str
    value: float | None
    unit: str
    note: str = ""

    def text(self) -> str:
        if self.value is None:
            return "-"
        if self.unit == "x":
            return f"{self.value:.2f}x"
        if self.unit in ("%", "claims/s", "pods/s", "/s"):
            return f"{self.value:.0f} {self.unit}"
        if self.unit == "MiB":
            return f"{self.value:.0f} MiB"
        if self.unit == "ms":
            return f"{self.value:.2f} ms"
        if self.unit == "":
            return f"{self.value:.0f}"
        return f"{self.value:.2f} {self.unit}"


@dataclass
class Report:
    figures: list[Figure] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Behaviour that went wrong: claims allocated twice or never, double booking, model drift."""

    def add(self, key: str, what: str, value: float | None, unit: str, note: str = "") -> None:
        figure = Figure(key, what, value, unit, note)
        self.figures.append(figure)
        print(f"  {what}: {figure.text()}" + (f" ({note})" if note else ""), flush=True)

    def table(self, *, nodes: int) -> str:
        rows = [("figure", "value", "target (5,000 nodes, 2 cores)", "met", "note")]
        for f in self.figures:
            target = TARGETS.get(f.key)
            met = "" if target is None or f.value is None else ("yes" if f.value <= target.limit else "NO")
            rows.append((f.what, f.text(), target.text if target else "", met, f.note))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [f"figures at {nodes} nodes x 8 GPUs"]
        for r in rows:
            lines.append("  ".join(r[i].ljust(widths[i]) for i in range(4)) + ("  " + r[4] if r[4] else ""))
        if self.problems:
            lines.append(f"behaviour problems ({len(self.problems)}):")
            lines += [f"  {p}" for p in self.problems[:30]]
        else:
            lines.append("behaviour: no problems found")
        return "\n".join(lines)


# ---- the cluster ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Populated:
    nodes: int
    slices: int
    devices: int
    nodes_s: float
    slices_s: float


def discover_node(*, profile: Profile, node: str, driver: str, root: Path) -> list[dict[str, Any]]:
    """The devices the agent would publish for ``node``: simulated discovery of ``profile`` (its
    fake hardware written under ``root``, removed after). Blocking: run it in a thread."""
    state = Path(tempfile.mkdtemp(prefix=f"{node}-", dir=root))
    try:
        backend = SimulatedBackend(profile=profile, node_name=node, state_dir=state, driver=driver)
        inventory = backend.discover_sync()
    finally:
        shutil.rmtree(state, ignore_errors=True)
    if inventory.counter_sets:
        raise ValueError(
            f"profile {profile.name} has shared counters; the scale bench publishes devices only"
        )
    return inventory.slice_devices()


async def _create_node(core: Any, name: str, *, kubelet_version: str) -> None:
    body = node_object(name, kubelet_version=kubelet_version)
    try:
        created: Any = await core.create_node(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        return  # left by an earlier run: its status was written then
    if not (created.status and created.status.conditions):
        # An API server that drops the status on create: write it as a kubelet would.
        await core.patch_node_status(name, {"status": body["status"]})


async def populate(
    api: client.ApiClient, config: ScaleConfig, *, kubelet_version: str, workdir: Path
) -> Populated:
    """Create the Node objects, then publish every node's pool with the agent's publisher."""
    core: Any = client.CoreV1Api(api)
    names = config.node_names()
    started = time.monotonic()
    await bounded([_create_node(core, n, kubelet_version=kubelet_version) for n in names], config.concurrency)
    nodes_s = time.monotonic() - started
    api_version = await preferred_resource_version(api)
    profile = load_profile(config.profile)
    root = Path(tempfile.mkdtemp(prefix="hardware-", dir=workdir))
    slices = devices = 0

    async def publish(node: str) -> None:
        nonlocal slices, devices
        found = await asyncio.to_thread(
            discover_node, profile=profile, node=node, driver=config.driver, root=root
        )
        publisher = SlicePublisher(api=api, driver=config.driver, node_name=node, api_version=api_version)
        await publisher.publish(found, [])
        devices += len(found)
        slices += len(chunk_pool(found))

    started = time.monotonic()
    try:
        await bounded([publish(n) for n in names], config.concurrency)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return Populated(
        nodes=len(names), slices=slices, devices=devices, nodes_s=nodes_s, slices_s=time.monotonic() - started
    )


# ---- reading the API ------------------------------------------------------------------------


def device_ids(claim: dict[str, Any]) -> list[DeviceID]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [
        (r["driver"], r["pool"], r["device"]) for r in (allocation.get("devices") or {}).get("results") or []
    ]


async def list_claims(custom: Any, namespace: str | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cont: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": 1000, **({"_continue": cont} if cont else {})}
        if namespace is None:
            page = await custom.list_cluster_custom_object(GROUP, VERSION, "resourceclaims", **kwargs)
        else:
            page = await custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", **kwargs
            )
        items += page.get("items") or []
        cont = (page.get("metadata") or {}).get("continue")
        if not cont:
            return items


def allocated_devices(claims: Sequence[dict[str, Any]], driver: str, *, pools: Set[str] | None = None) -> int:
    """Devices of ``driver`` (in ``pools``, when given) that the claims hold."""
    return sum(
        1 for c in claims for d in device_ids(c) if d[0] == driver and (pools is None or d[1] in pools)
    )


async def model_mismatches(instance: Instance, custom: Any, *, driver: str, devices: int) -> list[str]:
    """Where the instance's model, as its metrics count it, differs from the API: the devices it
    knows of ``driver`` (``devices`` published), the devices of ``driver`` it counts as allocated
    (by anyone), and the claims it counts as allocated by the operator (allocation and its
    finalizer, not being deleted). Empty when they agree."""
    claims = await list_claims(custom)
    want = {
        "devices published": float(devices),
        "devices allocated": float(allocated_devices(claims, driver)),
        "claims allocated by the operator": float(
            sum(
                1
                for c in claims
                if device_ids(c)
                and OPERATOR_FINALIZER in (c["metadata"].get("finalizers") or [])
                and not c["metadata"].get("deletionTimestamp")
            )
        ),
    }
    have = {
        "devices published": await asyncio.to_thread(
            instance.metric, "dra_operator_devices", f'driver="{driver}"'
        ),
        "devices allocated": await asyncio.to_thread(
            instance.metric, "dra_operator_devices_allocated", f'driver="{driver}"'
        ),
        "claims allocated by the operator": await asyncio.to_thread(
            instance.metric, "dra_operator_claims", 'state="allocated_by_operator"'
        ),
    }
    return [
        f"{what}: the API says {want[what]:.0f}, {instance.name}'s model {have[what]}"
        for what in want
        if have[what] != want[what]
    ]


class Bindings:
    """Pods of one namespace, and when each was first seen bound (``spec.nodeName``), from a watch."""

    def __init__(self, core: Any, ns: str, expected: int) -> None:
        self.core, self.ns, self.expected = core, ns, expected
        self.bound: dict[str, float] = {}
        self.done = asyncio.Event()

    def seen(self, obj: Any) -> None:
        if obj.spec.node_name and obj.metadata.name not in self.bound:
            self.bound[obj.metadata.name] = time.monotonic()
            if len(self.bound) >= self.expected:
                self.done.set()

    async def watch(self) -> None:
        while not self.done.is_set():
            listing = await self.core.list_namespaced_pod(self.ns)
            for pod in listing.items:
                self.seen(pod)
            async with watch.Watch().stream(
                self.core.list_namespaced_pod,
                self.ns,
                resource_version=listing.metadata.resource_version,
                timeout_seconds=60,
            ) as stream:
                async for event in stream:
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.seen(event["object"])
                    if self.done.is_set():
                        return


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[int(share * (len(ordered) - 1))]


def log_time(log: Path, text: str, *, after: float = 0.0) -> float | None:
    """The wall-clock time (epoch seconds) of the first line of an operator log, at or after
    ``after``, that contains ``text``; the log's times are the operator's local time, to the ms."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        if text not in line:
            continue
        match = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ", line)
        if match is None:
            continue
        stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
        stamp += int(match.group(2)) / 1000
        if stamp >= after - 0.001:
            return stamp
    return None


# ---- the benchmark ----------------------------------------------------------------------------


@dataclass
class Takeover:
    takeover_s: float
    active_after_s: float | None
    list_s: float | None
    apply_s: float | None
    claims: list[str]
    standby_rss_mib: float


class Scale:
    """One cluster, its operators and the phases run on it."""

    def __init__(
        self,
        *,
        cluster: LocalCluster,
        api: client.ApiClient,
        config: ScaleConfig,
        workdir: Path,
        operator_kubeconfig: Path | None = None,
        client_kubeconfig: Path | None = None,
    ) -> None:
        self.cluster, self.api, self.config, self.workdir = cluster, api, config, workdir
        self.operator_kubeconfig = operator_kubeconfig
        self.client_kubeconfig = client_kubeconfig or cluster.kubeconfig
        self.custom: Any = client.CustomObjectsApi(api)
        self.core: Any = client.CoreV1Api(api)
        self.instances: list[Instance] = []
        self.report = Report()
        self.devices = 0
        self.namespaces: set[str] = set()
        self.burst_rate: float | None = None

    # -- set-up -----------------------------------------------------------------------------

    def install_peering(self) -> None:
        c = self.cluster
        c.kubectl("apply", "-f", str(REPO / "crds" / "clusterkopfpeerings.kopf.dev.yaml"))
        c.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev", "--timeout=60s")
        c.kubectl("apply", "-f", str(REPO / "manifests" / "base" / "operator-peering.yaml"))

    async def populate(self) -> Populated:
        done = await populate(
            self.api, self.config, kubelet_version=self.cluster.kubernetes.version, workdir=self.workdir
        )
        self.devices = done.devices
        return done

    async def namespace(self, phase: str) -> str:
        ns = self.config.namespace(phase)
        if ns not in self.namespaces:
            with contextlib.suppress(ApiException):
                await self.core.create_namespace({"metadata": {"name": ns}})
            self.namespaces.add(ns)
        return ns

    def start_operator(self, name: str, *, priority: int) -> Instance:
        cfg = self.config
        inst = Instance(
            cluster=self.cluster,
            config=FailoverConfig(
                namespace="",
                gpu_class=cfg.gpu_class,
                tpu_class=cfg.tpu_class,
                driver=cfg.driver,
                nodes=(),
                extra_args=cfg.operator_args,
            ),
            workdir=self.workdir,
            name=name,
            priority=priority,
            kubeconfig=self.operator_kubeconfig,
            verify_index=cfg.verify_index,
        )
        self.instances.append(inst)
        return inst

    def running(self) -> list[Instance]:
        return [i for i in self.instances if i.proc.poll() is None]

    async def wait(
        self,
        what: str,
        check: Callable[[], Awaitable[bool]],
        *,
        interval: float = 0.5,
        within: float | None = None,
    ) -> None:
        """Wait until ``check`` says True, at most ``within`` seconds (default: the config's); an
        operator that exits with an error (not SIGKILLed by the run) ends the wait at once."""
        limit = self.config.timeout_s if within is None else within
        deadline = time.monotonic() + limit
        while not await check():
            for inst in self.instances:
                if inst.proc.poll() is not None and inst.proc.returncode not in (0, -signal.SIGKILL):
                    raise RuntimeError(
                        f"operator {inst.name} exited with {inst.proc.returncode}:\n{inst.tail()}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {limit:.0f} s for {what}")
            await asyncio.sleep(interval)

    async def active(self) -> Instance:
        """The one running instance that says it is active (waits for it)."""
        found: list[Instance] = []

        async def one_active() -> bool:
            found.clear()
            for inst in self.running():
                if await asyncio.to_thread(inst.metric, "dra_operator_active") == 1.0:
                    found.append(inst)
            return len(found) == 1

        await self.wait("one active operator", one_active)
        return found[0]

    async def free_devices(self) -> int:
        """The run's devices that no claim holds."""
        claims = await list_claims(self.custom)
        return self.devices - allocated_devices(
            claims, self.config.driver, pools=set(self.config.node_names())
        )

    async def create_claims(self, ns: str, names: Sequence[str], *, count: int = 1) -> None:
        def body(name: str) -> dict[str, Any]:
            obj = gpu_claim(name, ns, self.config.gpu_class)
            if count != 1:
                obj["spec"]["devices"]["requests"][0]["exactly"]["count"] = count
            return obj

        await bounded(
            [
                self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "resourceclaims", body(n))
                for n in names
            ],
            50,
        )

    async def clear_claims(self, ns: str) -> float:
        """Delete the namespace's claims and wait until they are gone (the active operator removes
        its finalizer from each); returns the seconds it took."""
        started = time.monotonic()
        # Deleting 20,000 claims takes the API server longer than its request timeout (504): it
        # deletes what it can in the time, so the request is repeated until it completes.
        for _ in range(30):
            try:
                await self.custom.delete_collection_namespaced_custom_object(
                    GROUP, VERSION, ns, "resourceclaims"
                )
                break
            except ApiException as exc:
                if exc.status != 504:
                    raise

        async def gone() -> bool:
            return not await list_claims(self.custom, ns)

        await self.wait(f"the claims of {ns} deleted", gone, interval=1.0)
        return time.monotonic() - started

    async def wait_allocated(self, ns: str, names: Sequence[str]) -> list[dict[str, Any]]:
        """Wait until every claim of ``names`` is allocated; the namespace's claims then."""
        items: list[dict[str, Any]] = []
        waiting: list[str] = []

        async def all_allocated() -> bool:
            nonlocal items, waiting
            items = await list_claims(self.custom, ns)
            by_name = {c["metadata"]["name"]: c for c in items}
            waiting = [n for n in names if n not in by_name or not device_ids(by_name[n])]
            return not waiting

        try:
            await self.wait(f"the claims of {ns} allocated", all_allocated, interval=1.0)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; {len(waiting)} not allocated: {', '.join(waiting[:10])}") from None
        return items

    def check_once(
        self, ns: str, names: Sequence[str], claims: list[dict[str, Any]], *, killed_at: float | None = None
    ) -> int:
        """Every claim of ``names`` allocated exactly once (one "allocated" line over all the
        operators' logs, or none for one the instance SIGKILLed at ``killed_at`` wrote as it died:
        see :func:`once_problems`), no device in two claims. Returns how many were of the latter."""
        self.report.problems += double_booked(claims)
        counts = allocation_counts([i.log for i in self.instances], ns)
        problems, silent = once_problems(claims, names, counts, killed_at=killed_at)
        self.report.problems += [f"claim {ns}/{p.removeprefix('claim ')}" for p in problems]
        return silent

    # -- phases -----------------------------------------------------------------------------

    async def startup(self) -> Instance:
        """Start the operator with a claim waiting; the time to its first allocation."""
        ns = await self.namespace("startup")
        await self.create_claims(ns, ["probe"])
        started = time.time()
        inst = self.start_operator(f"{self.config.namespace_prefix}-a", priority=2_000_000)

        async def allocated() -> bool:
            return (await asyncio.to_thread(inst.metric, "dra_operator_allocations_total") or 0) > 0

        await self.wait("the operator's first allocation", allocated, interval=0.02)
        first = time.time() - started
        became = log_time(inst.log, "this instance is now active", after=started)
        list_s = inst.metric("dra_operator_model_sync_duration_seconds", 'phase="list"')
        apply_s = inst.metric("dra_operator_model_sync_duration_seconds", 'phase="apply"')
        r = self.report
        r.add("startup_s", "start-up: process start to first allocation", first, "s")
        r.add(
            "startup_active_s",
            "  process start to active (peering)",
            None if became is None else became - started,
            "s",
        )
        if list_s is not None and apply_s is not None:
            r.add(
                "startup_list_s",
                "  initial listing (in pages, each into the model as it comes)",
                list_s,
                "s",
                f"{100 * list_s / first:.0f} % of the start-up; into the model {apply_s:.2f} s more",
            )
        slices = len(await self.slices())

        async def kopf_listed() -> bool:
            seen = await asyncio.to_thread(
                inst.metric, "dra_operator_watch_events_total", 'resource="resourceslices"'
            )
            return (seen or 0) >= slices

        await self.wait("Kopf's watch to list every slice", kopf_listed)
        r.add(
            "startup_kopf_s",
            "  process start to Kopf's watches having listed every slice",
            time.time() - started,
            "s",
        )
        await asyncio.sleep(3.0)
        r.add("rss_loaded_mib", "operator RSS, cluster loaded, no claims", rss_mib(inst.proc.pid), "MiB")
        await self.clear_claims(ns)
        return inst

    async def slices(self) -> list[dict[str, Any]]:
        page = await self.custom.list_cluster_custom_object(
            GROUP, VERSION, "resourceslices", field_selector=f"spec.driver={self.config.driver}"
        )
        items: list[dict[str, Any]] = page.get("items") or []
        return items

    async def steady(self, *, rate: float, seconds: float) -> None:
        ns = await self.namespace("steady")
        count = min(int(rate * seconds), await self.free_devices())
        run = Run(self.custom, ns, count, cls=self.config.gpu_class)
        watcher = asyncio.create_task(run.watch())
        await asyncio.sleep(1.0)

        async def one(name: str) -> None:
            await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "resourceclaims", gpu_claim(name, ns, self.config.gpu_class)
            )
            run.created[name] = time.monotonic()

        tasks = []
        started = time.monotonic()
        for i in range(count):
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(f"c{i:04d}")))
        await asyncio.gather(*tasks)
        offered = count / (time.monotonic() - started)
        await asyncio.wait_for(run.done.wait(), timeout=self.config.timeout_s)
        watcher.cancel()
        latencies = [run.allocated[n] - run.created[n] for n in run.allocated]
        r = self.report
        note = f"{count} claims at {offered:.1f}/s"
        r.add(
            "steady_p50_s",
            f"steady {rate:g} claims/s: creation to allocation p50",
            statistics.median(latencies),
            "s",
            note,
        )
        r.add(
            "steady_p99_s",
            f"steady {rate:g} claims/s: creation to allocation p99",
            percentile(latencies, 0.99),
            "s",
        )
        await self.clear_claims(ns)

    async def burst(self, *, claims: int, go: bool, operator: Instance) -> None:
        ns = await self.namespace("burst")
        count = min(claims, await self.free_devices())
        meter = CpuMeter(self.cluster)
        run = Run(self.custom, ns, count, cls=self.config.gpu_class)
        window = await measure_burst(
            self.api, meter, run, claims=count, pid=operator.proc.pid, name="operator"
        )
        total = max(run.allocated.values()) - window.start
        latencies = [run.allocated[n] - run.created[n] for n in run.allocated]
        cpu_ms = 1000 * window.cpu["operator"] / count
        self.burst_rate = count / total
        r = self.report
        note = f"{count} claims created in {window.created_in:.1f} s"
        r.add("burst_rate", f"burst of {count}: operator claims/s", self.burst_rate, "claims/s", note)
        r.add(
            "burst_p50_s", f"burst of {count}: creation to allocation p50", statistics.median(latencies), "s"
        )
        r.add(
            "burst_p99_s", f"burst of {count}: creation to allocation p99", percentile(latencies, 0.99), "s"
        )
        r.add("cpu_operator_ms", "operator CPU per allocated claim (burst)", cpu_ms, "ms")
        await self.clear_claims(ns)
        if not go or self.operator_kubeconfig is None:
            return
        binary, _ = gobuild.build("go_writer")
        go_rate, go_ms = await compiled_run(
            self.api,
            meter,
            binary=binary,
            kubeconfig=self.operator_kubeconfig,
            protobuf=False,
            claims=count,
            allocatable=count,
            gpus=8,
            writes=8,
            cls=GO_WRITER_CLASS,
        )
        r.add(
            "cpu_go_ms",
            "go_writer CPU per allocated claim (same burst)",
            go_ms,
            "ms",
            f"{go_rate:.0f} claims/s",
        )
        r.add("cpu_vs_go", "operator CPU per claim / go_writer's", cpu_ms / go_ms, "x")
        # Its allocations name devices of made-up pools of the same driver: gone before the
        # next phase counts what is free.
        await self.core.delete_namespace("bench-go-json")

        async def go_claims_gone() -> bool:
            try:
                await self.core.read_namespace("bench-go-json")
            except ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            return False

        await self.wait("go_writer's namespace deleted", go_claims_gone, interval=1.0)

    async def rss(self, *, claims: int, operator: Instance) -> str:
        ns = await self.namespace("rss")
        # These claims stay through the takeover, whose claims need free devices of their own.
        count = max(0, min(claims, await self.free_devices() - TAKEOVER_ROOM))
        run = Run(self.custom, ns, count, cls=self.config.gpu_class)
        watcher = asyncio.create_task(run.watch())
        await asyncio.sleep(1.0)
        started = time.monotonic()
        created_in = await run.create(count)
        await asyncio.wait_for(run.done.wait(), timeout=self.config.timeout_s)
        watcher.cancel()
        allocated_in = max(run.allocated.values()) - started
        await asyncio.sleep(5.0)
        note = f"created in {created_in:.0f} s, all allocated after {allocated_in:.0f} s"
        self.report.add(
            "rss_claims_mib",
            f"operator RSS with {count} claims allocated",
            rss_mib(operator.proc.pid),
            "MiB",
            note,
        )
        return ns

    async def kubectl_dra(self) -> None:
        """``kubectl dra devices`` and ``kubectl dra claims -A``, run as a user runs them."""
        claims = len(await list_claims(self.custom))
        for command, args in (("devices", ()), ("claims", ("-A",))):
            out = self.workdir / f"kubectl-dra-{command}.txt"
            argv = [
                sys.executable,
                "-m",
                "dra_operator.kubectl_dra.cli",
                command,
                *args,
                f"--kubeconfig={self.client_kubeconfig}",
            ]
            started = time.monotonic()
            result = await asyncio.to_thread(_run, argv, out)
            seconds = time.monotonic() - started
            if result not in (0, None):
                self.report.problems.append(f"kubectl dra {command} exited with {result} (see {out})")
            lines = len(out.read_text(errors="replace").splitlines())
            self.report.add(
                f"kubectl_{command}_s",
                f"kubectl dra {command}{' -A' if args else ''}",
                None if result is None else seconds,
                "s",
                f"{lines} lines; {claims} claims in the cluster" + _stopped(result),
            )

    async def takeover(self, *, feed_interval: float = 0.5) -> Takeover:
        """A standby joins; the active instance is SIGKILLed while claims keep arriving; the time
        to the standby's first allocation. Then every claim must be allocated exactly once, no
        device twice, and the new active instance's model must match the API."""
        old = await self.active()
        letter = chr(ord("a") + len(self.instances))
        standby = self.start_operator(
            f"{self.config.namespace_prefix}-{letter}", priority=1_000_000 - len(self.instances)
        )
        claims_now = len(await list_claims(self.custom))

        async def warm() -> bool:
            # The standby lists the cluster at start and its watches keep the model current.
            active = await asyncio.to_thread(standby.metric, "dra_operator_active")
            synced = await asyncio.to_thread(standby.metric, "dra_operator_model_synced")
            held = await asyncio.to_thread(standby.metric, "dra_operator_claims")
            return active == 0.0 and synced == 1.0 and held is not None and held >= claims_now

        await self.wait("the second instance standing by", warm)
        await asyncio.sleep(2.0)
        standby_rss = rss_mib(standby.proc.pid)
        ns = await self.namespace("takeover")
        names: list[str] = []
        stop = asyncio.Event()

        async def feed() -> None:
            while not stop.is_set():
                names.append(f"t{len(names):04d}")
                await self.create_claims(ns, names[-1:])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), feed_interval)

        feeding = asyncio.create_task(feed())
        await asyncio.sleep(2.0)
        base = await asyncio.to_thread(standby.metric, "dra_operator_allocations_total") or 0.0
        killed = time.time()
        old.signal(signal.SIGKILL)

        async def moved() -> bool:
            value = await asyncio.to_thread(standby.metric, "dra_operator_allocations_total")
            return value is not None and value > base

        await self.wait("the standby's first allocation", moved, interval=0.02)
        takeover_s = time.time() - killed
        await asyncio.sleep(2.0)
        stop.set()
        await feeding
        old.proc.wait(timeout=60)
        became = log_time(standby.log, "this instance is now active", after=killed)
        result = Takeover(
            takeover_s=takeover_s,
            active_after_s=None if became is None else became - killed,
            list_s=standby.metric("dra_operator_model_sync_duration_seconds", 'phase="list"'),
            apply_s=standby.metric("dra_operator_model_sync_duration_seconds", 'phase="apply"'),
            claims=list(names),
            standby_rss_mib=standby_rss,
        )
        await self.wait_allocated(ns, names)
        silent = self.check_once(ns, names, await list_claims(self.custom), killed_at=killed)
        mismatches: list[str] = []

        async def consistent() -> bool:
            nonlocal mismatches
            mismatches = await model_mismatches(
                standby, self.custom, driver=self.config.driver, devices=self.devices
            )
            return not mismatches

        try:
            await self.wait("the new active instance's model to match the API", consistent, interval=1.0)
        except TimeoutError:
            self.report.problems += [f"after the takeover: {m}" for m in mismatches]
        r = self.report
        r.add("standby_rss_mib", f"standby RSS ({claims_now} claims in the cluster)", standby_rss, "MiB")
        r.add(
            "takeover_s",
            "takeover: SIGKILL to the standby's first allocation",
            takeover_s,
            "s",
            f"{len(names)} claims fed meanwhile",
        )
        r.add(
            "takeover_active_s",
            "  SIGKILL to the standby active (peering lifetime 12 s)",
            result.active_after_s,
            "s",
        )
        if result.active_after_s is not None:
            r.add(
                "takeover_catchup_s",
                "  active to first allocation (no listing: the standby's watches kept its model)",
                takeover_s - result.active_after_s,
                "s",
            )
        if result.list_s is not None and result.apply_s is not None:
            r.add(
                "standby_list_s",
                "  the standby's own listing at its start (before the kill, not in the takeover)",
                result.list_s,
                "s",
                f"into the model {result.apply_s:.2f} s more",
            )
        r.add(
            "takeover_written_as_killed",
            "  claims the killed instance wrote as it died (allocated, never logged)",
            float(silent),
            "",
        )
        r.add("takeover_model", "  model vs API after the takeover: mismatches", float(len(mismatches)), "")
        return result

    async def scheduler(self, *, pods: int, note: str = "") -> None:
        """Pods with a claim template and no nodeName, all at once: kube-scheduler's binding rate."""
        ns = await self.namespace("scheduler")
        count = min(pods, await self.free_devices())
        await self.custom.create_namespaced_custom_object(
            GROUP, VERSION, ns, "resourceclaimtemplates", claim_template(ns, self.config.gpu_class)
        )
        bindings = Bindings(self.core, ns, count)
        watcher = asyncio.create_task(bindings.watch())
        await asyncio.sleep(1.0)
        started = time.monotonic()
        await bounded(
            [
                self.core.create_namespaced_pod(ns, template_pod(f"p{i:05d}", ns, labels={"scale": "pod"}))
                for i in range(count)
            ],
            50,
        )
        created_in = time.monotonic() - started
        await asyncio.wait_for(bindings.done.wait(), timeout=self.config.timeout_s)
        watcher.cancel()
        times = sorted(bindings.bound.values())
        total = times[-1] - started
        flowing = (count - 1) / (times[-1] - times[0]) if count > 1 and times[-1] > times[0] else None
        r = self.report
        r.add(
            "scheduler_rate",
            f"kube-scheduler: {count} pods with claim templates bound",
            count / total,
            "pods/s",
            f"created in {created_in:.1f} s; {note}upstream scheduler_perf at 500 nodes: 40-64 pods/s",
        )
        r.add("scheduler_flowing_rate", "  from the first binding to the last", flowing, "pods/s")
        if self.burst_rate is not None:
            r.add(
                "scheduler_vs_operator",
                "  operator's standalone claims/s (burst) / scheduler's pods/s",
                self.burst_rate / (count / total),
                "x",
            )
        await self.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)

        async def gone() -> bool:
            left = await self.core.list_namespaced_pod(ns)
            return not left.items and not await list_claims(self.custom, ns)

        await self.wait("the scheduler phase's pods and claims deleted", gone, interval=1.0)

    async def simulate(self) -> None:
        """``dra-operator simulate`` of one claim against the exported cluster, JSON and YAML."""
        claim = self.workdir / "simulate-claim.json"
        claim.write_text(json.dumps(gpu_claim("what-if", "default", self.config.gpu_class)))
        for output in ("json", "yaml"):
            exported = self.workdir / f"cluster.{output}"
            started = time.monotonic()
            rc = await asyncio.to_thread(
                _run,
                [
                    "kubectl",
                    f"--kubeconfig={self.client_kubeconfig}",
                    "get",
                    "deviceclasses,resourceslices,nodes",
                    "-o",
                    output,
                ],
                exported,
            )
            export_s = time.monotonic() - started
            if rc != 0:
                self.report.problems.append(f"kubectl get -o {output} exited with {rc}{_stopped(rc)}")
                continue
            out = self.workdir / f"simulate-{output}.txt"
            started = time.monotonic()
            rc = await asyncio.to_thread(
                _run,
                [
                    sys.executable,
                    "-m",
                    "dra_operator.entry.cli",
                    "simulate",
                    "-f",
                    str(exported),
                    "-f",
                    str(claim),
                    "-o",
                    "table",
                ],
                out,
            )
            seconds = time.monotonic() - started
            if rc not in (0, None):
                self.report.problems.append(
                    f"simulate on the {output.upper()} export exited with {rc} (see {out})"
                )
            size = exported.stat().st_size / 2**20
            self.report.add(
                f"simulate_{output}_s",
                f"simulate one claim against the {output.upper()} export",
                None if rc is None else seconds,
                "s",
                f"{size:.1f} MiB exported in {export_s:.1f} s" + _stopped(rc),
            )

    async def fill(self, operator: Instance, *, extra: int = 2) -> None:
        """Fill the cluster through ``operator``'s model: a whole-node claim for every node the API
        shows free, then single-GPU claims for what is left, then ``extra`` single-GPU claims and
        one whole-node claim that cannot fit. A device the model took for free while a claim
        holds it would be double-booked; one it took for held while free would leave a claim
        waiting beside a free device. Problems go to the report: a claim not allocated exactly
        once, a device in two claims, devices left free, an extra claim allocated."""
        ns = await self.namespace("fill")
        pools = self.config.node_names()
        per_node = self.devices // len(pools)
        used: dict[str, int] = {}
        for claim in await list_claims(self.custom):
            for driver, pool, _ in device_ids(claim):
                if driver == self.config.driver:
                    used[pool] = used.get(pool, 0) + 1
        whole = [f"w{i:05d}" for i, _ in enumerate(p for p in pools if used.get(p, 0) == 0)]
        singles = [
            f"s{i:05d}" for i in range(sum(per_node - used.get(p, 0) for p in pools if used.get(p, 0)))
        ]
        await self.create_claims(ns, whole, count=per_node)
        await self.wait_allocated(ns, whole)
        await self.create_claims(ns, singles)
        await self.wait_allocated(ns, singles)
        extras = [f"x{i}" for i in range(extra)]
        failures = await asyncio.to_thread(operator.metric, "dra_operator_allocation_failures_total") or 0.0
        await self.create_claims(ns, extras)
        await self.create_claims(ns, ["x-whole"], count=per_node)

        async def judged() -> bool:
            # Each extra claim tried and found no room (a failure counted per attempt).
            now = await asyncio.to_thread(operator.metric, "dra_operator_allocation_failures_total")
            return now is not None and now >= failures + extra + 1

        await self.wait("the extra claims found no room", judged)
        claims = await list_claims(self.custom)
        self.check_once(ns, [*whole, *singles], claims)
        mine = {c["metadata"]["name"]: c for c in claims if c["metadata"]["namespace"] == ns}
        for name in [*extras, "x-whole"]:
            if device_ids(mine.get(name, {})):
                self.report.problems.append(f"claim {ns}/{name} was allocated on a full cluster")
        held = allocated_devices(claims, self.config.driver, pools=set(pools))
        if held != self.devices:
            self.report.problems.append(
                f"{held} of {self.devices} devices allocated after filling the cluster"
            )

    # -- clean-up (tests share their cluster) ----------------------------------------------------

    async def clean_up(self) -> None:
        """Delete what the run made: its claims (while an operator still runs to release them),
        the operators, the Nodes and their slices, the namespaces and the operators' classes."""
        for ns in sorted(self.namespaces):
            with contextlib.suppress(Exception):
                await self.custom.delete_collection_namespaced_custom_object(
                    GROUP, VERSION, ns, "resourceclaims"
                )
        with contextlib.suppress(Exception):
            await self.wait("the run's claims deleted", self._claims_gone, interval=1.0, within=120.0)
        for inst in self.instances:
            inst.stop()
        for ns in sorted(self.namespaces):
            # Left by an operator that stopped too soon: nothing holds the devices any more.
            for c in await list_claims(self.custom, ns):
                if c["metadata"].get("finalizers"):
                    with contextlib.suppress(ApiException):
                        await self.custom.patch_namespaced_custom_object(
                            GROUP,
                            VERSION,
                            ns,
                            "resourceclaims",
                            c["metadata"]["name"],
                            {"metadata": {"finalizers": None}},
                            _content_type="application/merge-patch+json",
                        )
        await bounded([self._delete_node(n) for n in self.config.node_names()], self.config.concurrency)
        # Owned by their Nodes, so the garbage collector would delete them too, in its own time.
        for item in await self.slices():
            with contextlib.suppress(ApiException):
                await self.custom.delete_cluster_custom_object(
                    GROUP, VERSION, "resourceslices", item["metadata"]["name"]
                )
        for ns in sorted(self.namespaces):
            with contextlib.suppress(ApiException):
                await self.core.delete_namespace(ns)
        for cls in (self.config.gpu_class, self.config.tpu_class):
            with contextlib.suppress(ApiException):
                await self.custom.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", cls)

        async def nodes_gone() -> bool:
            listing = await self.core.list_node(label_selector=None)
            ours = set(self.config.node_names())
            return not any(n.metadata.name in ours for n in listing.items) and not await self.slices()

        await self.wait("the run's Nodes and slices deleted", nodes_gone, interval=1.0)

    async def _claims_gone(self) -> bool:
        for ns in self.namespaces:
            if await list_claims(self.custom, ns):
                return False
        return True

    async def _delete_node(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            await self.core.delete_node(name)


COMMAND_TIMEOUT_S = 900.0


def _stopped(rc: int | None) -> str:
    return f"; stopped after {COMMAND_TIMEOUT_S:.0f} s" if rc is None else ""


def _run(argv: Sequence[str], out: Path) -> int | None:
    """Run a command with its output to ``out`` (stderr after stdout); its exit status, None when
    it ran past COMMAND_TIMEOUT_S and was stopped."""
    with out.open("wb") as f:
        try:
            return subprocess.run(
                argv, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, check=False, timeout=COMMAND_TIMEOUT_S
            ).returncode
        except subprocess.TimeoutExpired:
            return None


# ---- the command ------------------------------------------------------------------------------


async def bench(cluster: LocalCluster, args: argparse.Namespace, workdir: Path) -> Report:
    phases = [p for p in PHASES if p in args.phases]
    config = ScaleConfig(nodes=args.nodes, concurrency=args.concurrency)
    operator_kubeconfig, client_kubeconfig = service_account_kubeconfigs(cluster)
    if args.policy:
        apply_claim_finalizer_policy(cluster)
    api = await make_api_client(kubeconfig=client_kubeconfig)
    scale = Scale(
        cluster=cluster,
        api=api,
        config=config,
        workdir=workdir,
        operator_kubeconfig=operator_kubeconfig,
        client_kubeconfig=client_kubeconfig,
    )
    r = scale.report
    try:
        scale.install_peering()
        print(f"--- the cluster: {args.nodes} nodes x 8 GPUs (profile {PROFILE})", flush=True)
        done = await scale.populate()
        r.add("nodes_s", f"{done.nodes} Node objects created", done.nodes_s, "s")
        r.add(
            "slices_s",
            f"{done.slices} ResourceSlices ({done.devices} GPUs) published by the agent's publisher",
            done.slices_s,
            "s",
        )
        operator: Instance | None = None
        if "startup" in phases:
            print("--- startup", flush=True)
            operator = await scale.startup()
        else:
            operator = scale.start_operator("scale-a", priority=2_000_000)
        await scale.active()
        if "steady" in phases:
            print(f"--- steady: {args.rate:g} claims/s for {args.steady_s:g} s", flush=True)
            await scale.steady(rate=args.rate, seconds=args.steady_s)
        if "burst" in phases:
            print(f"--- burst: {args.burst} claims at once", flush=True)
            await scale.burst(claims=args.burst, go=args.go, operator=operator)
        rss_ns: str | None = None
        if "rss" in phases:
            print(f"--- rss: {args.claims_for_rss} claims", flush=True)
            rss_ns = await scale.rss(claims=args.claims_for_rss, operator=operator)
        if "kubectl" in phases:
            print("--- kubectl dra", flush=True)
            await scale.kubectl_dra()
        if "takeover" in phases:
            print("--- takeover: SIGKILL of the active instance", flush=True)
            await scale.takeover()
        if rss_ns is not None:
            count = len(await list_claims(scale.custom, rss_ns))
            seconds = await scale.clear_claims(rss_ns)
            r.add(
                "release_s",
                f"{count} claims deleted and released",
                seconds,
                "s",
                f"{count / seconds:.0f} claims/s",
            )
        if "scheduler" in phases:
            print(f"--- scheduler: {args.pods} pods with claim templates", flush=True)
            qps = (
                f"kube-scheduler QPS {args.scheduler_qps:g}"
                if args.scheduler_qps
                else "kube-scheduler QPS 50"
            )
            await scale.scheduler(
                pods=args.pods, note=f"controller-manager QPS {args.controller_manager_qps:g}, {qps}; "
            )
        if "simulate" in phases:
            print("--- simulate", flush=True)
            await scale.simulate()
    finally:
        for inst in scale.instances:
            inst.stop()
        await api.close()
    return r


TAKEOVER_ROOM = 200
"""Devices the ``rss`` phase leaves free for the claims fed during the takeover that follows."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument(
        "--phases",
        type=lambda text: [p.strip() for p in text.split(",") if p.strip()],
        default=list(PHASES),
        help=f"comma-separated, run in this order whichever order is given: {','.join(PHASES)} "
        "(default: all)",
    )
    parser.add_argument("--rate", type=float, default=50.0, help="claims/s in the steady phase")
    parser.add_argument(
        "--steady-s", type=float, default=60.0, help="how long the steady phase creates claims"
    )
    parser.add_argument("--burst", type=int, default=2000, help="claims created at once in the burst phase")
    parser.add_argument(
        "--claims-for-rss", type=int, default=20000, help="claims allocated for the RSS figure"
    )
    parser.add_argument(
        "--pods", type=int, default=1000, help="pods with claim templates in the scheduler phase"
    )
    parser.add_argument(
        "--concurrency", type=int, default=32, help="nodes created and pools published at once"
    )
    parser.add_argument(
        "--no-go", dest="go", action="store_false", help="leave out bench/go_writer (needs `go`)"
    )
    parser.add_argument(
        "--no-policy", dest="policy", action="store_false", help="leave out the claim finalizer policy"
    )
    parser.add_argument(
        "--controller-manager-qps",
        type=float,
        default=100.0,
        help="kube-controller-manager's --kube-api-qps (burst twice that); at its default, 20, its "
        "claim controller (a claim and a pod status per pod) holds pods with claim templates to about "
        "10 a second",
    )
    parser.add_argument(
        "--scheduler-qps",
        type=float,
        help="kube-scheduler's --kube-api-qps (burst twice that; default: its own, 50)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    unknown = set(args.phases) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    workdir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    started = time.monotonic()
    qps = args.controller_manager_qps
    component_args = {"kube-controller-manager": [f"--kube-api-qps={qps:g}", f"--kube-api-burst={2 * qps:g}"]}
    if args.scheduler_qps is not None:
        qps = args.scheduler_qps
        component_args["kube-scheduler"] = [f"--kube-api-qps={qps:g}", f"--kube-api-burst={2 * qps:g}"]
    cluster = LocalCluster(
        workdir=workdir / "cluster", kubernetes=resolve_kubernetes_version(), component_args=component_args
    )
    with cluster:
        os.environ.pop("KUBECONFIG", None)
        report = asyncio.run(bench(cluster, args, workdir))
    print()
    print(report.table(nodes=args.nodes))
    print(f"wall time {time.monotonic() - started:.0f} s; operator logs and outputs in {workdir}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "nodes": args.nodes,
                    "figures": [asdict(f) for f in report.figures],
                    "problems": report.problems,
                },
                indent=1,
            )
        )
    if report.problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
