"""Standalone claims keep being allocated while kube-scheduler keeps placing pods (issue 28).

The scenario of :mod:`bench.scheduler_busy`, shortened for CI: four Node objects of 8 GPUs, a pod
with a one-GPU template claim every second (kube-scheduler allocates it), each deleted six seconds
after its creation, and a standalone one-GPU claim (the operator's) every two seconds, deleted once
allocated. Before the fix every pod that started being scheduled held the operator back for 2 s, so
at this rate the hold never ended: one standalone claim of thirty was allocated while the pods came.

The bound is the issue's: every standalone claim allocated within 10 s of its creation, on an idle
machine; under load it is scaled by the machine's measured slowdown (``tests/integration/pace.py``,
at most threefold: 30 s, still short of the 45 s stream a held-back claim would wait out). Every
change of every claim in the namespace, kube-scheduler's included, is checked for a device held
twice.

A claim that does wait for kube-scheduler says so: a WaitingForScheduler condition and one Event,
which ``kubectl dra explain`` shows, until it is allocated.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.operator_chaos import OperatorControl
from bench.scheduler_busy import BusyConfig, BusyReport, operator_process, prepare_cluster, run_round
from dra_devcluster import LocalCluster
from tests.integration.operator.conftest import INDEX_DISAGREES, Operators, events_for
from tests.integration.operator.objects import CONDITION_ANNOTATION, add_gpu_node, claim, pod
from tests.integration.pace import Pace, measured, slowdown

BOUND_S = 10.0


def test_standalone_claims_are_allocated_within_the_bound_while_pods_stream_in(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    config = BusyConfig(
        namespace="op-busy",
        gpu_class="op-busy-gpu",
        driver="busy.gpu.example.com",
        nodes=("op-busy-a", "op-busy-b", "op-busy-c", "op-busy-d"),
        gpus=8,
        pods_per_s=1.0,
        pod_lifetime_s=6.0,
        claim_every_s=2.0,
        duration_s=45.0,
        drain_s=20.0,
    )
    report, operator, log, pace = _busy_round(local_cluster, tmp_path, config, tpu_class="op-busy-tpu")
    summary = f"{report.summary()}; slowdown {pace.factor:.2f}"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    # The stream ran: pods and claims at their rates, and kube-scheduler placed every pod in it.
    assert report.pods_created >= 40, summary
    assert report.claims_created >= 20, summary
    assert report.pods_unbound == 0, summary
    # Every standalone claim allocated, each within the bound, while the pods kept coming.
    assert report.waiting == [], f"{summary}\nlog tail:\n{tail}"
    assert len(report.waits) == report.claims_created, summary
    slow = {name: round(wait, 2) for name, wait in report.waits.items() if wait > pace.scaled(BOUND_S)}
    assert slow == {}, f"{summary}\nlog tail:\n{tail}"
    # No device ever in two claims, counting every allocation of both allocators.
    assert report.allocations_seen >= report.pods_created + report.claims_created - 5, summary
    assert report.double_bookings == [], summary
    assert operator.log_count(INDEX_DISAGREES) == 0, summary


def test_when_pods_ask_for_every_gpu_a_starved_claim_gets_one_reserved(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    # Two nodes of 4 GPUs, and pods asking for 12 (two a second, each for six seconds): every GPU
    # freed goes to a waiting pod within milliseconds, so no GPU is ever out of their reach and
    # giving way alone would leave the standalone claims waiting until the pods stop. A claim that
    # has waited 2 s gets a GPU reserved with a DeviceTaintRule that kube-scheduler honours, and
    # takes it once its pod is gone (the local cluster turns DRADeviceTaintRules on).
    config = BusyConfig(
        namespace="op-saturated",
        gpu_class="op-saturated-gpu",
        driver="saturated.gpu.example.com",
        nodes=("op-sat-a", "op-sat-b"),
        gpus=4,
        pods_per_s=2.0,
        pod_lifetime_s=6.0,
        claim_every_s=3.0,
        duration_s=36.0,
        drain_s=20.0,
    )
    # Every rule is deleted a moment after its claim's allocation.
    report, operator, log, pace = _busy_round(
        local_cluster, tmp_path, config, tpu_class="op-saturated-tpu", then=_rules_deleted
    )
    summary = f"{report.summary()}; slowdown {pace.factor:.2f}"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    assert report.pods_created >= 60, summary
    assert report.claims_created >= 10, summary
    # The pods did ask for more than there is: some were deleted before kube-scheduler bound them.
    assert report.pods_unbound > 0, summary
    assert len(report.pod_latencies) >= 30, summary
    # Every standalone claim allocated within the bound, none held back until the pods stopped.
    assert report.waiting == [], f"{summary}\nlog tail:\n{tail}"
    slow = {name: round(wait, 2) for name, wait in report.waits.items() if wait > pace.scaled(BOUND_S)}
    assert slow == {}, f"{summary}\nlog tail:\n{tail}"
    assert operator.log_count("reserved node ") >= 1, f"{summary}\nlog tail:\n{tail}"
    assert report.double_bookings == [], summary
    assert operator.log_count(INDEX_DISAGREES) == 0, summary


def _busy_round(
    cluster: LocalCluster,
    tmp_path: Path,
    config: BusyConfig,
    *,
    tpu_class: str,
    then: Callable[[LocalCluster], object] = lambda _: None,
) -> tuple[BusyReport, OperatorControl, Path, Pace]:
    """One round of :func:`bench.scheduler_busy.run_round` with an operator of its own, ``then``
    checked before the operator stops; the cluster cleaned up after. The round's :class:`Pace`
    scales the bound."""
    prepare_cluster(cluster, config=config)
    log = tmp_path / "operator.log"
    operator = OperatorControl(
        operator_process(
            kubeconfig=cluster.kubeconfig,
            log=log,
            config=config,
            extra=(f"--tpu-class={tpu_class}", "--verify-placer-index=true"),
        ),
        log,
    )
    operator.start()
    try:
        cluster.wait_for(
            lambda: cluster.kubectl("get", "deviceclass", config.gpu_class, check=False).returncode == 0,
            what="the operator's GPU class",
        )
        with measured() as pace:
            report = asyncio.run(run_round(kubeconfig=cluster.kubeconfig, config=config))
        then(cluster)
    finally:
        operator.kill()
        for node in config.nodes:
            cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl(
            "delete", "resourceslice", *(f"{n}-gpu" for n in config.nodes), "--ignore-not-found", check=False
        )
        cluster.kubectl("delete", "namespace", config.namespace, "--wait=false", check=False)
        cluster.kubectl(
            "delete", "deviceclass", config.gpu_class, tpu_class, "--ignore-not-found", check=False
        )
        for name in _reservation_rules(cluster):
            cluster.kubectl("delete", "devicetaintrule", name, "--ignore-not-found", check=False)
    return report, operator, log, pace


def _rules_deleted(cluster: LocalCluster) -> None:
    cluster.wait_for(
        lambda: not _reservation_rules(cluster), timeout=20, what="the reservations' DeviceTaintRules deleted"
    )


def _reservation_rules(cluster: LocalCluster) -> list[str]:
    listed = cluster.kubectl(
        "get", "devicetaintrules", "-l", "dra.accel.dev/reserved-for-claim", "-o", "name", check=False
    )
    return [line.split("/", 1)[-1] for line in listed.stdout.split()] if listed.returncode == 0 else ["?"]


def test_a_claim_that_waits_for_kube_scheduler_says_so_once_and_goes_when_the_pods_do(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    # Two pods whose template claims kube-scheduler is waiting for (the template is missing, so the
    # claims never come; for the operator they are claims it has not seen yet, one GPU each, which
    # count for a while after the pod's creation). With the headroom of 2 they could take 4 GPUs
    # ahead of any the operator takes: on a node of 4 there is none it may take.
    ns = "op-sched-wait"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-sw-a", 4)
    op = operators.start()
    local_cluster.wait_for(
        lambda: local_cluster.kubectl("get", "deviceclass", operators.gpu_class, check=False).returncode == 0,
        what="the operator's GPU class",
    )
    local_cluster.apply([pod(f"p{i}", ns, template="not-made") for i in range(2)])
    local_cluster.apply([claim("c", ns, cls=operators.gpu_class)])

    def condition() -> dict[str, Any]:
        obj = local_cluster.get_json("resourceclaim", "c", "-n", ns)
        text = (obj["metadata"].get("annotations") or {}).get(CONDITION_ANNOTATION)
        return dict(json.loads(text)) if text else {}

    waiting = local_cluster.wait_for(
        lambda: (c := condition()).get("reason") == "WaitingForScheduler" and c,
        timeout=20,
        what="the WaitingForScheduler condition",
    )
    assert waiting["status"] == "False"
    assert "kube-scheduler is placing 2 pods" in waiting["message"]
    local_cluster.wait_for(
        lambda: [e for e in events_for(local_cluster, ns, "c") if e["reason"] == "WaitingForScheduler"],
        timeout=20,
        what="the WaitingForScheduler Event",
    )
    assert op.metric("dra_operator_claims", 'state="waiting_for_scheduler"') == 1
    explained = subprocess.run(
        [
            str(Path(sys.executable).parent / "kubectl-dra"),
            "explain",
            "c",
            "-n",
            ns,
            f"--kubeconfig={local_cluster.kubeconfig}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert explained.returncode == 0, explained.stderr  # the allocator alone would place it
    assert "the operator is waiting for kube-scheduler (since " in explained.stdout
    assert waiting["message"] in explained.stdout

    # Another pod comes and goes: the claim is placed again, and says nothing new. Once the
    # operator has seen both (its watch counts them), it gets a few of its passes' time, scaled.
    pods_seen = op.metric("dra_operator_watch_events_total", 'resource="pods"')
    local_cluster.apply([pod("p2", ns, template="not-made")])
    local_cluster.kubectl("delete", "pod", "p2", "-n", ns, "--grace-period=0", "--force")
    local_cluster.wait_for(
        lambda: op.metric("dra_operator_watch_events_total", 'resource="pods"') >= pods_seen + 2,
        timeout=30,
        what="the operator seeing p2 come and go",
    )
    time.sleep(2 * slowdown())
    assert local_cluster.get_json("resourceclaim", "c", "-n", ns).get("status", {}).get("allocation") is None
    said = [e for e in events_for(local_cluster, ns, "c") if e["reason"] == "WaitingForScheduler"]
    assert len(said) == 1

    # The pods go: the claim is allocated, its condition gone, its wait counted as kube-scheduler's.
    local_cluster.kubectl("delete", "pod", "p0", "p1", "-n", ns, "--grace-period=0", "--force")
    allocated = local_cluster.wait_for(
        lambda: (
            (c := local_cluster.get_json("resourceclaim", "c", "-n", ns)).get("status", {}).get("allocation")
            and c
        ),
        timeout=30,
        what="claim c allocated",
    )
    assert CONDITION_ANNOTATION not in (allocated["metadata"].get("annotations") or {})
    assert op.metric("dra_operator_allocation_wait_seconds_count", 'reason="scheduler_busy"') == 1
    assert op.metric("dra_operator_claims", 'state="waiting_for_scheduler"') == 0
