"""O5: the API server stalls (SIGSTOP: connections stay open, nothing arrives). /healthz must fail
while no heartbeat comes back on the watch, and everything changed meanwhile is handled after."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from dra_devcluster import LocalCluster
from tests.integration.operator.conftest import Operators
from tests.integration.operator.objects import add_gpu_node, claim


def _apiserver_pid(cluster: LocalCluster) -> int:
    for pid in cluster.pids():
        if b"kube-apiserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError("no kube-apiserver process")


def test_healthz_fails_while_the_watch_is_stalled_and_recovers(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    ns = "op-stall"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-stall", 2)
    op = operators.start("--liveness-stale-after-seconds=5", "--heartbeat-interval-seconds=1")
    local_cluster.apply([claim("before", ns, cls=operators.gpu_class)])
    local_cluster.wait_for(
        lambda: (
            local_cluster.get_json("resourceclaim", "before", "-n", ns).get("status", {}).get("allocation")
        ),
        what="claim allocated before the stall",
    )
    assert op.get("/healthz")[0] == 200

    apiserver = _apiserver_pid(local_cluster)
    os.kill(apiserver, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        status, text = op.get("/healthz")
        while status == 200 and time.monotonic() < deadline:
            time.sleep(0.5)
            status, text = op.get("/healthz")
        assert status == 500, text
        assert "no heartbeat" in text
    finally:
        os.kill(apiserver, signal.SIGCONT)

    local_cluster.apply([claim("after", ns, cls=operators.gpu_class)])
    local_cluster.wait_for(
        lambda: (
            local_cluster.get_json("resourceclaim", "after", "-n", ns).get("status", {}).get("allocation")
        ),
        timeout=120,
        what="claim allocated after the stall",
    )
    local_cluster.wait_for(lambda: op.get("/healthz")[0] == 200, timeout=60, what="healthy again")
