"""``kubectl dra claims``: each claim's state, allocator, node, devices, consumers and age."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from dra_operator.kubectl_dra.cluster import ClaimObject, ClusterObjects, node_of
from dra_operator.kubectl_dra.output import NONE, as_list, dump, human_age, joined, table
from dra_operator.reconcile.ownership import allocated_by_us, is_ours, request_classes
from dra_operator.settings import Ownership

OPERATOR = "operator"
SCHEDULER = "scheduler"


@dataclass(frozen=True, slots=True)
class ClaimRow:
    namespace: str
    name: str
    state: str
    allocator: str
    node: str
    devices: tuple[str, ...]
    """driver/pool/device of each allocated device."""
    consumers: tuple[str, ...]
    age_seconds: float | None
    classes: tuple[str, ...]
    reason: str
    """The reason of the operator's condition on the claim (NoFit, ...), if it wrote one."""

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state,
            "allocator": self.allocator,
            "node": self.node or None,
            "devices": list(self.devices),
            "consumers": list(self.consumers),
            "ageSeconds": None if self.age_seconds is None else int(self.age_seconds),
            "classes": list(self.classes),
            "reason": self.reason or None,
        }


def state(obj: ClaimObject) -> str:
    """As ``kubectl get resourceclaims`` prints it: pending or allocated, then reserved, deleted."""
    claim = obj.claim
    parts = []
    if claim.metadata.deletion_timestamp is not None:
        parts.append("deleted")
    parts.append("allocated" if claim.status.allocation is not None else "pending")
    if claim.status.reserved_for:
        parts.append("reserved")
    return ",".join(parts)


def allocator(obj: ClaimObject, *, cluster: ClusterObjects) -> str:
    """Who allocated the claim (the operator marks its claims with its finalizer), or for a pending
    one who is expected to: the operator for standalone claims of its classes (its default
    ownership), kube-scheduler otherwise."""
    claim = obj.claim
    if claim.status.allocation is not None:
        return OPERATOR if allocated_by_us(claim) else SCHEDULER
    ours = is_ours(claim, ownership=Ownership.STANDALONE, classes=cluster.managed_classes)
    return OPERATOR if ours else SCHEDULER


def consumers(obj: ClaimObject, *, cluster: ClusterObjects) -> tuple[str, ...]:
    """``pod/name`` for the claim's reservedFor entries and the pods that name it."""
    claim = obj.claim
    out: dict[str, None] = {}
    for ref in claim.status.reserved_for:
        kind = "pod" if ref.resource == "pods" and not ref.api_group else ref.resource
        out[f"{kind}/{ref.name}"] = None
    for pod in cluster.pods_using(claim.namespace, claim.name):
        out[f"pod/{pod.name}"] = None
    return tuple(out)


def age_seconds(created: str, *, now: datetime.datetime) -> float | None:
    try:
        stamp = datetime.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None
    return (now - stamp).total_seconds()


def claim_rows(*, cluster: ClusterObjects, namespace: str | None, now: datetime.datetime) -> list[ClaimRow]:
    """One row per claim, of ``namespace`` (None: every namespace), by namespace and name."""
    rows = []
    for obj in cluster.claims:
        claim = obj.claim
        if namespace is not None and claim.namespace != namespace:
            continue
        allocation = claim.status.allocation
        node = node_of(allocation.node_selector, nodes=cluster.nodes) if allocation is not None else None
        rows.append(
            ClaimRow(
                namespace=claim.namespace,
                name=claim.name,
                state=state(obj),
                allocator=allocator(obj, cluster=cluster),
                node=node or "",
                devices=tuple(f"{r.driver}/{r.pool}/{r.device}" for r in allocation.devices)
                if allocation is not None
                else (),
                consumers=consumers(obj, cluster=cluster),
                age_seconds=age_seconds(obj.created, now=now),
                classes=tuple(sorted(request_classes(claim))),
                reason=str(obj.condition.get("reason") or "") if allocation is None else "",
            )
        )
    return rows


def render_claims(rows: list[ClaimRow], *, output: str, all_namespaces: bool) -> str:
    if output in ("json", "yaml"):
        return dump(as_list([{"kind": "ResourceClaimRow", **r.to_json()} for r in rows]), output)
    header = ["NAME", "STATE", "ALLOCATOR", "NODE", "DEVICES", "CONSUMERS", "AGE"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    if output == "wide":
        header += ["CLASSES", "REASON"]
    cells = []
    for r in rows:
        row = [
            r.name,
            r.state,
            r.allocator,
            r.node,
            joined(r.devices),
            joined(r.consumers),
            NONE if r.age_seconds is None else human_age(r.age_seconds),
        ]
        if all_namespaces:
            row.insert(0, r.namespace)
        if output == "wide":
            row += [joined(r.classes), r.reason]
        cells.append(row)
    return table(header, cells)
