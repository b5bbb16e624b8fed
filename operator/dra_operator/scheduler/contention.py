"""Allocating beside kube-scheduler without taking a device it is about to take.

kube-scheduler and the operator allocate from the same devices, and the API server cannot order two
writers of different claims: each may pick a device the other picked a moment before, and both
writes succeed. Repairing that is not enough: kube-scheduler (1.36) keeps allocated devices in a
set and drops a device when either of two claims holding it lets go, so after a repair it counts the
device free although the other claim holds it (bench/RESULTS.md, the chaos soak). Collisions have to
be avoided.

The two allocators pick from opposite ends. kube-scheduler places a pod's claims on one node and
takes the first free matching devices of each slice, in slice order; the operator takes the last
ones (``PlannerPlacer(prefer_last_devices=True)``). So while pods wait for kube-scheduler, the
operator takes a device only where the free devices *ahead* of it in its slice outnumber what those
pods could take there: kube-scheduler runs out of pods before it gets to the device, whatever it has
or has not seen yet of the operator's writes. The operator's own view lacks only kube-scheduler's
picks in flight, and those come out of the same devices ahead. Otherwise the claim waits (the
caller says so on the claim) and is placed again when pods, claims or devices change.

What the pods could take (:class:`SchedulerDemand`): the requests of the unallocated claims
kube-scheduler owns that a pod waiting for it uses. Parked pods (tried and found unschedulable) count
only for :data:`PARKED_RETRY_WINDOW_S` after devices were freed or slices, classes or nodes changed:
that is what sends them back to kube-scheduler's queue, and each waits out its back-off there (at
most 10 s by default) before its next try. A pod parked for good (for its CPU, its affinity) thus
does not keep the operator off the devices for good. A request counts against a device only if it could use
it (class and selectors) and fits on the device's node at all (enough matching devices free there),
so a pod that cannot fit anywhere does not stop the operator. Claims of waiting pods that the
operator has not seen yet count one device each while the pod is young (:data:`UNSEEN_CLAIM_WINDOW_S`:
the claim controller makes a template's claim at once; a claim missing for longer belongs to a pod
kube-scheduler cannot place either, such as one naming a template that does not exist), and
``headroom`` devices more are left for what either side has not seen yet (the watch delay).

Shares of a device (consumable capacity, a result with a ``shareID``) collide too: kube-scheduler
gives shares of the first matching device that still has room, and two shares written at once may
together ask for more than the device has. So a share the operator picks is checked like a whole
device, more strictly: every waiting request that could use the device counts (whether the node
looks full does not matter: a held device may still have room for a share), and only the devices
ahead that nothing holds and that have at least the device's capacity shield it (a request that fits
on it fits on them, so kube-scheduler stops there first).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from dra_api.model import ALL, AllocationResult, ResourceClaim
from dra_operator.allocator import DeviceEntry, SliceIndex
from dra_operator.base.settings import Ownership
from dra_operator.model.cluster import ClaimKey, ClusterModel, DeviceID, parse_time
from dra_operator.model.ownership import is_ours
from dra_operator.planner.demand import DemandKey, key_of, request_specs
from dra_operator.planner.index import key_matches

PARKED_RETRY_WINDOW_S = 10.0
"""How long after a change that may help them parked pods may still be tried again:
kube-scheduler's longest back-off per pod (``podMaxBackoffSeconds``, 10 s by default)."""

UNSEEN_CLAIM_WINDOW_S = 30.0
"""How long after a pod's creation its claims that the operator has not seen still count."""

RequestShape = tuple[DemandKey, int, bool]
"""(devices it can use, how many it takes, whether it takes all of them on a node)."""


@dataclass(frozen=True, slots=True)
class SchedulerDemand:
    """What the pods waiting for kube-scheduler could take from the devices."""

    pods: int
    """Pods waiting for kube-scheduler whose claims still need devices."""
    requests: Mapping[RequestShape, int]
    """How many requests of each shape their unallocated claims make."""
    unknown: int = 0
    """Claims those pods use that the operator has not seen yet; or, with no pod known to wait,
    one for a pod the operator may not have seen yet while pods keep coming (see
    :meth:`dra_operator.scheduler.waits.SchedulerWaits.demand`)."""

    @property
    def empty(self) -> bool:
        return not self.pods and not self.unknown


NO_DEMAND = SchedulerDemand(pods=0, requests={})


def scheduler_demand(
    model: ClusterModel,
    *,
    ownership: Ownership,
    classes: Collection[str],
    parked: bool = True,
    now: float | None = None,
) -> SchedulerDemand:
    """The demand of the pods kube-scheduler has yet to place, from the model as it is now (parked
    pods only with ``parked``; ``now``: wall-clock seconds, for the age of pods). Costs one pass
    over those pods and over the unallocated claims that pods own."""
    now = time.time() if now is None else now
    requests: Counter[RequestShape] = Counter()
    counted: set[ClaimKey] = set()
    pods = unknown = 0

    def add(claim: ResourceClaim) -> bool:
        counted.add(ClaimKey(claim.namespace, claim.name))
        if claim.status.allocation is not None or claim.metadata.deletion_timestamp is not None:
            return False
        if is_ours(claim, ownership=ownership, classes=classes):
            return False
        added = False
        for request in claim.spec.requests:
            # firstAvailable: any alternative may be the one chosen, so each counts.
            for _, spec in request_specs(request):
                device_class = model.classes.get(spec.device_class_name)
                if device_class is None or spec.admin_access:
                    continue  # no class: kube-scheduler cannot allocate it; admin access takes nothing
                all_mode = spec.mode == ALL
                shape = (
                    key_of(request=spec, device_class=device_class),
                    0 if all_mode else spec.effective_count,
                    all_mode,
                )
                requests[shape] += 1
                added = True
        return added

    for (namespace, _), pod in model.unscheduled.items():
        if pod.unschedulable and not parked:
            continue
        created = parse_time(pod.created)
        young = created is None or now - created < UNSEEN_CLAIM_WINDOW_S
        missing = pod.unresolved_claims if young else 0
        needs = False
        for name in pod.claims:
            key = ClaimKey(namespace, name)
            if key in counted:
                continue  # a claim several pods share
            claim = model.claims.get(key)
            if claim is None:
                missing += young and key not in model.invalid_claims
                continue
            needs |= add(claim)
        unknown += missing
        pods += needs or missing > 0
    # Claims made for pods the model has not seen yet (the pod watch is a stream of its own). Only
    # claims a Pod owns: a pass over every pending claim cost a millisecond per allocation in a
    # backlog of a thousand standalone claims.
    for claim in model.pending_pod_claims():
        if ClaimKey(claim.namespace, claim.name) in counted:
            continue
        owners = [o.name for o in claim.metadata.owner_references if o.kind == "Pod"]
        if owners and (claim.namespace, owners[0]) not in model.pods and add(claim):
            pods += 1
    return SchedulerDemand(pods=pods, requests=dict(requests), unknown=unknown)


@dataclass(frozen=True, slots=True)
class Crowded:
    """A device the operator should not take now: fewer free devices are ahead of it in its slice
    than the waiting pods could take on its node."""

    device: DeviceID
    ahead: int
    """Free devices ahead of it that kube-scheduler would take first."""
    needed: int
    """How many it would have to be able to take first: the fitting requests' devices, claims not
    seen yet and the headroom."""
    pods: int
    """Pods waiting for kube-scheduler (all of them, not only those that could use the device)."""
    unfinished: bool = False
    """The check ran out of its slice of the event loop before it could tell (the pods' selectors
    are slow to evaluate): the claim gives way until it is checked again."""


class Clearance:
    """Checks allocations against a :class:`SchedulerDemand`. Keeps a slice index per model
    generation, so device positions and CEL results are worked out once per slice change."""

    def __init__(self) -> None:
        self._generation = -1
        self._index: SliceIndex | None = None
        self._where: dict[DeviceID, tuple[DeviceEntry, int]] = {}

    def index(self, model: ClusterModel) -> SliceIndex:
        """The slice index of the model as it is now."""
        return self._refresh(model)

    def _refresh(self, model: ClusterModel) -> SliceIndex:
        if self._index is None or self._generation != model.generation:
            self._index = SliceIndex(model.slices.values(), previous=self._index)
            self._where = {}
            for s in self._index.slices:
                for position, entry in enumerate(self._index.entries(s)):
                    self._where.setdefault(entry.id, (entry, position))
            self._generation = model.generation
        return self._index

    def crowded(
        self,
        *,
        model: ClusterModel,
        allocation: AllocationResult,
        demand: SchedulerDemand,
        headroom: int,
        reserved: Collection[DeviceID] = (),
    ) -> Crowded | None:
        """The first device of ``allocation`` kube-scheduler could reach while placing the waiting
        pods, or None when it can reach none of them. The allocation's own devices count as
        taken by nobody but itself: kube-scheduler sees them free until the write reaches it.
        The ``reserved`` devices, which kube-scheduler no longer allocates
        (:mod:`dra_operator.scheduler.reservation`), are out of its reach."""
        if demand.empty:
            return None
        index = self._refresh(model)
        in_use = model.devices_in_use()
        mine = {r.device_id for r in allocation.devices}
        for result in allocation.devices:
            if result.admin_access:
                continue  # takes the device for no one: nothing to collide with
            if result.device_id in reserved:
                continue
            found = self._where.get(result.device_id)
            if found is None:
                continue
            entry, position = found
            shapes = [(s, n) for s, n in demand.requests.items() if key_matches(key=s[0], entry=entry)]
            # A share takes part of a device that kube-scheduler can still give shares of while it
            # has room: any request that could use it counts, however full the node looks, and only
            # an unheld device ahead that holds as much as this one shields it (see the module).
            shared = result.share_id is not None
            fitting = (
                shapes
                if shared
                else _fitting(
                    shapes,
                    node=entry.slice.node_name,
                    index=index,
                    in_use=in_use,
                    mine=mine,
                    headroom=headroom,
                )
            )
            if any(all_mode for (_, _, all_mode), _ in fitting):
                return Crowded(device=entry.id, ahead=0, needed=1, pods=demand.pods)
            needed = sum(count * n for (_, count, _), n in fitting) + demand.unknown + headroom
            keys = [key for (key, _, _), _ in fitting]
            ahead = 0
            for other in index.entries(entry.slice)[:position]:
                if other.id in in_use or other.id in mine:
                    continue
                if shared and not _holds_as_much(other, entry):
                    continue
                if all(key_matches(key=key, entry=other) for key in keys):
                    ahead += 1
            if ahead < needed:
                return Crowded(device=entry.id, ahead=ahead, needed=needed, pods=demand.pods)
        return None


def _holds_as_much(other: DeviceEntry, entry: DeviceEntry) -> bool:
    """Whether ``other`` has at least each capacity ``entry`` has: a share that fits on ``entry``
    fits on ``other`` when nothing holds it."""
    theirs = other.device.capacity
    return all(
        name in theirs and theirs[name].value >= cap.value for name, cap in entry.device.capacity.items()
    )


def _fitting(
    shapes: list[tuple[RequestShape, int]],
    *,
    node: str | None,
    index: SliceIndex,
    in_use: Collection[DeviceID],
    mine: Collection[DeviceID],
    headroom: int,
) -> list[tuple[RequestShape, int]]:
    """The request shapes that could be allocated on ``node``: enough matching devices free there
    (kube-scheduler counts the allocation being checked free; ``headroom`` more may be free in its
    view). Devices of slices without a node name could be reached from anywhere: every shape fits."""
    if node is None:
        return shapes
    out = []
    for shape, n in shapes:
        key, count, all_mode = shape
        total = free = 0
        for s in index.on_node.get(node, ()):
            for entry in index.entries(s):
                if key_matches(key=key, entry=entry):
                    total += 1
                    free += entry.id not in in_use or entry.id in mine
        if (free + headroom >= total) if all_mode else (free + headroom >= count):
            out.append((shape, n))
    return out
