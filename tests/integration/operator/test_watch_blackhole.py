"""O5 (reliability-scenarios B4): watch blackhole, a silent TCP stall.

The operator talks to the real API server through :class:`FaultProxy`. Its open watch streams are
stalled: they stay open and carry nothing more, no event, no bookmark, no end, as behind a NAT or a
proxy that lost the connection without telling either side. Claims created meanwhile (with the
admin client, around the proxy) reach the operator only if it notices the silence by itself, drops
the streams and watches again. The stall outlasts the (test-lowered) inactivity timeout; the proxy
never ends the stalled streams, so nothing but the operator's own deadline can recover them.
"""

from __future__ import annotations

import re
from typing import Any

from dra_devcluster import LocalCluster
from dra_devcluster.faultproxy import Blackhole, FaultProxy
from tests.integration.operator.conftest import (
    OperatorProcess,
    Operators,
    assert_no_double_booking,
    claims_json,
    device_ids,
)
from tests.integration.operator.objects import OPERATOR_FINALIZER, add_gpu_node, claim

INACTIVITY_S = 6  # the test's --watch-inactivity-timeout-seconds (default 70)
SILENT = 'reason="inactive",resource="resourceclaims"'  # as /metrics orders labels


def _all_allocated(cluster: LocalCluster, ns: str, total: int) -> list[dict[str, Any]] | None:
    items = claims_json(cluster, ns)
    done = [c for c in items if (c.get("status") or {}).get("allocation")]
    return items if len(items) == total and len(done) == total else None


def _silent_drops(op: OperatorProcess) -> float:
    return op.metric("dra_operator_watch_restarts_total", SILENT)


def _allocated_names(cluster: LocalCluster, ns: str) -> set[str]:
    return {
        c["metadata"]["name"] for c in claims_json(cluster, ns) if (c.get("status") or {}).get("allocation")
    }


def test_stalled_watches_are_dropped_and_every_claim_is_allocated_once(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    """Phase 1: the API server is unreachable for the operator's reads (every GET held: watches open
    and new, and lists) for longer than the inactivity timeout while claims are created; nothing can
    allocate them then. Once the stall lifts, the operator catches up. Phase 2: the open watches
    stall for good while new connections pass; the operator drops the stalled streams on its own and
    allocates the claims created meanwhile. Every claim ends with one allocation, no device in two
    claims, and exactly one allocation write per claim reached the API server."""
    ns = "op-blackhole"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-blackhole", 8)
    with FaultProxy(local_cluster) as proxy:
        op = operators.start(
            f"--watch-inactivity-timeout-seconds={INACTIVITY_S}", kubeconfig=proxy.kubeconfig
        )
        local_cluster.apply([claim("warm", ns, cls=operators.gpu_class)])
        local_cluster.wait_for(
            lambda: _all_allocated(local_cluster, ns, 1), timeout=60, what="warm-up claim allocated"
        )

        # Phase 1. Lists are held too, so that no re-list (one requested by the operator's start-up,
        # say) can find the claims while the watches are cut off: only a watch that reconnects can.
        before = _silent_drops(op)
        cut_off = proxy.blackhole(Blackhole(watch=None, methods=frozenset({"GET"})))
        local_cluster.apply([claim(f"a{i}", ns, cls=operators.gpu_class) for i in range(3)])
        # Two silent drops in a row: the stalled stream, then a reconnect that was held as well.
        local_cluster.wait_for(
            lambda: _silent_drops(op) >= before + 2,
            timeout=240,
            interval=0.5,
            what="the operator dropped its stalled claim watch and a held reconnect",
        )
        assert cut_off.stalled >= 1
        assert cut_off.held >= 1
        assert _allocated_names(local_cluster, ns) == {"warm"}
        proxy.lift(cut_off)
        local_cluster.wait_for(
            lambda: _all_allocated(local_cluster, ns, 4),
            timeout=240,
            interval=0.5,
            what="the 3 claims created while the watches were cut off allocated",
        )

        # Phase 2: every watch open now stalls until the end of the test; new ones pass.
        before = _silent_drops(op)
        stall = proxy.blackhole(Blackhole(new=False))
        local_cluster.apply([claim(f"b{i}", ns, cls=operators.gpu_class) for i in range(4)])
        items = local_cluster.wait_for(
            lambda: _all_allocated(local_cluster, ns, 8),
            timeout=240,
            interval=0.5,
            what="the 4 claims created during the stall allocated",
        )
        assert stall.stalled >= 1
        assert _silent_drops(op) >= before + 1, op.log_tail()
        records = proxy.records()

    assert op.proc.poll() is None, op.log_tail()
    log = op.log.read_text(errors="replace")
    assert "the claim watch went silent" in log
    assert "PermanentError" not in log
    assert_no_double_booking(items)
    for c in items:
        assert len(device_ids(c)) == 1, c["status"]["allocation"]
        assert OPERATOR_FINALIZER in c["metadata"].get("finalizers", []), c["metadata"]
    # Allocated once: one successful status write per claim (a repeated allocation after a
    # reconnect would show as a second one).
    status_write = re.compile(rf"^/apis/resource\.k8s\.io/v1/namespaces/{ns}/resourceclaims/([^/]+)/status$")
    writes: dict[str, int] = {}
    for r in records:
        if (
            (m := status_write.match(r.path))
            and r.method in ("PATCH", "PUT")
            and r.outcome == "forwarded:200"
        ):
            writes[m[1]] = writes.get(m[1], 0) + 1
    assert writes == {c["metadata"]["name"]: 1 for c in items}, writes
