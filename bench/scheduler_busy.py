"""Standalone claims while kube-scheduler stays busy: how long they wait, and whether pods slow down.

The real local control plane (kube-scheduler included), Node objects with simulated GPUs (the
benchmark publishes their ResourceSlices), and the operator as a process. A steady stream of pods,
each with a one-GPU claim from a template that kube-scheduler allocates, is created at a fixed rate
and each pod is deleted (forced: no kubelet runs) a fixed time after its creation. Meanwhile a
standalone one-GPU claim of the operator's class is created every few seconds and deleted as soon
as it is seen allocated.

Measured, from watch events (times on this machine's monotonic clock):

- each standalone claim's wait: its creation acknowledged -> its allocation seen;
- each pod's scheduling latency: its creation acknowledged -> its binding (``spec.nodeName``) seen;
  pods deleted before they were bound are counted apart;
- double bookings: every change of every claim in the namespace (kube-scheduler's too) is applied
  to a map of device -> holder, and a device that a second claim gets while the first still holds
  it is one.

``main`` runs, per rate, the pods alone and then pods and standalone claims, and prints both:

    .venv/bin/python -m bench.scheduler_busy [--rates 1,5,10] [--duration 300] [--nodes 4] [--gpus 8]

kube-controller-manager runs with ``--kube-api-qps 100`` (``--controller-manager-qps``): at its
default of 20 requests a second its claim controller falls seconds behind at 10 pods a second (a
claim made, a pod status written, a claim deallocated and deleted per pod), and pods are deleted
before their claims exist, whatever the operator does.

The CI test (``tests/integration/operator/test_scheduler_busy.py``) runs a short round at one pod
a second. Nothing here asserts on time: figures are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from bench.operator_allocation import CpuMeter
from bench.operator_chaos import GROUP, VERSION, DeviceID, claim_template, device_ids, gpu_slice, template_pod
from dra_api.kube import make_api_client
from dra_devcluster import LocalCluster
from dra_devcluster.cluster import free_port

STANDALONE = "standalone"


@dataclass(frozen=True)
class BusyConfig:
    namespace: str
    gpu_class: str
    nodes: tuple[str, ...]
    gpus: int
    driver: str = "gpu.nvidia.com"
    """The GPUs' driver name: a test sharing its cluster gives the operator one of its own."""
    pods_per_s: float = 1.0
    pod_lifetime_s: float = 6.0
    """Each pod is deleted this long after its creation, bound or not."""
    claim_every_s: float = 4.0
    """A standalone claim every this many seconds; 0: none (the pods-only baseline)."""
    duration_s: float = 120.0
    drain_s: float = 30.0
    """After the stream stops, how long standalone claims still waiting are given."""


@dataclass
class BusyReport:
    claims_created: int = 0
    waits: dict[str, float] = field(default_factory=dict)
    """Standalone claim -> seconds from its creation to its allocation."""
    waiting: list[str] = field(default_factory=list)
    """Standalone claims still unallocated at the end."""
    pods_created: int = 0
    pod_latencies: dict[str, float] = field(default_factory=dict)
    """Pod -> seconds from its creation to its binding."""
    pods_unbound: int = 0
    """Pods deleted (or left at the end) before kube-scheduler bound them."""
    allocations_seen: int = 0
    """Allocations checked for double booking (all claims, kube-scheduler's included)."""
    double_bookings: list[str] = field(default_factory=list)
    refused: int = 0
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds of each process while the stream ran (when measured)."""

    def claim_stats(self) -> dict[str, float | None]:
        return stats(list(self.waits.values()))

    def pod_stats(self) -> dict[str, float | None]:
        return stats(list(self.pod_latencies.values()))

    def summary(self) -> str:
        c, p = self.claim_stats(), self.pod_stats()
        return (
            f"standalone claims: {len(self.waits)} of {self.claims_created} allocated, wait p50 "
            f"{_s(c['p50'])} p99 {_s(c['p99'])} max {_s(c['max'])}, still waiting {len(self.waiting)}; "
            f"pods: {len(self.pod_latencies)} of {self.pods_created} bound, latency p50 {_s(p['p50'])} "
            f"p99 {_s(p['p99'])} max {_s(p['max'])}, never bound {self.pods_unbound}; allocations checked "
            f"{self.allocations_seen}, double bookings {len(self.double_bookings)}"
            + (f"; CPU s in the stream: {_cpu_text(self.cpu_s)}" if self.cpu_s else "")
        )


def _cpu_text(cpu: dict[str, float]) -> str:
    return ", ".join(f"{name} {seconds:.1f}" for name, seconds in sorted(cpu.items(), key=lambda kv: -kv[1]))


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"n": len(ordered), "p50": statistics.median(ordered), "p99": p99, "max": ordered[-1]}


def standalone_claim(name: str, namespace: str, cls: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": {"bench": STANDALONE}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}},
    }


class Holdings:
    """Which claim holds each device, from a stream of claim states in resourceVersion order."""

    def __init__(self) -> None:
        self.holder: dict[DeviceID, str] = {}
        self.devices: dict[str, tuple[DeviceID, ...]] = {}
        self.checked = 0

    def update(self, name: str, devices: list[DeviceID]) -> list[str]:
        """Apply a claim's current devices (empty: none, or deleted); the double bookings it makes."""
        new = tuple(devices)
        old = self.devices.get(name, ())
        if new == old:
            return []
        for device in old:
            if self.holder.get(device) == name:
                del self.holder[device]
        found = []
        for device in new:
            other = self.holder.get(device)
            if other is not None and other != name:
                found.append(f"{'/'.join(device)} allocated to {name} while {other} holds it")
            self.holder[device] = name
        if new:
            self.devices[name] = new
            self.checked += 1
        else:
            self.devices.pop(name, None)
        return found


class BusyRound:
    """One round: the pod stream, the standalone claims, the watches that time them."""

    def __init__(
        self,
        *,
        api: client.ApiClient,
        config: BusyConfig,
        cpu: Callable[[], Callable[[], dict[str, float]]] | None = None,
    ) -> None:
        self.config = config
        self.cpu = cpu
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.report = BusyReport()
        self.holdings = Holdings()
        self.claim_created: dict[str, float] = {}
        self.pod_created: dict[str, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._claims_watching = asyncio.Event()
        self._pods_watching = asyncio.Event()

    async def run(self) -> BusyReport:
        cfg = self.config
        with contextlib.suppress(ApiException):
            await self.custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                cfg.namespace,
                "resourceclaimtemplates",
                claim_template(cfg.namespace, cfg.gpu_class),
            )
        watchers = [asyncio.create_task(self._watch_claims()), asyncio.create_task(self._watch_pods())]
        await asyncio.wait_for(asyncio.gather(self._claims_watching.wait(), self._pods_watching.wait()), 30)
        stop = asyncio.Event()
        used = self.cpu() if self.cpu is not None else None
        makers = [asyncio.create_task(self._make_pods(stop))]
        if cfg.claim_every_s > 0:
            makers.append(asyncio.create_task(self._make_claims(stop)))
        await asyncio.sleep(cfg.duration_s)
        stop.set()
        if used is not None:
            self.report.cpu_s = used()
        await asyncio.gather(*makers)
        # Let the last pods live out their time, and the claims still waiting get their chance.
        deadline = time.monotonic() + max(cfg.pod_lifetime_s, 0.0) + 1.0
        drain_until = time.monotonic() + cfg.drain_s
        while time.monotonic() < max(deadline, drain_until):
            if time.monotonic() >= deadline and not self._standalone_waiting():
                break
            await asyncio.sleep(0.2)
        self.report.waiting = sorted(self._standalone_waiting())
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task
        for w in watchers:
            w.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        self.report.pods_unbound = len(set(self.pod_created) - set(self.report.pod_latencies))
        self.report.allocations_seen = self.holdings.checked
        await self.clean_up()
        return self.report

    def _standalone_waiting(self) -> list[str]:
        return [n for n in self.claim_created if n not in self.report.waits]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _make_pods(self, stop: asyncio.Event) -> None:
        cfg = self.config
        start = time.monotonic()
        serial = 0
        while not stop.is_set():
            serial += 1
            self._spawn(self._pod_life(f"p{serial}"))
            # Paced from the start, not from the last creation: the rate holds however slow a request.
            delay = start + serial / cfg.pods_per_s - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, delay))

    async def _pod_life(self, name: str) -> None:
        cfg = self.config
        try:
            await self.core.create_namespaced_pod(cfg.namespace, template_pod(name, cfg.namespace, labels={}))  # type: ignore[arg-type]
        except ApiException:
            self.report.refused += 1
            return
        created = self.pod_created[name] = time.monotonic()
        self.report.pods_created += 1
        await asyncio.sleep(max(0.0, created + cfg.pod_lifetime_s - time.monotonic()))
        await self._ignore_missing(
            self.core.delete_namespaced_pod(name, cfg.namespace, grace_period_seconds=0)
        )

    async def _make_claims(self, stop: asyncio.Event) -> None:
        cfg = self.config
        start = time.monotonic()
        serial = 0
        while not stop.is_set():
            serial += 1
            self._spawn(self._new_claim(f"c{serial}"))
            delay = start + serial * cfg.claim_every_s - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, delay))

    async def _new_claim(self, name: str) -> None:
        cfg = self.config
        try:
            await self.custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                cfg.namespace,
                "resourceclaims",
                standalone_claim(name, cfg.namespace, cfg.gpu_class),
            )
        except ApiException:
            self.report.refused += 1
            return
        self.claim_created.setdefault(name, time.monotonic())
        self.report.claims_created += 1

    async def _watch_claims(self) -> None:
        cfg = self.config
        while True:
            listing = await self.custom.list_namespaced_custom_object(
                GROUP, VERSION, cfg.namespace, "resourceclaims"
            )
            listed = {obj["metadata"]["name"] for obj in listing.get("items", [])}
            # A claim deleted while no watch ran (the gap before this listing) has let go.
            for name in [n for n in self.holdings.devices if n not in listed]:
                self.holdings.update(name, [])
            for obj in listing.get("items", []):
                self._on_claim(obj, deleted=False)
            self._claims_watching.set()
            w = watch.Watch()
            with contextlib.suppress(ApiException):
                async with w.stream(
                    self.custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    cfg.namespace,
                    "resourceclaims",
                    resource_version=listing["metadata"]["resourceVersion"],
                    timeout_seconds=300,
                ) as stream:
                    async for event in stream:
                        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            self._on_claim(event["object"], deleted=event["type"] == "DELETED")

    def _on_claim(self, obj: dict[str, Any], *, deleted: bool) -> None:
        now = time.monotonic()
        name = obj["metadata"]["name"]
        devices = [] if deleted else device_ids(obj)
        self.report.double_bookings += self.holdings.update(name, devices)
        standalone = (obj["metadata"].get("labels") or {}).get("bench") == STANDALONE
        if standalone and devices and name not in self.report.waits:
            # The watch may bring the allocation before the create call returned: time it from then.
            created = self.claim_created.setdefault(name, now)
            self.report.waits[name] = now - created
            self._spawn(
                self._ignore_missing(
                    self.custom.delete_namespaced_custom_object(
                        GROUP, VERSION, self.config.namespace, "resourceclaims", name
                    )
                )
            )

    async def _watch_pods(self) -> None:
        cfg = self.config
        while True:
            listing = await self.core.list_namespaced_pod(cfg.namespace)
            self._pods_watching.set()
            w = watch.Watch()
            with contextlib.suppress(ApiException):
                async with w.stream(
                    self.core.list_namespaced_pod,
                    cfg.namespace,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=300,
                ) as stream:
                    async for event in stream:
                        pod = event["object"]
                        name = pod.metadata.name
                        if pod.spec.node_name and name not in self.report.pod_latencies:
                            created = self.pod_created.setdefault(name, time.monotonic())
                            self.report.pod_latencies[name] = time.monotonic() - created

    async def clean_up(self) -> None:
        ns = self.config.namespace
        for pod in (await self.core.list_namespaced_pod(ns)).items:
            await self._ignore_missing(
                self.core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
            )
        listing = await self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "resourceclaims")
        for obj in listing.get("items", []):
            if (obj["metadata"].get("labels") or {}).get("bench") == STANDALONE:
                await self._ignore_missing(
                    self.custom.delete_namespaced_custom_object(
                        GROUP, VERSION, ns, "resourceclaims", obj["metadata"]["name"]
                    )
                )
        # The pods' claims go with their pods (the claim controller), ours with the operator's
        # deallocation: wait until none is left, so that the next round starts empty.
        for _ in range(300):
            listing = await self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "resourceclaims")
            if not listing.get("items"):
                return
            await asyncio.sleep(0.2)

    async def _ignore_missing(self, call: Any) -> None:
        try:
            await call
        except ApiException as exc:
            if exc.status != 404:
                raise


async def run_round(
    *, kubeconfig: Path, config: BusyConfig, cpu: Callable[[], Callable[[], dict[str, float]]] | None = None
) -> BusyReport:
    """One round; ``cpu``, if given, starts a CPU meter and returns what reads it at the end."""
    api = await make_api_client(kubeconfig=kubeconfig)
    try:
        return await BusyRound(api=api, config=config, cpu=cpu).run()
    finally:
        await api.close()


def prepare_cluster(cluster: LocalCluster, *, config: BusyConfig) -> None:
    """Namespace, Node objects and their GPU slices."""
    cluster.create_namespace(config.namespace)
    for node in config.nodes:
        cluster.add_node(node)
    cluster.apply([gpu_slice(node, config.gpus, config.driver) for node in config.nodes])


def operator_process(
    *, kubeconfig: Path, log: Path, config: BusyConfig, extra: tuple[str, ...] = ()
) -> Callable[[], subprocess.Popen[bytes]]:
    """A function that starts ``dra-operator run --standalone true`` for the round's class and
    driver, appending to ``log``."""

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
                    "--standalone=true",
                    f"--gpu-class={config.gpu_class}",
                    f"--gpu-driver={config.driver}",
                    *extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    return start


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1,5,10", help="pods per second, comma-separated")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of each round")
    parser.add_argument(
        "--baseline-duration", type=float, default=None, help="seconds of each pods-only round"
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pod-lifetime", type=float, default=6.0)
    parser.add_argument("--claim-every", type=float, default=4.0)
    parser.add_argument("--operator-arg", action="append", default=[], help="extra flag for the operator")
    parser.add_argument(
        "--controller-manager-qps",
        type=float,
        default=100.0,
        help="kube-controller-manager's --kube-api-qps (burst twice that); its default, 20, cannot make "
        "and remove the claims of 10 pods a second",
    )
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",") if r]
    nodes = tuple(f"busy-node-{i}" for i in range(args.nodes))
    workdir = Path(tempfile.mkdtemp(prefix="bench-scheduler-busy-"))
    log = workdir / "operator.log"
    results: list[dict[str, Any]] = []
    started = time.monotonic()
    qps = args.controller_manager_qps
    component_args = {"kube-controller-manager": [f"--kube-api-qps={qps:g}", f"--kube-api-burst={2 * qps:g}"]}
    with LocalCluster(workdir=workdir / "cluster", component_args=component_args) as cluster:
        os.environ.pop("KUBECONFIG", None)
        base = BusyConfig(namespace="busy", gpu_class="gpu.nvidia.com", nodes=nodes, gpus=args.gpus)
        prepare_cluster(cluster, config=base)
        meter = CpuMeter(cluster)
        proc = operator_process(
            kubeconfig=cluster.kubeconfig, log=log, config=base, extra=tuple(args.operator_arg)
        )()

        def start_meter() -> Callable[[], dict[str, float]]:
            meter.start(proc.pid)
            return meter.used

        try:
            cluster.wait_for(
                lambda: cluster.kubectl("get", "deviceclass", base.gpu_class, check=False).returncode == 0,
                what="the operator's GPU class",
            )
            for rate in rates:
                for with_claims in (False, True):
                    duration = args.duration if with_claims else (args.baseline_duration or args.duration)
                    config = BusyConfig(
                        namespace=base.namespace,
                        gpu_class=base.gpu_class,
                        nodes=nodes,
                        gpus=args.gpus,
                        pods_per_s=rate,
                        pod_lifetime_s=args.pod_lifetime,
                        claim_every_s=args.claim_every if with_claims else 0.0,
                        duration_s=duration,
                    )
                    report = asyncio.run(
                        run_round(kubeconfig=cluster.kubeconfig, config=config, cpu=start_meter)
                    )
                    label = f"{rate:g} pods/s, {'with' if with_claims else 'without'} standalone claims"
                    print(f"{label}: {report.summary()}", flush=True)
                    results.append(
                        {
                            "pods_per_s": rate,
                            "standalone_claims": with_claims,
                            "duration_s": duration,
                            "claims_created": report.claims_created,
                            "claim_wait_s": report.claim_stats(),
                            "claims_still_waiting": report.waiting,
                            "pods_created": report.pods_created,
                            "pod_scheduling_s": report.pod_stats(),
                            "pods_never_bound": report.pods_unbound,
                            "allocations_checked": report.allocations_seen,
                            "double_bookings": report.double_bookings[:20],
                            "refused": report.refused,
                            "cpu_s": {k: round(v, 1) for k, v in report.cpu_s.items()},
                        }
                    )
        finally:
            stop_process(proc)
    print(
        json.dumps(
            {
                "wall_s": round(time.monotonic() - started, 1),
                "nodes": args.nodes,
                "gpus": args.gpus,
                "pod_lifetime_s": args.pod_lifetime,
                "claim_every_s": args.claim_every,
                "controller_manager_qps": qps,
                "rounds": results,
            },
            indent=1,
        )
    )
    print(f"operator log: {log}")


if __name__ == "__main__":
    main()
