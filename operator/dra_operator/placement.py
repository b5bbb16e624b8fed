"""Placement: choose a node and devices for a claim, or say why none fits.

The claim lifecycle depends only on the :class:`Placer` protocol. :class:`AllocatorPlacer` adapts the
structured allocator (``dra_operator.allocator``): it tries nodes in a stable order and takes the first
one on which the allocator finds a solution, skipping nodes that cannot have enough free devices.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dra_api.model import ALL, AllocationResult, Node, ResourceClaim
from dra_operator.clustermodel import ClusterModel

if TYPE_CHECKING:
    from dra_operator.allocator.pools import SliceIndex

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the claims go: one allocation result per claim, in order, and the node (None when the
    devices are reachable from every node)."""

    node: str | None
    allocations: tuple[AllocationResult, ...]


@dataclass(frozen=True, slots=True)
class Unallocatable:
    """Why the claims cannot be allocated now. ``reason`` is a short CamelCase word for Events and
    metrics; ``message`` says what to change."""

    reason: str
    message: str


class Placer(Protocol):
    def place(self, *, claims: Sequence[ResourceClaim], model: ClusterModel) -> Placement | Unallocatable: ...


def requested_count(claim: ResourceClaim) -> int:
    """The fewest devices the claim can be served with (first subrequest counts for firstAvailable)."""
    total = 0
    for request in claim.spec.requests:
        if request.exactly is not None:
            total += 0 if request.exactly.mode == ALL else request.exactly.effective_count
        elif request.first_available:
            sub = min(
                (0 if s.spec.mode == ALL else s.spec.effective_count for s in request.first_available),
                default=0,
            )
            total += sub
    return total


def class_names(claim: ResourceClaim) -> list[str]:
    names: list[str] = []
    for request in claim.spec.requests:
        if request.exactly is not None:
            names.append(request.exactly.device_class_name)
        names.extend(s.spec.device_class_name for s in request.first_available)
    return names


def free_devices_per_node(model: ClusterModel) -> tuple[Counter[str], bool]:
    """Free devices by node for node-local slices, and whether every slice is node-local (when
    not, the count is no bound and must not be used to skip nodes)."""
    in_use = model.devices_in_use()
    free: Counter[str] = Counter()
    node_local_only = True
    for sl in model.slices.values():
        if sl.node_name is None:
            node_local_only = False
            continue
        for d in sl.devices:
            if (sl.driver, sl.pool.name, d.name) not in in_use:
                free[sl.node_name] += 1
    return free, node_local_only


class AllocatorPlacer:
    """First fit over nodes in name order with the structured allocator."""

    def __init__(self) -> None:
        # The slice index depends only on slices and is rebuilt when the model's generation moves.
        self._index: tuple[int, SliceIndex] | None = None

    def _slice_index(self, model: ClusterModel) -> SliceIndex:
        from dra_operator.allocator.pools import SliceIndex

        if self._index is None or self._index[0] != model.generation:
            # Devices in reverse order: kube-scheduler takes the first free devices of a pool, so
            # the operator taking the last ones keeps the two allocators apart until a pool is
            # nearly full (results name devices, so the order is invisible otherwise).
            slices = [
                dataclasses.replace(s, devices=tuple(reversed(s.devices))) for s in model.slices.values()
            ]
            self._index = (model.generation, SliceIndex(slices))
        return self._index[1]

    def place(self, *, claims: Sequence[ResourceClaim], model: ClusterModel) -> Placement | Unallocatable:
        try:
            from dra_operator.allocator import AllocationError, Allocator
            from dra_operator.allocator.state import AllocatedState
        except Exception as exc:  # the allocator is a separate piece; say so instead of crashing
            return Unallocatable(reason="AllocatorUnavailable", message=f"the allocator cannot load: {exc}")

        missing = sorted({n for c in claims for n in class_names(c) if n not in model.classes})
        if missing:
            return Unallocatable(
                reason="DeviceClassNotFound",
                message=f"DeviceClass {', '.join(missing)} not found; create it or fix the request's "
                "deviceClassName",
            )
        if not model.nodes:
            return Unallocatable(reason="NoNodes", message="the cluster has no nodes")
        needed = sum(requested_count(c) for c in claims)
        free, node_local_only = free_devices_per_node(model)
        allocator = Allocator(
            classes=model.classes,
            slices=self._slice_index(model),
            allocated=AllocatedState.from_claims(model.allocated_claims()),
        )
        tried = 0
        # Nodes in reverse name order, for the same reason as the devices.
        for name in sorted(model.nodes, reverse=True):
            if node_local_only and free[name] < needed:
                continue
            tried += 1
            node = model.nodes[name]
            try:
                results = allocator.allocate(node=node, claims=list(claims))
            except AllocationError as exc:
                if type(exc).__name__ == "FailedAllocationOnNode":
                    continue
                return Unallocatable(reason="AllocationError", message=str(exc))
            if results is not None:
                return Placement(node=_node_of(results, node), allocations=tuple(results))
        message = _no_fit_message(claims=claims, model=model, tried=tried)
        try:
            funnel = _funnel_text(allocator=allocator, claims=claims, model=model)
        except AllocationError as exc:
            # Looking at every device (not only free ones) found an error the search skipped,
            # e.g. a selector that fails on some device: that is the real reason.
            return Unallocatable(reason="AllocationError", message=str(exc))
        return Unallocatable(reason="NoFit", message=f"{message}. {funnel}" if funnel else message)


_FUNNEL_NODES = 200


def _funnel_text(*, allocator: object, claims: Sequence[ResourceClaim], model: ClusterModel) -> str:
    """Per request, how far its devices get on the node where it gets furthest: devices, class
    match, request selectors, free, untainted, counters, capacity (the allocator's funnel)."""
    funnel = getattr(allocator, "funnel", None)
    if funnel is None:
        return ""
    best: dict[tuple[str, str], tuple[tuple[int, ...], str, object]] = {}
    for name in sorted(model.nodes)[:_FUNNEL_NODES]:
        try:
            rows = funnel(node=model.nodes[name], claims=list(claims))
        except Exception as exc:
            if type(exc).__name__ == "FailedAllocationOnNode":
                continue
            raise
        for row in rows:
            score = (
                row.within_capacity,
                row.within_counters,
                row.untainted,
                row.free,
                row.selectors_kept,
                row.class_matched,
                row.devices,
            )
            key = (row.claim, row.request)
            if key not in best or score > best[key][0]:
                best[key] = (score, name, row)
    parts = []
    short = []
    for (_, request), (_, node, row) in best.items():
        r: Any = row
        wanted = "all" if r.mode == ALL else str(r.wanted)
        parts.append(
            f"request {request} ({wanted} of class {r.device_class}) gets furthest on node {node}: "
            f"{r.devices} devices, {r.class_matched} match the class, {r.selectors_kept} pass the "
            f"request selectors, {r.free} free, {r.untainted} untainted, {r.within_counters} within "
            f"counters, {r.within_capacity} with enough capacity"
        )
        if r.mode != ALL and r.within_capacity < r.wanted:
            short.append(request)
    if parts and not short:
        parts.append("every request fits alone somewhere; the constraints or the requests together do not")
    return "; ".join(parts)


def _node_of(results: Sequence[AllocationResult], node: Node) -> str | None:
    return node.name if any(r.node_selector is not None for r in results) else None


def _no_fit_message(*, claims: Sequence[ResourceClaim], model: ClusterModel, tried: int) -> str:
    needed = sum(requested_count(c) for c in claims)
    per_node: Counter[str] = Counter()
    for sl in model.slices.values():
        if sl.node_name is not None:
            per_node[sl.node_name] += len(sl.devices)
    most = max(per_node.values(), default=0)
    free, _ = free_devices_per_node(model)
    most_free = max(free.values(), default=0)
    requests = "; ".join(
        f"{r.name}: {('all' if r.exactly.mode == ALL else r.exactly.effective_count)} of class "
        f"{r.exactly.device_class_name}"
        if r.exactly is not None
        else f"{r.name}: first available of {', '.join(s.spec.device_class_name for s in r.first_available)}"
        for c in claims
        for r in c.spec.requests
    )
    if per_node and needed > most:
        return (
            f"the claim needs {needed} devices on one node but no node has that many (most: {most}); "
            f"requests: {requests}"
        )
    return (
        f"no node can satisfy all requests together ({tried} of {len(model.nodes)} nodes tried; "
        f"most free devices on one node: {most_free}); requests: {requests}"
    )
