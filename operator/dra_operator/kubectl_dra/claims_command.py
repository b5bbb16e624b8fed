"""``kubectl dra claims``: each claim's state, allocator, node, devices, consumers and age, and what
the drivers' agents say of each device in ``status.devices`` (KEP-4817): its Ready condition, and in
``-o wide`` the key of its data (a UUID, a TPU chip's index and worker)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_api import times
from dra_operator.base.settings import Ownership
from dra_operator.kubectl_dra.cluster import ClaimObject, ClusterObjects, node_of
from dra_operator.kubectl_dra.output import NONE, as_list, dump, human_age, joined, table
from dra_operator.model.ownership import allocated_by_us, is_ours, request_classes

OPERATOR = "operator"
SCHEDULER = "scheduler"
NO_STATUS = "-"
# The data fields a table cell shows, in this order: enough to tell a device (its UUID) or a TPU
# chip and worker; -o json|yaml has all of it.
_DATA_SUMMARY = ("uuid", "index", "workerId")


@dataclass(frozen=True, slots=True)
class DeviceStatusRow:
    """One ``status.devices`` entry: its key, its Ready condition and its data."""

    driver: str
    pool: str
    device: str
    share_id: str | None
    ready: str
    """The Ready condition's status (True, False, Unknown); empty without one."""
    reason: str
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str, str | None]:
        return (self.driver, self.pool, self.device, self.share_id)

    def ready_cell(self) -> str:
        """``True``, or ``False(XID)``: the status, and the reason when not Ready."""
        if not self.ready:
            return NO_STATUS
        return self.ready if self.ready == "True" or not self.reason else f"{self.ready}({self.reason})"

    def data_cell(self) -> str:
        parts = [f"{k}={self.data[k]}" for k in _DATA_SUMMARY if k in self.data]
        return ";".join(parts).replace(" ", "") or NO_STATUS

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": self.driver, "pool": self.pool, "device": self.device}
        if self.share_id is not None:
            out["shareID"] = self.share_id
        out["ready"] = self.ready or None
        out["reason"] = self.reason or None
        out["message"] = self.message or None
        out["data"] = dict(self.data)
        return out


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
    device_status: tuple[DeviceStatusRow | None, ...] = ()
    """Per allocated device (in ``devices`` order), its ``status.devices`` entry, if any."""

    def ready_cell(self) -> str:
        if not any(self.device_status):
            return ""
        return ",".join(d.ready_cell() if d is not None else NO_STATUS for d in self.device_status)

    def data_cell(self) -> str:
        if not any(self.device_status):
            return ""
        return ",".join(d.data_cell() if d is not None else NO_STATUS for d in self.device_status)

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
            "deviceStatus": [d.to_json() for d in self.device_status if d is not None],
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
    stamp = times.parse(created)  # memoised: the claims of a large cluster share few stamps
    return None if stamp is None else now.timestamp() - stamp


def device_status(obj: ClaimObject) -> tuple[DeviceStatusRow | None, ...]:
    """Each allocated device's ``status.devices`` entry (None where its driver wrote none)."""
    claim = obj.claim
    allocation = claim.status.allocation
    if allocation is None:
        return ()
    entries: dict[tuple[str, str, str, str | None], DeviceStatusRow] = {}
    for entry in claim.status.devices:
        ready: Mapping[str, Any] = {}
        for condition in json.loads(entry.conditions_json):
            if isinstance(condition, dict) and condition.get("type") == "Ready":
                ready = condition
        data = json.loads(entry.data_json) if entry.data_json else {}
        row = DeviceStatusRow(
            driver=entry.driver,
            pool=entry.pool,
            device=entry.device,
            share_id=entry.share_id,
            ready=str(ready.get("status") or ""),
            reason=str(ready.get("reason") or ""),
            message=str(ready.get("message") or ""),
            data=data if isinstance(data, dict) else {},
        )
        entries[row.key] = row
    return tuple(entries.get((r.driver, r.pool, r.device, r.share_id)) for r in allocation.devices)


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
                device_status=device_status(obj),
            )
        )
    return rows


def render_claims(rows: list[ClaimRow], *, output: str, all_namespaces: bool) -> str:
    if output in ("json", "yaml"):
        return dump(as_list([{"kind": "ResourceClaimRow", **r.to_json()} for r in rows]), output)
    header = ["NAME", "STATE", "ALLOCATOR", "NODE", "DEVICES", "READY", "CONSUMERS", "AGE"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    if output == "wide":
        header += ["CLASSES", "REASON", "DEVICE-DATA"]
    cells = []
    for r in rows:
        row = [
            r.name,
            r.state,
            r.allocator,
            r.node,
            joined(r.devices),
            r.ready_cell(),
            joined(r.consumers),
            NONE if r.age_seconds is None else human_age(r.age_seconds),
        ]
        if all_namespaces:
            row.insert(0, r.namespace)
        if output == "wide":
            row += [joined(r.classes), r.reason, r.data_cell()]
        cells.append(row)
    return table(header, cells)
