"""Chaos: standalone claims and template pods churn, pods are force-deleted and the operator is
SIGKILLed at random moments; afterwards the cluster settles with nothing double-booked, stuck or
spinning. The driver is :mod:`bench.operator_chaos`, whose ``main`` is the long soak; as the churn
ends it also stages the race kube-scheduler sometimes loses to the operator (both write one device).
On the code before the fix for issue 18 the operator then re-placed its released claim on the
device the scheduler's claim held, thousands of times a second."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.operator_chaos import (
    ChaosConfig,
    OperatorControl,
    operator_process,
    prepare_cluster,
    run_chaos,
)
from dra_devcluster import LocalCluster
from tests.integration.operator.conftest import INDEX_DISAGREES, install_peering


def test_operator_restarts_under_churn_settle_without_double_booking_or_spinning(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    ns = "op-chaos"
    config = ChaosConfig(
        namespace=ns,
        gpu_class="op-chaos-gpu",
        driver="chaos.gpu.example.com",
        nodes=("op-chaos-a", "op-chaos-b"),
        gpus=4,
        # 50 s of churn, then on until it has done what the assertions below count: a loaded
        # machine does fewer actions a second, not fewer actions.
        duration_s=50.0,
        actions_per_s=8.0,
        kill_every_s=(4.0, 12.0),
        max_claims=14,
        settle_timeout_s=150.0,
        quiet_window_s=10.0,
        seed=7,
        at_least={
            "kills": 3,
            "claim created": 20,
            "pod created": 20,
            "pod force-deleted": 5,
            "samples": 50,
        },
    )
    install_peering(local_cluster)
    prepare_cluster(local_cluster, config=config)
    log = tmp_path / "operator.log"
    operator = OperatorControl(
        operator_process(
            kubeconfig=local_cluster.kubeconfig,
            log=log,
            config=config,
            extra=("--tpu-class=op-chaos-tpu",),
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
        report = asyncio.run(run_chaos(kubeconfig=local_cluster.kubeconfig, config=config, operator=operator))
    finally:
        operator.kill()
        for node in config.nodes:
            local_cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false", check=False)
        local_cluster.kubectl(
            "delete", "resourceslice", *(f"{n}-gpu" for n in config.nodes), "--ignore-not-found", check=False
        )
        local_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        local_cluster.kubectl(
            "delete", "deviceclass", config.gpu_class, "op-chaos-tpu", "--ignore-not-found", check=False
        )

    summary = report.summary()
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    # The churn happened, with restarts in it, and was watched throughout.
    assert report.churn_short_of == {}, summary
    assert report.kills >= 3, summary
    assert report.actions["claim created"] >= 20, summary
    assert report.actions["pod created"] >= 20, summary
    assert report.actions["pod force-deleted"] >= 5, summary
    assert report.actions["race lost by the scheduler"] == 1, summary
    assert report.samples >= 50, summary
    # Nothing double-booked, ever; every claim that fits allocated; nothing stuck.
    assert report.double_bookings == [], f"{summary}\n" + "\n".join(report.double_bookings[:10])
    assert report.settled, f"{summary}\nnot settled: " + "\n".join(report.problems) + f"\nlog tail:\n{tail}"
    # Bounded: the operator's log grows with the work it was given, not with time; once settled
    # it neither logs nor burns CPU (a spinning reconcile loop uses a whole core).
    actions = sum(report.actions.values())
    assert report.log_lines <= 30 * actions + 300 * operator.starts, summary
    assert report.quiet_replacing_lines == 0, summary
    assert report.quiet_log_bytes < 20_000, summary
    assert report.quiet_cpu_s < 0.5 * config.quiet_window_s, summary
    # The operator compared its placement index with its model after every event: no disagreement.
    assert operator.log_count(INDEX_DISAGREES) == 0, summary
