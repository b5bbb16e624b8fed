"""Failover between two operator instances (issue: takeover in seconds, not a minute).

Real processes against the real control plane. The driver is :mod:`bench.operator_failover`, whose
``main`` takes the recorded figures; here it runs one SIGKILL and one SIGTERM round with the
default timing, with claims arriving before, during and after each, and checks that every claim
was allocated exactly once and no device went to two claims. The takeover times are printed, not
asserted. The fencing test cuts the active instance's keep-alive (only those requests fail, its
claim writes would still go through) and shows that its last claim write reached the API server
before the standby's first one.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from bench.operator_failover import Failover, FailoverConfig, allocation_counts
from dra_devcluster import LocalCluster
from dra_devcluster.faultproxy import Fault, FaultProxy
from tests.integration.operator.conftest import (
    OperatorProcess,
    Operators,
    assert_no_double_booking,
    claims_json,
)
from tests.integration.operator.objects import add_gpu_node, claim

CLAIM_WRITES = r"/resourceclaims/[^/]+(/status)?$"
WRITE_METHODS = frozenset({"PATCH", "PUT", "POST", "DELETE"})


def test_sigkill_and_sigterm_failover_with_claims_arriving(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    config = FailoverConfig(
        namespace="op-failover",
        gpu_class="op-failover-gpu",
        tpu_class="op-failover-tpu",
        driver="failover.gpu.example.com",
        nodes=("op-failover-a", "op-failover-b"),
        gpus=32,
    )
    failover = Failover(cluster=local_cluster, config=config, workdir=tmp_path)
    failover.prepare()
    try:
        failover.run([signal.SIGKILL, signal.SIGTERM])
    finally:
        failover.stop()
        for node in config.nodes:
            local_cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false", check=False)
        local_cluster.kubectl(
            "delete", "resourceslice", *(f"{n}-gpu" for n in config.nodes), "--ignore-not-found", check=False
        )
        local_cluster.kubectl("delete", "namespace", config.namespace, "--wait=false", check=False)
        local_cluster.kubectl(
            "delete", "deviceclass", config.gpu_class, config.tpu_class, "--ignore-not-found", check=False
        )
    report = failover.report
    for r in report.rounds:
        print(f"{r.kind}: {r.old} -> {r.new}, first allocation {r.takeover_s:.2f} s after the signal")
    assert [r.kind for r in report.rounds] == ["SIGKILL", "SIGTERM"]
    assert not report.problems, report.problems
    assert all(r.claims >= 4 for r in report.rounds), report.rounds
    for r in report.rounds:
        # The new active instance listed the cluster while standing by, and takes over with the
        # model its watches kept current: it lists nothing before its first write.
        lines = (
            next(i for i in failover.instances if i.name == r.new)
            .log.read_text(errors="replace")
            .splitlines()
        )
        # An instance that starts alone is active until its higher-priority peer's entry appears
        # (on a loaded machine the peer may write it after this one's first renewal), so the round's
        # "now active" is the last one before the takeover, not the first in the log.
        synced = next(n for n, line in enumerate(lines) if "model synced" in line)
        took = next(n for n, line in enumerate(lines) if "taking over with the model kept current" in line)
        became = max(n for n, line in enumerate(lines[:took]) if "this instance is now active" in line)
        first = next(n for n, line in enumerate(lines) if ": allocated " in line)
        assert synced < became < took < first, "\n".join(lines[synced : first + 1])
        assert not any("model synced" in line for line in lines[became:first]), lines[became : first + 1]
    stopped = next(i for i in failover.instances if i.name == report.rounds[1].old)
    text = stopped.log.read_text(errors="replace")
    assert "SIGTERM received: handing over to the standby" in text
    assert "removed this instance from peering object" in text


def _metric_or_none(op: OperatorProcess, name: str) -> float | None:
    status, _ = op.get("/metrics")
    return op.metric(name) if status == 200 else None


def test_an_instance_cut_off_from_its_keep_alive_stops_writing_before_the_standby_starts(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    ns = "op-fence"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-fence", 16)
    with FaultProxy(local_cluster) as via_a, FaultProxy(local_cluster) as via_b:
        a = operators.start("--priority=100", kubeconfig=via_a.kubeconfig, name="a")
        b = operators.start("--priority=50", kubeconfig=via_b.kubeconfig, name="b", wait_active=False)
        local_cluster.wait_for(
            lambda: _metric_or_none(b, "dra_operator_active") == 0.0, timeout=60, what="b up as the standby"
        )
        local_cluster.apply([claim(f"before{i}", ns, cls=operators.gpu_class) for i in range(3)])
        local_cluster.wait_for(
            lambda: a.metric("dra_operator_allocations_total") == 3, timeout=60, what="a allocates"
        )
        # Only a's keep-alive fails (its own and Kopf's); its claim writes would still go through.
        cut = via_a.add(
            Fault("status", code=503, methods=frozenset({"PATCH"}), path=r"/clusterkopfpeerings/")
        )
        # Claims keep arriving, one a second, across the step-down and the takeover: at least
        # twelve, and on until a has stepped down and b has allocated one, however long the
        # machine takes to get there.
        names: list[str] = []
        deadline = time.monotonic() + 180

        def taken_over() -> bool:
            return a.metric("dra_operator_active") == 0 and b.metric("dra_operator_allocations_total") > 0

        while len(names) < 12 or not taken_over():
            assert time.monotonic() < deadline, f"no takeover after {len(names)} claims:\n{b.log_tail()}"
            names.append(f"during{len(names)}")
            local_cluster.apply([claim(names[-1], ns, cls=operators.gpu_class)])
            time.sleep(1.0)

        def settled() -> bool:
            items = claims_json(local_cluster, ns)
            done = [c for c in items if (c.get("status") or {}).get("allocation")]
            return len(done) == len(items) == 3 + len(names)

        local_cluster.wait_for(settled, timeout=90, what="the standby took over and allocated the rest")
        assert a.metric("dra_operator_active") == 0
        assert b.metric("dra_operator_active") == 1
        assert cut.hits > 0
        assert "stepped down: no keep-alive renewed" in a.log.read_text(errors="replace")

        def claim_writes(proxy: FaultProxy) -> list[float]:
            return [
                r.at
                for r in proxy.records()
                if r.method in WRITE_METHODS
                and r.outcome.startswith("forwarded:2")
                and re.search(CLAIM_WRITES, r.path)
            ]

        a_writes, b_writes = claim_writes(via_a), claim_writes(via_b)
        assert a_writes, "a wrote no claim"
        assert b_writes, "b wrote no claim"
        assert max(a_writes) < min(b_writes), "a claim write of the cut-off instance came after the standby's"

        items = claims_json(local_cluster, ns)
        assert_no_double_booking(items)
        counts = allocation_counts([a.log, b.log], ns)
        assert counts == {c["metadata"]["name"]: 1 for c in items}

        # The keep-alive gets through again: the higher priority returns, after giving b one renew
        # interval to see it, and b goes back to standby.
        via_a.remove(cut)
        local_cluster.wait_for(
            lambda: a.metric("dra_operator_active") == 1 and b.metric("dra_operator_active") == 0,
            timeout=60,
            what="a active again, b standby",
        )
        # Stopped while their proxies still forward (the fixture would stop them after).
        a.stop()
        b.stop()


def test_sigterm_with_the_api_server_gone_still_exits_in_order(
    local_cluster: LocalCluster, operators: Operators
) -> None:
    """With the API server unreachable, SIGTERM still ends the operator in order and soon: it
    stops writing, says that it could not remove its keep-alive (so the standby waits out the
    lifetime), and exits 0 without a traceback. Kopf runs standalone, so it has no farewell of its
    own to retry; the operator's grace period (STOP_GRACE_S) bounds the stop either way."""
    with FaultProxy(local_cluster) as proxy:
        op = operators.start(kubeconfig=proxy.kubeconfig, name="gone")
        proxy.stop()
        op.proc.send_signal(signal.SIGTERM)
        assert op.proc.wait(timeout=60) == 0
    text = op.log.read_text(errors="replace")
    after = text.split("SIGTERM received", 1)[1]
    assert "stepped down: this instance is stopping" in after
    assert "could not remove this instance from peering object" in after
    assert "Traceback" not in after
