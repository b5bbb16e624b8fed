"""``kubectl dra devices``: every published device with its health, taints and holder, and totals
per DeviceClass.

A device's health is its taints (the agent taints a faulty device in its ResourceSlice, see the
docs/operations.md, "Device health and Prometheus"): ``Healthy`` without a NoSchedule or NoExecute taint,
``Unhealthy`` with one. A device's classes are the DeviceClasses whose selectors it satisfies (the
allocator's own check, :func:`dra_operator.allocator.class_matches`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from dra_api.model import DeviceClass, DeviceTaint, Node, ResourceSlice
from dra_operator.allocator import AllocationError, DeviceEntry, class_matches
from dra_operator.kubectl_dra.claims_command import consumers
from dra_operator.kubectl_dra.cluster import ClusterObjects
from dra_operator.kubectl_dra.output import as_list, dump, joined, table

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
_BLOCKING = ("NoSchedule", "NoExecute")
ALL_NODES = "(all nodes)"
SOME_NODES = "(selected nodes)"


@dataclass(frozen=True, slots=True)
class DeviceRow:
    node: str
    driver: str
    pool: str
    slice: str
    device: str
    health: str
    taints: tuple[str, ...]
    """key=value:effect, as kubectl prints node taints."""
    claims: tuple[str, ...]
    """namespace/name of each claim holding the device (several only for shared devices)."""
    pods: tuple[str, ...]
    """namespace/name of the pods using those claims."""
    classes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "driver": self.driver,
            "pool": self.pool,
            "slice": self.slice,
            "device": self.device,
            "health": self.health,
            "taints": list(self.taints),
            "claims": list(self.claims),
            "pods": list(self.pods),
            "classes": list(self.classes),
        }


@dataclass(frozen=True, slots=True)
class ClassTotal:
    device_class: str
    devices: int
    allocated: int
    unhealthy: int
    free: int
    """Neither allocated nor unhealthy: what a new claim of the class can get."""

    def to_json(self) -> dict[str, Any]:
        return {
            "deviceClass": self.device_class,
            "devices": self.devices,
            "allocated": self.allocated,
            "unhealthy": self.unhealthy,
            "free": self.free,
        }


def taint_text(taint: DeviceTaint) -> str:
    return f"{taint.key}={taint.value}:{taint.effect}" if taint.value else f"{taint.key}:{taint.effect}"


def health(taints: tuple[DeviceTaint, ...]) -> str:
    return UNHEALTHY if any(t.effect in _BLOCKING for t in taints) else HEALTHY


def _reaches(s: ResourceSlice, node: Node) -> bool:
    if s.node_name is not None:
        return s.node_name == node.name
    if s.all_nodes:
        return True
    return s.node_selector is not None and s.node_selector.matches(node)


def _node_text(s: ResourceSlice) -> str:
    if s.node_name:
        return s.node_name
    return ALL_NODES if s.all_nodes else SOME_NODES


def device_rows(*, cluster: ClusterObjects, node: str | None) -> list[DeviceRow]:
    """One row per device of every slice (of the slices reaching ``node`` when given), by node,
    driver, pool, slice and device name."""
    holders: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    pods: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for obj in cluster.claims:
        allocation = obj.claim.status.allocation
        if allocation is None:
            continue
        users = [
            f"{obj.claim.namespace}/{c[4:]}" for c in consumers(obj, cluster=cluster) if c.startswith("pod/")
        ]
        for result in allocation.devices:
            did = (result.driver, result.pool, result.device)
            if obj.claim.ref not in holders[did]:
                holders[did].append(obj.claim.ref)
                pods[did] += [u for u in users if u not in pods[did]]
    target = next((n for n in cluster.nodes if n.name == node), Node.make(node)) if node else None
    rows = []
    for s in cluster.slices:
        if target is not None and not _reaches(s, target):
            continue
        for device in sorted(s.devices, key=lambda d: d.name):
            did = (s.driver, s.pool.name, device.name)
            entry = DeviceEntry(slice_=s, device=device)
            rows.append(
                DeviceRow(
                    node=device.node_name or _node_text(s),
                    driver=s.driver,
                    pool=s.pool.name,
                    slice=s.name,
                    device=device.name,
                    health=health(device.taints),
                    taints=tuple(taint_text(t) for t in device.taints),
                    claims=tuple(holders.get(did, ())),
                    pods=tuple(pods.get(did, ())),
                    classes=tuple(
                        name for name, dc in sorted(cluster.classes.items()) if _matches(dc=dc, entry=entry)
                    ),
                )
            )
    return rows


def _matches(*, dc: DeviceClass, entry: DeviceEntry) -> bool:
    try:
        return class_matches(dc, entry)
    except AllocationError:
        return False  # a selector failing on the device: the allocator would not give it out either


def class_totals(rows: list[DeviceRow]) -> list[ClassTotal]:
    """Per DeviceClass (that any listed device matches), in name order."""
    by_class: dict[str, list[DeviceRow]] = defaultdict(list)
    for row in rows:
        for name in row.classes:
            by_class[name].append(row)
    return [
        ClassTotal(
            device_class=name,
            devices=len(members),
            allocated=sum(1 for r in members if r.claims),
            unhealthy=sum(1 for r in members if r.health == UNHEALTHY),
            free=sum(1 for r in members if not r.claims and r.health == HEALTHY),
        )
        for name, members in sorted(by_class.items())
    ]


def render_devices(rows: list[DeviceRow], *, output: str) -> str:
    totals = class_totals(rows)
    if output in ("json", "yaml"):
        items = [{"kind": "DeviceRow", **r.to_json()} for r in rows]
        return dump(as_list(items, totals=[t.to_json() for t in totals]), output)
    header = ["NODE", "DRIVER", "DEVICE", "HEALTH", "TAINTS", "CLAIM", "POD"]
    if output == "wide":
        header += ["POOL", "SLICE", "CLASSES"]
    cells = []
    for r in rows:
        row = [r.node, r.driver, r.device, r.health, joined(r.taints), joined(r.claims), joined(r.pods)]
        if output == "wide":
            row += [r.pool, r.slice, joined(r.classes)]
        cells.append(row)
    text = table(header, cells)
    if totals:
        text += "\n" + table(
            ["CLASS", "DEVICES", "ALLOCATED", "UNHEALTHY", "FREE"],
            [
                [t.device_class, str(t.devices), str(t.allocated), str(t.unhealthy), str(t.free)]
                for t in totals
            ],
        )
    return text
