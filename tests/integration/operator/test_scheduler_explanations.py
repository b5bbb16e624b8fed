"""Claims kube-scheduler owns and leaves pending get the operator's explanation as an Event, and
nothing else from the operator."""

from __future__ import annotations

from typing import Any

from dra_devcluster import LocalCluster
from dra_operator.base.settings import Settings
from dra_operator.upkeep.deviceclasses import desired_classes
from tests.integration.operator.conftest import Operators, claims_json, events_for
from tests.integration.operator.objects import (
    CONDITION_ANNOTATION,
    OPERATOR_FINALIZER,
    add_gpu_node,
    claim_template,
    pod,
)
from tests.integration.pace import let_pass

REASON = "NotAllocatableYet"
GRACE_S = 2
# Managers that may write a template claim of a pod that cannot be scheduled; the operator is not one.
KUBERNETES_MANAGERS = {"kube-controller-manager", "kube-scheduler"}


def _unschedulable(cluster: LocalCluster, ns: str, name: str) -> bool:
    conditions = (cluster.get_json("pod", name, "-n", ns).get("status") or {}).get("conditions") or []
    return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)


def _managers(claim: dict[str, Any]) -> set[str]:
    return {entry["manager"] for entry in claim["metadata"].get("managedFields") or []}


def _explanations(cluster: LocalCluster, ns: str, name: str) -> list[dict[str, Any]]:
    return [e for e in events_for(cluster, ns, name) if e["reason"] == REASON]


def test_a_template_claim_asking_too_much_gets_one_explanation_and_is_never_written(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    ns = "op-sched-explain"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-sx", 2)
    # The class as the operator keeps it, before the operator runs: kube-scheduler has judged the
    # claim (and the claim is as Kubernetes wrote it) before the operator can touch anything.
    settings = Settings(gpu_class=operators.gpu_class, tpu_class=operators.tpu_class)
    local_cluster.apply([desired_classes(settings)[operators.gpu_class]])
    # More GPUs than any node of the cluster has (32, the most one claim may ask for), so neither
    # allocator can place it.
    local_cluster.apply(
        [claim_template("tpl", ns, cls=operators.gpu_class, count=32), pod("p", ns, template="tpl")]
    )
    local_cluster.wait_for(lambda: _unschedulable(local_cluster, ns, "p"), what="pod p Unschedulable")
    (before,) = claims_json(local_cluster, ns)
    name = before["metadata"]["name"]
    assert not (before.get("status") or {}).get("allocation")

    op = operators.start(f"--scheduler-pending-explain-after-seconds={GRACE_S}")
    (event,) = local_cluster.wait_for(
        lambda: _explanations(local_cluster, ns, name), timeout=60, what="the NotAllocatableYet Event"
    )
    assert event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == before["metadata"]["uid"]
    message = event["message"]
    assert f"has not scheduled pod {ns}/p" in message
    assert f"wants 32 of class {operators.gpu_class}" in message
    assert "cannot be allocated" in message
    assert "match the class" in message
    assert "needs 32" in message

    # The explainer passes once a second at this grace; over several passes it says nothing more
    # (the rate limit is 5 minutes) and writes nothing to the claim.
    let_pass(5 * GRACE_S)
    events = _explanations(local_cluster, ns, name)
    assert len(events) == 1, events
    assert events[0].get("count", 1) == 1, events
    assert op.metric("dra_operator_scheduler_claim_explanations_total") == 1
    (after,) = claims_json(local_cluster, ns)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert OPERATOR_FINALIZER not in after["metadata"].get("finalizers", [])
    assert CONDITION_ANNOTATION not in (after["metadata"].get("annotations") or {})
    new_managers = _managers(after) - _managers(before)
    assert new_managers <= KUBERNETES_MANAGERS, after["metadata"].get("managedFields")
    assert not (after.get("status") or {}).get("allocation")
