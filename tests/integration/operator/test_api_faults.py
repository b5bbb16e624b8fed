"""Operator faults from reliability-scenarios B4 that happen in the API, not in the operator:

- O4: bursts of 5xx, 429 with Retry-After and connection resets, on the operator's claim writes
  and on its lists and watches;
- O6: 410 Gone on the watches, while objects are deleted: the operator re-lists, and its view is as
  if there had been no gap.

The operator talks to the real API server through :class:`FaultProxy`, which forwards every request
it does not fault.
"""

from __future__ import annotations

import json
from typing import Any

from dra_devcluster import LocalCluster
from dra_devcluster.faultproxy import Fault, FaultProxy
from tests.integration.operator.conftest import (
    Operators,
    assert_no_double_booking,
    claims_json,
)
from tests.integration.operator.objects import (
    OPERATOR_FINALIZER,
    add_gpu_node,
    allocated_node,
    claim,
)
from tests.integration.pace import let_pass

CONDITION_ANNOTATION = "dra.accel.dev/condition"


def _allocated(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any] | None:
    obj: dict[str, Any] = cluster.get_json("resourceclaim", name, "-n", ns)
    return obj if (obj.get("status") or {}).get("allocation") else None


def test_api_error_bursts_are_retried_and_retry_after_is_honoured(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    """O4: no claim is lost or half-written, the operator keeps running and says it retries, and
    after a 429 with Retry-After no claim write reaches the server before that time has passed."""
    ns = "op-apierr"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-apierr", 8)
    with FaultProxy(local_cluster) as proxy:
        # One write at a time, so that "the next write after the 429" is well defined.
        op = operators.start("--max-concurrent-writes=1", kubeconfig=proxy.kubeconfig)
        local_cluster.apply([claim("warm", ns, cls=operators.gpu_class)])
        local_cluster.wait_for(lambda: _allocated(local_cluster, ns, "warm"), what="warm-up claim allocated")

        writes = rf"/namespaces/{ns}/resourceclaims/[^/]+(/status)?$"
        claim_lists = r"/apis/resource\.k8s\.io/v1/resourceclaims$"
        faults = [
            proxy.add(Fault("status", code=503, methods=frozenset({"PATCH"}), path=writes, count=3)),
            proxy.add(
                Fault("status", code=429, retry_after=3, methods=frozenset({"PATCH"}), path=writes, count=1)
            ),
            proxy.add(Fault("reset", methods=frozenset({"PATCH"}), path=writes, count=2)),
            proxy.add(Fault("status", code=500, path=writes, count=1)),
            # The claim watch: cut, the next two attempts reset, then a 410 Gone, and its re-lists refused.
            proxy.add(Fault("reset", path=claim_lists, watch=True, count=2)),
            proxy.add(Fault("gone", path=claim_lists, watch=True, count=1)),  # so it lists again
            proxy.add(Fault("status", code=500, path=claim_lists, watch=False, count=2)),
        ]
        proxy.drop_streams()
        names = [f"c{i}" for i in range(6)]
        local_cluster.apply([claim(n, ns, cls=operators.gpu_class) for n in names])

        def all_allocated() -> list[dict[str, Any]] | None:
            found = claims_json(local_cluster, ns)
            done = [c for c in found if (c.get("status") or {}).get("allocation")]
            return found if len(done) == 7 else None

        items = local_cluster.wait_for(
            all_allocated, timeout=120, what="all 7 claims allocated through the faults"
        )
        records = proxy.records()

    assert [f.hits for f in faults] == [f.count for f in faults], [(f.action, f.code, f.hits) for f in faults]
    assert op.proc.poll() is None, op.log_tail()
    assert_no_double_booking(items)
    for c in items:
        assert OPERATOR_FINALIZER in c["metadata"].get("finalizers", []), c["metadata"]
    log = op.log.read_text(errors="replace")
    assert "PermanentError" not in log
    assert "will retry" in log, op.log_tail()
    assert op.metric("dra_operator_api_retries_total", 'cause="429"') == 1
    assert op.metric("dra_operator_api_retries_total", 'cause="503"') == 3

    throttled = [r for r in records if r.outcome == "injected:429"]
    assert len(throttled) == 1
    later_writes = [
        r
        for r in records
        if r.method == "PATCH" and f"/namespaces/{ns}/resourceclaims/" in r.path and r.at > throttled[0].at
    ]
    assert later_writes, "no claim write after the 429"
    assert min(r.at for r in later_writes) - throttled[0].at >= 3.0, later_writes[:3]


def test_objects_deleted_during_a_watch_gap_leave_the_model(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    """O6: while every watch of claims and slices gets 410 Gone, a claim that held the only device of
    one node is deleted, and the slice of another node too. The watches re-list, which shows neither
    deletion; the operator re-lists as well. Afterwards two new claims find what a gap-free view
    finds: the freed device on the first node, and nothing on the second."""
    ns = "op-gap"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-gap-1", 1)
    add_gpu_node(local_cluster, scratch, "op-gap-2", 1)
    # "held" is allocated by someone else (no operator finalizer) to op-gap-1's only GPU.
    local_cluster.apply([claim("held", ns, cls=operators.gpu_class)])
    allocation = {
        "devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "op-gap-1", "device": "gpu-0"}]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["op-gap-1"]}]}
            ]
        },
    }
    local_cluster.kubectl(
        "patch",
        "resourceclaim",
        "held",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"allocation": allocation}}),
    )

    with FaultProxy(local_cluster) as proxy:
        op = operators.start(kubeconfig=proxy.kubeconfig)
        # The operator creates its classes right after its first full listing: from then on "held"
        # and both slices are in its model.
        local_cluster.wait_for(
            lambda: (
                local_cluster.kubectl("get", "deviceclass", operators.gpu_class, check=False).returncode == 0
            ),
            what="the operator synced",
        )
        gap = proxy.add(
            Fault("gone", watch=True, path=r"/apis/resource\.k8s\.io/v1/(resourceclaims|resourceslices)$")
        )
        proxy.drop_streams()
        local_cluster.kubectl("delete", "resourceclaim", "held", "-n", ns)
        local_cluster.kubectl("delete", "resourceslice", "op-gap-2-gpu.nvidia.com")
        at_delete = {
            kind: op.metric("dra_operator_relists_total", f'resource="{kind}"')
            for kind in ("resourceclaims", "resourceslices")
        }
        # A re-list that began before the deletions may end after them; the one after that cannot.
        local_cluster.wait_for(
            lambda: all(
                op.metric("dra_operator_relists_total", f'resource="{kind}"') >= at_delete[kind] + 2
                for kind in at_delete
            ),
            timeout=60,
            what="the operator re-listed claims and slices after the deletions",
        )
        assert gap.hits >= 2
        proxy.remove(gap)
        proxy.drop_streams()

        local_cluster.apply(
            [claim("a", ns, cls=operators.gpu_class), claim("b", ns, cls=operators.gpu_class)]
        )

        def settled() -> list[dict[str, Any]] | None:
            items = [c for c in claims_json(local_cluster, ns) if c["metadata"]["name"] in ("a", "b")]
            allocated = [c for c in items if (c.get("status") or {}).get("allocation")]
            refused = [c for c in items if CONDITION_ANNOTATION in c["metadata"].get("annotations", {})]
            return items if len(allocated) == 1 and len(refused) == 1 else None

        items = local_cluster.wait_for(settled, timeout=60, what="one claim allocated, one explained")
        let_pass(2)  # nothing else happens afterwards: the refused claim stays refused
        items = [c for c in claims_json(local_cluster, ns) if c["metadata"]["name"] in ("a", "b")]

    allocated = [c for c in items if (c.get("status") or {}).get("allocation")]
    assert len(allocated) == 1, items
    assert allocated_node(allocated[0]) == "op-gap-1", allocated[0]["status"]["allocation"]
    refused = next(c for c in items if c is not allocated[0])
    condition = json.loads(refused["metadata"]["annotations"][CONDITION_ANNOTATION])
    assert condition["status"] == "False", condition
    assert op.proc.poll() is None, op.log_tail()
