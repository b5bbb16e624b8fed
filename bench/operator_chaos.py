"""Chaos soak: the operator and kube-scheduler allocate the same GPUs while everything churns.

Standalone claims (allocated by the operator) and pods with claim templates (allocated by
kube-scheduler) are created and deleted continuously on a few nodes of simulated GPUs, pods are
force-deleted, and the operator is SIGKILLed and started again at random moments. Then the churn
stops, the operator is left running, and the cluster must settle.

Two allocators writing different claims can both take one device: the API server cannot order
them. kube-scheduler and the operator do so now and then under this churn (seen in soak runs: "device
... is allocated to chaos/c50 and chaos/p54-gpu-...; releasing ours"), but not on cue. So, as the
churn ends, the driver plays the scheduler's side of that race once (``race_at_end``): it writes a
device the operator allocated into a waiting pod's claim, as a scheduler with a stale cache would,
and the operator must give up its copy and place its claim elsewhere. The settle period starts
from there. Before staging it, the driver force-deletes the other pending pods: kube-scheduler keeps
allocated devices in a set, so once the operator releases its copy the scheduler counts the device
free although the pod's claim holds it (until it lists claims again), and a pending pod could be
given it. That is a limit of running two allocators, which only avoiding the race cures; this test
is about the operator. What is checked:

- no device is ever allocated to two claims (sampled during the churn, and at the end);
- every claim that fits is allocated (all GPUs allocated, or no claim left waiting);
- no claim holds the operator's finalizer without an allocation, and none stays Terminating;
- the operator's log and CPU stay bounded: lines per API action over the run, and CPU seconds,
  log bytes and "placing again" lines in a quiet window after the settle.

The CI test (``tests/integration/operator/test_chaos.py``) runs a short version; this module's
``main`` is the long soak, which prints its figures:

    .venv/bin/python -m bench.operator_chaos [--nodes 4] [--gpus 8] [--minutes 10] [--seed 1]

Nothing here asserts on time: the settle is waited for with a generous timeout and reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api.kube import make_api_client
from dra_devcluster import LocalCluster
from dra_devcluster.cluster import free_port

GROUP, VERSION = "resource.k8s.io", "v1"
OPERATOR_FINALIZER = "dra.accel.dev/allocation"
REPLACING = "placing again"  # what the operator logs when it places a claim again
ALLOCATED = ": allocated "  # what it logs for each claim it allocates
DeviceID = tuple[str, str, str]


@dataclass(frozen=True)
class ChaosConfig:
    namespace: str
    gpu_class: str
    nodes: tuple[str, ...]
    gpus: int
    driver: str = "gpu.nvidia.com"
    """The GPUs' driver name: a test sharing its cluster with others gives the operator one of its
    own (``--gpu-driver``), so that its class matches only the chaos round's devices."""
    duration_s: float = 60.0
    actions_per_s: float = 8.0
    kill_every_s: tuple[float, float] = (4.0, 12.0)
    max_claims: int = 24
    """Upper bound on standalone claims plus pods existing at once (demand beyond the GPUs)."""
    force_delete_share: float = 0.5
    """Of pod deletions, the share made as `kubectl delete --grace-period=0 --force` does."""
    race_at_end: bool = True
    """Whether the driver plays kube-scheduler losing the race for a device as the churn ends."""
    settle_timeout_s: float = 180.0
    quiet_window_s: float = 10.0
    seed: int = 1
    at_least: Mapping[str, int] = field(default_factory=dict)
    """Churn that must have happened before it stops: action -> count, and "kills" and "samples"
    (double-booking samples). The churn runs ``duration_s``, then on until these are reached (at
    most ``goals_timeout_s`` more), so a loaded machine that does less per second still does it."""
    goals_timeout_s: float = 120.0


class OperatorControl:
    """What the chaos driver needs of the operator under test: start it, SIGKILL it, its pid and log."""

    def __init__(self, start: Callable[[], subprocess.Popen[bytes]], log: Path) -> None:
        self._start = start
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.proc = self._start()
        self.starts += 1

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu_s(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_bytes(self) -> int:
        try:
            return self.log.stat().st_size
        except FileNotFoundError:
            return 0

    def log_count(self, text: str) -> int:
        try:
            with self.log.open("rb") as f:
                return sum(line.count(text.encode()) for line in f)
        except FileNotFoundError:
            return 0

    def log_lines(self) -> int:
        try:
            with self.log.open("rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0


@dataclass
class ChaosReport:
    actions: Counter[str] = field(default_factory=Counter)
    churn_short_of: dict[str, int] = field(default_factory=dict)
    """What the churn still lacked of its goals when it stopped (``ChaosConfig.at_least``)."""
    kills: int = 0
    samples: int = 0
    double_bookings: list[str] = field(default_factory=list)
    settled: bool = False
    settle_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    """Why the cluster did not settle (the last check's findings), empty when it did."""
    final_claims: int = 0
    final_allocated: int = 0
    log_lines: int = 0
    operator_allocations: int = 0
    replacing_lines: int = 0
    quiet_cpu_s: float = 0.0
    quiet_log_bytes: int = 0
    quiet_replacing_lines: int = 0

    def summary(self) -> str:
        acts = ", ".join(f"{k} {v}" for k, v in sorted(self.actions.items()))
        return (
            f"actions: {acts}; operator kills: {self.kills}; double-booking samples: {self.samples} "
            f"(violations {len(self.double_bookings)}); settled: {self.settled} in {self.settle_s:.1f} s "
            f"({self.final_allocated} of {self.final_claims} claims allocated); claims the operator "
            f"allocated: {self.operator_allocations}; operator log: "
            f"{self.log_lines} lines, {self.replacing_lines} '{REPLACING}'; quiet window: "
            f"{self.quiet_cpu_s:.2f} CPU s, {self.quiet_log_bytes} log bytes, "
            f"{self.quiet_replacing_lines} '{REPLACING}'"
            + (f"; churn stopped short of its goals by {self.churn_short_of}" if self.churn_short_of else "")
        )


def standalone_claim(name: str, namespace: str, cls: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": {"chaos": "standalone"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}},
    }


def claim_template(namespace: str, cls: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}}},
    }


def template_pod(name: str, namespace: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod whose one-GPU claim comes from the template ``gpu``; labelled as the chaos run's by default."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"chaos": "pod"} if labels is None else labels,
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/sleep:1",
                    "command": ["sleep", "infinity"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def gpu_slice(node: str, gpus: int, driver: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "index": {"int": i}}}
                for i in range(gpus)
            ],
        },
    }


def device_ids(claim: dict[str, Any]) -> list[DeviceID]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [(r["driver"], r["pool"], r["device"]) for r in results]


def _label(claim: dict[str, Any]) -> str:
    return str((claim["metadata"].get("labels") or {}).get("chaos", ""))


def _deleting(claim: dict[str, Any]) -> bool:
    return bool(claim["metadata"].get("deletionTimestamp"))


def _owner_name(claim: dict[str, Any]) -> str:
    for ref in claim["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "Pod":
            return str(ref.get("name", ""))
    return ""


def double_booked(claims: list[dict[str, Any]], *, staged: set[frozenset[str]] | None = None) -> list[str]:
    """Devices allocated to two claims, but for the ``staged`` pairs (the driver made those)."""
    seen: dict[DeviceID, str] = {}
    found = []
    for c in claims:
        name = c["metadata"]["name"]
        for device in device_ids(c):
            other = seen.get(device)
            if other is not None and frozenset((other, name)) not in (staged or set()):
                found.append(f"{'/'.join(device)} allocated to {other} and {name}")
            seen[device] = name
    return found


def settle_problems(claims: list[dict[str, Any]], *, capacity: int) -> list[str]:
    """What keeps the claims from the settled state (empty: settled)."""
    problems = double_booked(claims)
    allocated = [c for c in claims if device_ids(c)]
    waiting = [c["metadata"]["name"] for c in claims if not device_ids(c)]
    if waiting and len(allocated) < capacity:
        names = ", ".join(sorted(waiting)[:8])
        problems.append(f"{len(allocated)} of {capacity} GPUs allocated while claims wait: {names}")
    for c in claims:
        meta = c["metadata"]
        if meta.get("deletionTimestamp"):
            problems.append(f"claim {meta['name']} stays Terminating (finalizers {meta.get('finalizers')})")
        elif OPERATOR_FINALIZER in (meta.get("finalizers") or []) and not device_ids(c):
            problems.append(f"claim {meta['name']} holds {OPERATOR_FINALIZER} without an allocation")
    return problems


def short_of(at_least: Mapping[str, int], report: ChaosReport) -> dict[str, int]:
    """What the churn still lacks of ``at_least`` (action -> count, or "kills", "samples"):
    name -> how many more."""
    done = {**report.actions, "kills": report.kills, "samples": report.samples}
    return {k: n - done.get(k, 0) for k, n in at_least.items() if done.get(k, 0) < n}


class Chaos:
    """Runs one chaos round against a cluster whose nodes, slices and class already exist."""

    def __init__(self, *, api: client.ApiClient, config: ChaosConfig, operator: OperatorControl) -> None:
        self.config = config
        self.operator = operator
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.rng = random.Random(config.seed)
        self.report = ChaosReport()
        self.claims: list[str] = []
        self.staged: set[frozenset[str]] = set()
        self.pods: list[str] = []
        self._serial = 0

    async def run(self) -> ChaosReport:
        cfg = self.config
        await self._create(
            lambda: self.custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                cfg.namespace,
                "resourceclaimtemplates",
                claim_template(cfg.namespace, cfg.gpu_class),
            )
        )
        if not self.operator.running():
            self.operator.start()
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(self._churn(stop)),
            asyncio.create_task(self._killer(stop)),
            asyncio.create_task(self._sampler(stop)),
        ]
        await asyncio.sleep(cfg.duration_s)
        await self._until_goals()
        stop.set()
        await asyncio.gather(*tasks)
        if not self.operator.running():
            self.operator.start()
        if cfg.race_at_end:
            await self._race_the_operator()
        await self._settle()
        await self._quiet_window()
        self.report.log_lines = self.operator.log_lines()
        self.report.replacing_lines = self.operator.log_count(REPLACING)
        self.report.operator_allocations = self.operator.log_count(ALLOCATED)
        return self.report

    def _short_of_goals(self) -> dict[str, int]:
        return short_of(self.config.at_least, self.report)

    async def _until_goals(self) -> None:
        deadline = time.monotonic() + self.config.goals_timeout_s
        # Polled: the goals are counters the churn, killer and sampler tasks bump.
        while True:
            short = self._short_of_goals()
            if not short or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.5)
        self.report.churn_short_of = short

    # -- the churn ------------------------------------------------------------------------------

    async def _churn(self, stop: asyncio.Event) -> None:
        cfg = self.config
        while not stop.is_set():
            await asyncio.sleep(self.rng.expovariate(cfg.actions_per_s))
            existing = len(self.claims) + len(self.pods)
            roll = self.rng.random()
            try:
                if roll < 0.3 and existing < cfg.max_claims:
                    await self._new_claim()
                elif roll < 0.6 and existing < cfg.max_claims:
                    await self._new_pod()
                elif roll < 0.8 and self.claims:
                    await self._delete_claim()
                elif self.pods:
                    await self._delete_pod()
            except ApiException as exc:
                self.report.actions[f"refused {exc.status}"] += 1

    async def _new_claim(self) -> None:
        name = f"c{self._next()}"
        ns = self.config.namespace
        body = standalone_claim(name, ns, self.config.gpu_class)
        await self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "resourceclaims", body)
        self.claims.append(name)
        self.report.actions["claim created"] += 1

    async def _new_pod(self) -> None:
        name = f"p{self._next()}"
        await self.core.create_namespaced_pod(
            self.config.namespace,
            template_pod(name, self.config.namespace),  # type: ignore[arg-type]  # sent as it is
        )
        self.pods.append(name)
        self.report.actions["pod created"] += 1

    async def _delete_claim(self) -> None:
        name = self.claims.pop(self.rng.randrange(len(self.claims)))
        await self._ignore_missing(
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.config.namespace, "resourceclaims", name
            )
        )
        self.report.actions["claim deleted"] += 1

    async def _delete_pod(self) -> None:
        name = self.pods.pop(self.rng.randrange(len(self.pods)))
        force = self.rng.random() < self.config.force_delete_share
        # Forced: what `kubectl delete --grace-period=0 --force` sends. Otherwise the pod's own grace
        # period applies, which is 0 here: no kubelet would confirm a graceful deletion.
        ns = self.config.namespace
        await self._ignore_missing(
            self.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            if force
            else self.core.delete_namespaced_pod(name, ns)
        )
        self.report.actions["pod force-deleted" if force else "pod deleted"] += 1

    async def _race_the_operator(self) -> None:
        """Play kube-scheduler losing the race for a device: write the devices of a claim the
        operator allocated into a pod's waiting claim, as a scheduler allocating from a cache that
        has not seen the operator's write would. The scene is set first: no pending pod but the
        target (see the module docstring), the operator holding devices (under churn the scheduler
        gets every freed device first) and the cluster full, so that the target's claim waits."""
        capacity = len(self.config.nodes) * self.config.gpus
        await self._delete_pending_pods()
        claims = await self._claims()
        freed = 0
        if not any(_label(c) == "standalone" and device_ids(c) for c in claims):
            bound = [p for p in await self._pods() if p.spec.node_name]
            for pod in bound[:2]:
                await self._ignore_missing(
                    self.core.delete_namespaced_pod(
                        pod.metadata.name, self.config.namespace, grace_period_seconds=0
                    )
                )
                if pod.metadata.name in self.pods:
                    self.pods.remove(pod.metadata.name)
                freed += 1
        # Enough standalone claims waiting for the operator to fill every free device (the churn may
        # have ended with the cluster less than full) and still have one left over.
        allocated = sum(len(device_ids(c)) for c in claims if not _deleting(c))
        waiting = [c for c in claims if _label(c) == "standalone" and not device_ids(c) and not _deleting(c)]
        wanted = max(3, capacity - allocated + freed + 1)
        for _ in range(max(0, wanted - len(waiting))):
            await self._new_claim()

        def full_with_ours(items: list[dict[str, Any]]) -> bool:
            allocated = [c for c in items if device_ids(c)]
            return len(allocated) >= capacity and any(_label(c) == "standalone" for c in allocated)

        # Polls end as soon as the cluster is there; the windows only bound a machine under load.
        full = await self._poll_claims(full_with_ours, within=240.0)
        if full is None:
            self.report.actions["race not staged"] += 1
            return
        target_pod = f"p{self._next()}"
        await self.core.create_namespaced_pod(
            self.config.namespace,
            template_pod(target_pod, self.config.namespace),  # type: ignore[arg-type]  # sent as it is
        )
        self.pods.append(target_pod)

        def ours(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [c for c in items if _label(c) == "standalone" and device_ids(c) and not _deleting(c)]

        def target_waiting(items: list[dict[str, Any]]) -> bool:
            # The race needs a device of the operator's to copy: one of its claims still allocated.
            waiting = any(_owner_name(c) == target_pod and not device_ids(c) for c in items)
            return waiting and bool(ours(items))

        staged = await self._poll_claims(target_waiting, within=120.0)
        if staged is None:
            self.report.actions["race not staged"] += 1
            return
        (target,) = [c for c in staged if _owner_name(c) == target_pod]
        victim = self.rng.choice(ours(staged))
        await self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            self.config.namespace,
            "resourceclaims",
            target["metadata"]["name"],
            {
                "metadata": {"resourceVersion": target["metadata"]["resourceVersion"]},
                "status": {"allocation": victim["status"]["allocation"]},
            },
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]  # stubs lack it
        )
        self.staged.add(frozenset((victim["metadata"]["name"], target["metadata"]["name"])))
        self.report.actions["race lost by the scheduler"] += 1

    async def _poll_claims(
        self, predicate: Callable[[list[dict[str, Any]]], bool], *, within: float
    ) -> list[dict[str, Any]] | None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            claims = await self._claims()
            if predicate(claims):
                return claims
            await asyncio.sleep(0.5)
        return None

    async def _pods(self) -> list[Any]:
        listing = await self.core.list_namespaced_pod(self.config.namespace)
        return list(listing.items)

    async def _delete_pending_pods(self) -> None:
        for pod in await self._pods():
            name = pod.metadata.name
            if not pod.spec.node_name and not pod.metadata.deletion_timestamp:
                await self._ignore_missing(
                    self.core.delete_namespaced_pod(name, self.config.namespace, grace_period_seconds=0)
                )
                if name in self.pods:
                    self.pods.remove(name)
                self.report.actions["pending pod force-deleted for the race"] += 1

    def _next(self) -> int:
        self._serial += 1
        return self._serial

    async def _ignore_missing(self, call: Any) -> None:
        try:
            await call
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def _create(self, call: Callable[[], Any]) -> None:
        try:
            await call()
        except ApiException as exc:
            if exc.status != 409:
                raise

    async def _killer(self, stop: asyncio.Event) -> None:
        low, high = self.config.kill_every_s
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.rng.uniform(low, high))
            if stop.is_set():
                return
            await asyncio.to_thread(self.operator.kill)
            self.report.kills += 1
            await asyncio.sleep(self.rng.uniform(0.0, 1.0))
            await asyncio.to_thread(self.operator.start)

    async def _sampler(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            found = double_booked(await self._claims(), staged=self.staged)
            self.report.samples += 1
            self.report.double_bookings += [f"during churn: {f}" for f in found]
            await asyncio.sleep(0.5)

    async def _claims(self) -> list[dict[str, Any]]:
        listing = await self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.config.namespace, "resourceclaims"
        )
        items: list[dict[str, Any]] = listing.get("items", [])
        return items

    # -- after the churn ------------------------------------------------------------------------

    async def _settle(self) -> None:
        capacity = len(self.config.nodes) * self.config.gpus
        started = time.monotonic()
        deadline = started + self.config.settle_timeout_s
        problems: list[str] = ["not checked"]
        claims: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            claims = await self._claims()
            problems = settle_problems(claims, capacity=capacity)
            self.report.samples += 1
            found = double_booked(claims, staged=self.staged)
            self.report.double_bookings += [f"while settling: {f}" for f in found]
            if not problems:
                break
            await asyncio.sleep(1.0)
        self.report.settle_s = time.monotonic() - started
        self.report.settled = not problems
        self.report.problems = problems
        self.report.final_claims = len(claims)
        self.report.final_allocated = sum(1 for c in claims if device_ids(c))

    async def _quiet_window(self) -> None:
        cpu, size, replacing = (
            self.operator.cpu_s(),
            self.operator.log_bytes(),
            self.operator.log_count(REPLACING),
        )
        await asyncio.sleep(self.config.quiet_window_s)
        self.report.quiet_cpu_s = self.operator.cpu_s() - cpu
        self.report.quiet_log_bytes = self.operator.log_bytes() - size
        self.report.quiet_replacing_lines = self.operator.log_count(REPLACING) - replacing


async def run_chaos(*, kubeconfig: Path, config: ChaosConfig, operator: OperatorControl) -> ChaosReport:
    api = await make_api_client(kubeconfig=kubeconfig)
    try:
        return await Chaos(api=api, config=config, operator=operator).run()
    finally:
        await api.close()


def operator_process(
    *, kubeconfig: Path, log: Path, config: ChaosConfig, extra: tuple[str, ...] = ()
) -> Callable[[], subprocess.Popen[bytes]]:
    """A function that starts ``dra-operator run`` appending to ``log`` (a new metrics port each
    time: a SIGKILLed predecessor's socket may linger)."""

    def start() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dra_operator.entry.cli",
                    "run",
                    f"--kubeconfig={kubeconfig}",
                    f"--metrics-port={free_port()}",
                    "--metrics-host=127.0.0.1",
                    f"--gpu-class={config.gpu_class}",
                    f"--gpu-driver={config.driver}",
                    "--heartbeat-interval-seconds=2",
                    "--peering-lifetime-seconds=6",
                    "--peering-renew-deadline-seconds=4",
                    *extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "DRA_OPERATOR_VERIFY_PLACER_INDEX": "true"},
            )

    return start


def prepare_cluster(cluster: LocalCluster, *, config: ChaosConfig) -> None:
    """Namespace, nodes, slices and the GPU class the chaos round allocates from."""
    repo = Path(__file__).resolve().parent.parent
    cluster.kubectl("apply", "-f", str(repo / "crds" / "clusterkopfpeerings.kopf.dev.yaml"))
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev", "--timeout=60s"
    )
    cluster.kubectl("apply", "-f", str(repo / "manifests" / "base" / "operator-peering.yaml"))
    cluster.create_namespace(config.namespace)
    for node in config.nodes:
        cluster.add_node(node)
    cluster.apply([gpu_slice(node, config.gpus, config.driver) for node in config.nodes])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=10.0, help="churn actions per second")
    parser.add_argument("--kill-every", type=float, nargs=2, default=(10.0, 40.0), metavar=("MIN", "MAX"))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    nodes = tuple(f"chaos-node-{i}" for i in range(args.nodes))
    config = ChaosConfig(
        namespace="chaos",
        gpu_class="gpu.nvidia.com",
        nodes=nodes,
        gpus=args.gpus,
        duration_s=args.minutes * 60,
        actions_per_s=args.rate,
        kill_every_s=tuple(args.kill_every),
        max_claims=int(args.nodes * args.gpus * 1.5),
        seed=args.seed,
        settle_timeout_s=300.0,
    )
    workdir = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    log = workdir / "operator.log"
    with LocalCluster(workdir=workdir / "cluster") as cluster:
        os.environ.pop("KUBECONFIG", None)
        prepare_cluster(cluster, config=config)
        operator = OperatorControl(
            operator_process(kubeconfig=cluster.kubeconfig, log=log, config=config), log
        )
        started = time.monotonic()
        try:
            report = asyncio.run(run_chaos(kubeconfig=cluster.kubeconfig, config=config, operator=operator))
        finally:
            operator.kill()
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "gpus": args.gpus,
                "minutes": args.minutes,
                "seed": args.seed,
                "wall_s": round(time.monotonic() - started, 1),
                "actions": dict(report.actions),
                "claims_created": report.actions["claim created"] + report.actions["pod created"],
                "kills": report.kills,
                "double_bookings": len(report.double_bookings),
                "settled": report.settled,
                "settle_s": round(report.settle_s, 1),
                "problems": report.problems[:10],
                "operator_allocations": report.operator_allocations,
                "log_lines": report.log_lines,
                "replacing_lines": report.replacing_lines,
                "quiet_cpu_s": round(report.quiet_cpu_s, 2),
                "quiet_log_bytes": report.quiet_log_bytes,
            },
            indent=1,
        )
    )
    print(report.summary())
    print(f"operator log: {log}")


if __name__ == "__main__":
    main()
