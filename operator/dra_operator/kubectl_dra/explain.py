"""``kubectl dra explain CLAIM``: why a claim is pending, or where it went and why it fits.

A pending claim is run through :func:`dra_operator.entry.simulate.plan` on the cluster's current objects,
with every other claim's allocation holding its devices: the printed text is what ``dra-operator
simulate`` prints for the same objects, and ``message`` (in ``-o json|yaml``) is what the operator
writes in its Event and condition (``NoFit``: the explanation's one-line form). ``--node`` asks the
same question for one node only (what if the claim went there); for an allocated claim it asks it
as if the claim were pending, its own devices free.

A pending claim the operator is holding back for kube-scheduler (its condition says
``WaitingForScheduler``) also shows that condition: why it waits and since when. The what-if above
it is the allocator's answer alone, which does not wait for anyone.

An allocated claim shows the node, its devices with their health now, and the allocator's count of
that node's devices through each check (class, selectors, free, untainted, counters, capacity),
its own devices counted free: why it fits there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dra_api.model import ALL, Node, ResourceClaim, ResourceClaimStatus
from dra_operator.allocator import AllocationError, FeatureGates, RequestFunnel
from dra_operator.base.settings import SEARCH_BUDGET_S
from dra_operator.claims.status import describe_allocation
from dra_operator.entry.simulate import plan, render, result_of
from dra_operator.kubectl_dra.claims_command import allocator, consumers, state
from dra_operator.kubectl_dra.cluster import ClaimObject, ClusterObjects, node_of
from dra_operator.kubectl_dra.devices import health, taint_text
from dra_operator.planner import NotPlaced, OutOfBudget, PlanError, Planner, PlanOutcome
from dra_operator.scheduler.waits import WAITING_REASON

ALLOCATABLE = 0
NOT_ALLOCATABLE = 1


@dataclass(frozen=True, slots=True)
class Explained:
    text: str
    """What the table output prints."""
    code: int
    """0: allocated, or would be; 1: cannot be allocated (there)."""
    data: dict[str, Any]
    """What ``-o json|yaml`` prints."""


def operator_message(outcome: PlanOutcome) -> tuple[str, str]:
    """(reason, message) of the Event the operator posts for this outcome of its placement."""
    if isinstance(outcome, PlanError):
        return outcome.reason, outcome.message[:1024]
    if isinstance(outcome, NotPlaced):
        return ("InvalidResourceSlices" if outcome.invalid_pools else "NoFit"), outcome.explanation.short
    if isinstance(outcome, OutOfBudget):
        return "SearchBudgetExhausted", outcome.explanation.short
    return "Allocated", describe_allocation(
        outcome.allocations[0], outcome.node if outcome.node_bound else None
    )


def _others(cluster: ClusterObjects, obj: ClaimObject) -> list[Any]:
    return [
        c.claim.status.allocation
        for c in cluster.claims
        if c.claim.status.allocation is not None and c.key != obj.key
    ]


def _as_pending(claim: ResourceClaim) -> ResourceClaim:
    return dataclasses.replace(claim, status=ResourceClaimStatus())


def _what_if(
    *,
    cluster: ClusterObjects,
    obj: ClaimObject,
    node: str | None,
    gates: FeatureGates,
    policy: str,
    budget_s: float,
) -> Explained:
    claim = _as_pending(obj.claim)
    outcome = plan(
        classes=cluster.classes,
        slices=cluster.slices,
        nodes=cluster.nodes,
        allocated=_others(cluster, obj),
        pending=[claim],
        node=node,
        gates=gates,
        policy=policy,
        budget_s=budget_s,
    )
    result, code = result_of(outcome, pending=[claim], policy=policy)
    text = render(result, "table")
    if result["error"] and result["explanation"]:
        text += f"error: {result['error']}\n"
    reason, message = operator_message(outcome)
    waiting = _waiting(obj) if node is None else None
    if waiting is not None:
        text += (
            f"the operator is waiting for kube-scheduler (since {waiting['since'] or 'an unknown time'}): "
            f"{waiting['message']}\n"
        )
    data = {
        "claim": obj.claim.ref,
        "state": state(obj),
        "allocator": allocator(obj, cluster=cluster),
        "whatIfNode": node,
        "outcome": result["outcome"],
        "node": result["node"],
        "allocation": result["claims"][0]["allocation"],
        "reason": reason,
        "message": message,
        "explanation": result["explanation"],
        "error": result["error"],
        "waitingForScheduler": waiting,
    }
    return Explained(text=text, code=ALLOCATABLE if code == 0 else NOT_ALLOCATABLE, data=data)


def _waiting(obj: ClaimObject) -> dict[str, str] | None:
    """The operator's WaitingForScheduler condition on a pending claim, if it has one."""
    condition = obj.condition
    if obj.claim.status.allocation is not None or condition.get("reason") != WAITING_REASON:
        return None
    return {
        "message": str(condition.get("message") or ""),
        "since": str(condition.get("lastTransitionTime") or ""),
    }


def funnel_text(row: RequestFunnel) -> str:
    """The allocator's count of a node's devices through each check, for one request."""
    wanted = "all of them" if row.mode == ALL else str(row.wanted)
    return (
        f"request {row.request}: {row.devices} devices, {row.class_matched} match class "
        f"{row.device_class}, {row.selectors_kept} match the selectors, {row.free} free, "
        f"{row.untainted} untainted, {row.within_counters} within counters, {row.within_capacity} with "
        f"enough capacity; needs {wanted}"
    )


def _allocated(*, cluster: ClusterObjects, obj: ClaimObject, gates: FeatureGates, policy: str) -> Explained:
    claim = obj.claim
    allocation = claim.status.allocation
    assert allocation is not None
    node = node_of(allocation.node_selector, nodes=cluster.nodes)
    who = allocator(obj, cluster=cluster)
    by = "the operator" if who == "operator" else "kube-scheduler (or another allocator)"
    where = f"on node {node}" if node else "usable from more than one node"
    users = consumers(obj, cluster=cluster)
    lines = [
        f"claim {claim.ref} is allocated {where} by {by}"
        + (f", reserved for {', '.join(users)}" if claim.status.reserved_for else "")
        + (f", used by {', '.join(users)}" if users and not claim.status.reserved_for else "")
        + "."
    ]
    published = {(s.driver, s.pool.name, d.name): d for s in cluster.slices for d in s.devices}
    devices = []
    lines.append("devices:")
    for r in allocation.devices:
        device = published.get((r.driver, r.pool, r.device))
        status = "no longer published" if device is None else health(device.taints)
        taints = [] if device is None else [taint_text(t) for t in device.taints]
        note = status + (f", tainted {', '.join(taints)}" if taints else "")
        if r.tolerations and taints:
            note += " (tolerated by the request)"
        lines.append(f"  request {r.request}: {r.driver}/{r.pool}/{r.device} ({note})")
        devices.append(
            {
                "request": r.request,
                "driver": r.driver,
                "pool": r.pool,
                "device": r.device,
                "health": status,
                "taints": taints,
            }
        )
    fits: list[str] = []
    if node:
        target = next((n for n in cluster.nodes if n.name == node), Node.make(node))
        planner = Planner(
            classes=cluster.classes,
            slices=cluster.slices,
            nodes=[*cluster.nodes, *([target] if target not in cluster.nodes else [])],
            allocated=_others(cluster, obj),
            gates=gates,
            policy=policy,
        )
        try:
            fits = [
                funnel_text(row) for row in planner.allocator.funnel(node=target, claims=[_as_pending(claim)])
            ]
        except AllocationError as exc:
            fits = [f"the allocator fails on this claim now: {' '.join(str(exc).split())}"]
        lines.append(f"why it fits on node {node} (the allocator's checks, its own devices counted free):")
        lines += [f"  {line}" for line in fits]
    data = {
        "claim": claim.ref,
        "state": state(obj),
        "allocator": who,
        "node": node,
        "devices": devices,
        "consumers": list(users),
        "fits": fits,
        "message": describe_allocation(allocation, node),
    }
    return Explained(text="\n".join(lines) + "\n", code=ALLOCATABLE, data=data)


def explain_claim(
    *,
    cluster: ClusterObjects,
    obj: ClaimObject,
    node: str | None,
    gates: FeatureGates,
    policy: str,
    budget_s: float = SEARCH_BUDGET_S,
) -> Explained:
    if obj.claim.status.allocation is None or node is not None:
        return _what_if(cluster=cluster, obj=obj, node=node, gates=gates, policy=policy, budget_s=budget_s)
    return _allocated(cluster=cluster, obj=obj, gates=gates, policy=policy)
