"""Standalone claims keep being allocated while kube-scheduler keeps placing pods (issue 28).

The scenario of :mod:`bench.scheduler_busy`, shortened for CI: four Node objects of 8 GPUs, a pod
with a one-GPU template claim every second (kube-scheduler allocates it), each deleted six seconds
after its creation, and a standalone one-GPU claim (the operator's) every two seconds, deleted once
allocated. Before the fix every pod that started being scheduled held the operator back for 2 s, so
at this rate the hold never ended: one standalone claim of thirty was allocated while the pods came.

The bound is the issue's: every standalone claim allocated within 10 s of its creation. Every change
of every claim in the namespace, kube-scheduler's included, is checked for a device held twice.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.operator_chaos import OperatorControl
from bench.scheduler_busy import BusyConfig, operator_process, prepare_cluster, run_round
from dra_devcluster import LocalCluster
from tests.integration.operator.conftest import INDEX_DISAGREES

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
    prepare_cluster(local_cluster, config=config)
    log = tmp_path / "operator.log"
    operator = OperatorControl(
        operator_process(
            kubeconfig=local_cluster.kubeconfig,
            log=log,
            config=config,
            extra=("--tpu-class=op-busy-tpu", "--verify-placer-index=true"),
        ),
        log,
    )
    operator.start()
    try:
        local_cluster.wait_for(
            lambda: (
                local_cluster.kubectl("get", "deviceclass", config.gpu_class, check=False).returncode == 0
            ),
            what="the operator's GPU class",
        )
        report = asyncio.run(run_round(kubeconfig=local_cluster.kubeconfig, config=config))
    finally:
        operator.kill()
        for node in config.nodes:
            local_cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false", check=False)
        local_cluster.kubectl(
            "delete", "resourceslice", *(f"{n}-gpu" for n in config.nodes), "--ignore-not-found", check=False
        )
        local_cluster.kubectl("delete", "namespace", config.namespace, "--wait=false", check=False)
        local_cluster.kubectl(
            "delete", "deviceclass", config.gpu_class, "op-busy-tpu", "--ignore-not-found", check=False
        )

    summary = report.summary()
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    # The stream ran: pods and claims at their rates, and kube-scheduler placed every pod in it.
    assert report.pods_created >= 40, summary
    assert report.claims_created >= 20, summary
    assert report.pods_unbound == 0, summary
    # Every standalone claim allocated, each within the bound, while the pods kept coming.
    assert report.waiting == [], f"{summary}\nlog tail:\n{tail}"
    assert len(report.waits) == report.claims_created, summary
    slow = {name: round(wait, 2) for name, wait in report.waits.items() if wait > BOUND_S}
    assert slow == {}, f"{summary}\nlog tail:\n{tail}"
    # No device ever in two claims, counting every allocation of both allocators.
    assert report.allocations_seen >= report.pods_created + report.claims_created - 5, summary
    assert report.double_bookings == [], summary
    assert operator.log_count(INDEX_DISAGREES) == 0, summary
