"""The operator's in-memory model of the cluster: classes, slices, nodes, pods, claims, devices in use.

It is fed by watch events and by the operator's own write responses. Each kind keeps the newest
object by ``resourceVersion``: a watch event that arrives after the operator's own write (and is
older than it) must not roll the model back, or a device the operator just allocated would look
free for a moment and could be given to a second claim.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from dra_api import times
from dra_api.model import (
    AllocationResult,
    DeviceClass,
    ModelError,
    Node,
    ResourceClaim,
    ResourceClaimStatus,
    ResourceSlice,
)

logger = logging.getLogger(__name__)

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

DeviceID = tuple[str, str, str]
"""(driver, pool, device): how an allocation result names a device."""


class ClaimKey(NamedTuple):
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    phase: str
    deleting: bool
    node_name: str = ""
    gated: bool = False
    """Whether the pod has scheduling gates (kube-scheduler leaves it alone until they are gone)."""
    claims: tuple[str, ...] = ()
    """Names of the ResourceClaims the pod uses: those it names, those generated for it from
    templates (``status.resourceClaimStatuses``) and the one kube-scheduler made for its extended
    resources (``status.extendedResourceClaimStatus``)."""
    extended_claim: str = ""
    """The claim kube-scheduler made for the pod's extended-resource requests (KEP-5004), if any."""
    extended_resources: tuple[tuple[str, str], ...] = ()
    """(container, extended resource name) for each request that claim serves."""
    scheduled_at: str = ""
    """When the pod's PodScheduled condition last changed (RFC 3339), if it has one."""
    job: str = ""
    """The Job the pod belongs to (label ``batch.kubernetes.io/job-name``), if any."""
    completion_index: int | None = None
    """The pod's completion index in an Indexed Job, if it has one."""
    unschedulable: bool = False
    """Whether kube-scheduler tried and parked it (PodScheduled False, reason Unschedulable): it
    tries again when the cluster changes in a way that may help, such as devices being freed."""
    created: str = ""
    """metadata.creationTimestamp (RFC 3339)."""
    unresolved_claims: int = 0
    """Entries of ``spec.resourceClaims`` naming a template whose claim the pod's status does not
    name yet (the claim controller has not made it, or the update is still on its way)."""

    def awaits_scheduler(self) -> bool:
        """Whether kube-scheduler should be placing this pod and has not: not bound, not gated (a
        gated pod waits by design), not being deleted, not finished."""
        return (
            not self.node_name and not self.gated and not self.deleting and self.phase not in _TERMINAL_PHASES
        )


@dataclass(frozen=True, slots=True)
class InvalidClaim:
    """A claim the model could not parse: enough to address it, and the reason."""

    key: ClaimKey
    uid: str
    resource_version: str
    message: str


def newer_or_equal(new: str, old: str) -> bool:
    """Whether resourceVersion ``new`` is not older than ``old``. They are etcd revisions in every
    real server; when one is not a number, the newest arrival wins."""
    try:
        return int(new) >= int(old)
    except ValueError:
        return True


def parse_time(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time as the API server writes it; None if not one."""
    return times.parse(text)


ARRIVAL_AGE_S = 10.0
"""A pod first seen waiting when it is older than this (by its creationTimestamp) was listed, not
created just now: it does not count as arriving. An operator that starts, or resumes its pod watch,
beside a pod stuck pending would otherwise take it for a stream of pods and hold every claim."""


def _young(created: str) -> bool:
    """Whether a pod created at ``created`` is new (or its age unknown): see :data:`ARRIVAL_AGE_S`."""
    stamp = parse_time(created)
    return stamp is None or time.time() - stamp < ARRIVAL_AGE_S


def claim_key_of(obj: Mapping[str, Any]) -> ClaimKey:
    meta = obj.get("metadata") or {}
    return ClaimKey(str(meta.get("namespace", "")), str(meta.get("name", "")))


class ClusterModel:
    """What allocation and cleanup need to know about the cluster, kept current from watches."""

    def __init__(self) -> None:
        self.classes: dict[str, DeviceClass] = {}
        self.slices: dict[str, ResourceSlice] = {}
        self.nodes: dict[str, Node] = {}
        self.pods: dict[tuple[str, str], PodInfo] = {}
        self.claims: dict[ClaimKey, ResourceClaim] = {}
        self.invalid_claims: dict[ClaimKey, InvalidClaim] = {}
        self.claim_created: dict[ClaimKey, str] = {}
        # Claims without an allocation that are not being deleted, and pods with claims that
        # kube-scheduler has yet to place: kept as they change, so that what kube-scheduler may be
        # allocating now is known without a pass over every claim and pod.
        self._pending: dict[ClaimKey, None] = {}
        # The pending claims a Pod owns (from templates): what kube-scheduler may be about to
        # allocate for a pod not seen yet, looked at on every placement beside a busy scheduler.
        self._pending_of_pods: dict[ClaimKey, None] = {}
        self.unscheduled: dict[tuple[str, str], PodInfo] = {}
        self.pods_arrived = 0
        """How many pods have started waiting for kube-scheduler (a pod that keeps waiting counts
        once): a steady rise means pods keep coming."""
        """Pods that use claims and await kube-scheduler (:meth:`PodInfo.awaits_scheduler`)."""
        self._in_use: dict[DeviceID, set[ClaimKey]] = defaultdict(set)
        # Allocations decided but not yet written (or not yet seen back): they hold their devices
        # so that the next placement cannot pick them, as the scheduler's assume cache does.
        self._assumed: dict[ClaimKey, AllocationResult] = {}
        self._assumed_devices: dict[DeviceID, ClaimKey] = {}
        self._versions: dict[tuple[str, str], str] = {}
        # Allocations holding devices (written, or assumed while being written) and a log of the
        # claims whose holding changed, so that a placer catches up in O(changes), not O(claims).
        self._holding: dict[ClaimKey, AllocationResult] = {}
        self._holding_log: list[ClaimKey] = []
        self._holding_log_base = 0
        self.generation = 0
        """Bumped on every change of classes, slices or nodes (what allocation depends on besides claims)."""

    # -- bookkeeping of versions ---------------------------------------------------------------

    def _accept(self, kind: str, name: str, rv: str) -> bool:
        """Whether an object at ``rv`` is news: not older than, nor the same as, what was seen (the
        echo of the operator's own write, a listing of an unchanged object)."""
        old = self._versions.get((kind, name))
        if old is not None and rv and (old == rv or not newer_or_equal(rv, old)):
            return False
        if rv:
            self._versions[(kind, name)] = rv
        return True

    def unseen_since(self, kind: str, names: Iterable[str], listed: set[str], listed_at: str) -> list[str]:
        """Of ``names`` (what the model holds of ``kind``), those a listing taken at resourceVersion
        ``listed_at`` no longer has, and that the model has not seen change since: deleted while
        the watch was not looking. An object the model saw at a newer version than the listing was
        created after it, and stays."""
        gone = []
        for name in names:
            if name in listed:
                continue
            seen = self._versions.get((kind, name))
            if seen is None or not listed_at or seen == listed_at or not newer_or_equal(seen, listed_at):
                gone.append(name)
        return gone

    def _forget(self, kind: str, name: str, *, deleted_at: str = "") -> None:
        # With the deletion's resourceVersion kept as a tombstone, a listing taken before the
        # deletion cannot bring the object back; a re-created object has a newer version.
        if deleted_at:
            self._versions[(kind, name)] = deleted_at
        else:
            self._versions.pop((kind, name), None)

    # -- classes, slices, nodes, pods ----------------------------------------------------------

    def upsert_class(self, obj: Mapping[str, Any]) -> DeviceClass | None:
        cls = DeviceClass.from_json(obj)
        if not self._accept("class", cls.name, cls.metadata.resource_version):
            return None
        self.classes[cls.name] = cls
        self.generation += 1
        return cls

    def remove_class(self, name: str, *, resource_version: str = "") -> None:
        if self.classes.pop(name, None) is not None:
            self.generation += 1
        self._forget("class", name, deleted_at=resource_version)

    def upsert_slice(self, obj: Mapping[str, Any]) -> ResourceSlice | None:
        sl = ResourceSlice.from_json(obj)
        if not self._accept("slice", sl.name, sl.metadata.resource_version):
            return None
        self.slices[sl.name] = sl
        self.generation += 1
        return sl

    def remove_slice(self, name: str, *, resource_version: str = "") -> None:
        if self.slices.pop(name, None) is not None:
            self.generation += 1
        self._forget("slice", name, deleted_at=resource_version)

    def upsert_node(self, obj: Mapping[str, Any]) -> bool:
        """Whether what allocation sees of the node (name, labels) changed; status updates do not."""
        node = Node.from_json(obj)
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if not self._accept("node", node.name, rv):
            return False
        old = self.nodes.get(node.name)
        self.nodes[node.name] = node
        if old != node:
            self.generation += 1
            return True
        return False

    def remove_node(self, name: str, *, resource_version: str = "") -> None:
        if self.nodes.pop(name, None) is not None:
            self.generation += 1
        self._forget("node", name, deleted_at=resource_version)

    def upsert_pod(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        extended = status.get("extendedResourceClaimStatus") or {}
        named = [
            *(spec.get("resourceClaims") or []),
            *(status.get("resourceClaimStatuses") or []),
            *([extended] if isinstance(extended, dict) else []),
        ]
        claims = [str(r["resourceClaimName"]) for r in named if r.get("resourceClaimName")]
        mappings = (extended.get("requestMappings") or []) if isinstance(extended, dict) else []
        scheduled = [
            c
            for c in status.get("conditions") or []
            if isinstance(c, dict) and c.get("type") == "PodScheduled"
        ]
        labels = meta.get("labels") or {}
        index = (meta.get("annotations") or {}).get(COMPLETION_INDEX, labels.get(COMPLETION_INDEX))
        generated = {str(r.get("name", "")) for r in status.get("resourceClaimStatuses") or []}
        unresolved = sum(
            1
            for r in spec.get("resourceClaims") or []
            if r.get("resourceClaimTemplateName") and str(r.get("name", "")) not in generated
        )
        known = key in self.pods
        info = self.pods[key] = PodInfo(
            job=str(labels.get(JOB_NAME_LABEL) or ""),
            completion_index=int(index) if isinstance(index, str) and index.isdigit() else None,
            uid=str(meta.get("uid", "")),
            phase=str(status.get("phase", "")),
            deleting=bool(meta.get("deletionTimestamp")),
            node_name=str(spec.get("nodeName") or ""),
            gated=bool(spec.get("schedulingGates")),
            claims=tuple(dict.fromkeys(claims)),
            extended_claim=str(extended.get("resourceClaimName") or "") if isinstance(extended, dict) else "",
            extended_resources=tuple(
                (str(m.get("containerName", "")), str(m.get("resourceName", "")))
                for m in mappings
                if isinstance(m, dict)
            ),
            scheduled_at=str(scheduled[0].get("lastTransitionTime") or "") if scheduled else "",
            unresolved_claims=unresolved,
            created=str(meta.get("creationTimestamp") or ""),
            unschedulable=bool(scheduled) and scheduled[0].get("reason") == "Unschedulable",
        )
        if (info.claims or info.unresolved_claims) and info.awaits_scheduler():
            if key not in self.unscheduled and (known or _young(info.created)):
                self.pods_arrived += 1
            self.unscheduled[key] = info
        else:
            self.unscheduled.pop(key, None)

    def remove_pod(self, *, namespace: str, name: str) -> None:
        self.pods.pop((namespace, name), None)
        self.unscheduled.pop((namespace, name), None)

    # -- claims ---------------------------------------------------------------------------------

    def upsert_claim(self, obj: Mapping[str, Any]) -> ResourceClaim | InvalidClaim | None:
        """Take a claim as the server returned it. None when it is older than what the model has."""
        key = claim_key_of(obj)
        meta = obj.get("metadata") or {}
        rv = str(meta.get("resourceVersion", ""))
        if not self._accept("claim", str(key), rv):
            return None
        self.claim_created[key] = str(meta.get("creationTimestamp", ""))
        # The allocation being written (the reply to the write brings it back) or the one the claim
        # had: when the claim's is the same, the model keeps that object (parsed once, and an
        # unchanged holding for the placer, which then has nothing to catch up on).
        previous = self.claims.get(key)
        known = self._assumed.get(key) or (previous.status.allocation if previous is not None else None)
        self._release(key)
        try:
            claim = ResourceClaim.from_json(obj, known_allocation=known)
        except ModelError as exc:
            self.claims.pop(key, None)
            self._pending.pop(key, None)
            self._pending_of_pods.pop(key, None)
            invalid = InvalidClaim(
                key=key, uid=str(meta.get("uid", "")), resource_version=rv, message=str(exc)
            )
            self.invalid_claims[key] = invalid
            self._note_holding(key)
            return invalid
        self.invalid_claims.pop(key, None)
        self.claims[key] = claim
        allocation = claim.status.allocation
        if allocation is None and claim.metadata.deletion_timestamp is None:
            self._pending[key] = None
            if any(o.kind == "Pod" for o in claim.metadata.owner_references):
                self._pending_of_pods[key] = None
        else:
            self._pending.pop(key, None)
            self._pending_of_pods.pop(key, None)
        if allocation is not None or claim.metadata.deletion_timestamp is not None:
            self.forget_assumed(key)
        if allocation is not None:
            for result in allocation.devices:
                self._in_use[result.device_id].add(key)
        self._note_holding(key)
        return claim

    def remove_claim(self, key: ClaimKey, *, resource_version: str = "") -> None:
        self.forget_assumed(key)
        self._release(key)
        self.claims.pop(key, None)
        self._pending.pop(key, None)
        self._pending_of_pods.pop(key, None)
        self.invalid_claims.pop(key, None)
        self.claim_created.pop(key, None)
        self._forget("claim", str(key), deleted_at=resource_version)
        self._note_holding(key)

    def _note_holding(self, key: ClaimKey) -> None:
        claim = self.claims.get(key)
        holding = (claim.status.allocation if claim is not None else None) or self._assumed.get(key)
        if self._holding.get(key) is holding:
            return
        if holding is None:
            del self._holding[key]
        else:
            self._holding[key] = holding
        self._holding_log.append(key)
        if len(self._holding_log) > 4 * len(self._holding) + 10_000:
            # Readers further behind than the log reaches start over from holding_allocations().
            self._holding_log_base += len(self._holding_log)
            self._holding_log = []

    def holding_allocations(self) -> Mapping[ClaimKey, AllocationResult]:
        """Allocations that hold devices now: written ones, and those being written (assumed)."""
        return self._holding

    @property
    def holding_position(self) -> int:
        """Where the log of holding changes ends now (see :meth:`holding_changes_since`)."""
        return self._holding_log_base + len(self._holding_log)

    def holding_changes_since(self, position: int) -> set[ClaimKey] | None:
        """Claims whose holding allocation changed since ``position``; None when the log no longer
        reaches back that far."""
        if position < self._holding_log_base:
            return None
        return set(self._holding_log[position - self._holding_log_base :])

    def _release(self, key: ClaimKey) -> None:
        old = self.claims.get(key)
        if old is None or old.status.allocation is None:
            return
        for result in old.status.allocation.devices:
            holders = self._in_use.get(result.device_id)
            if holders is not None:
                holders.discard(key)
                if not holders:
                    del self._in_use[result.device_id]

    def assume(self, key: ClaimKey, allocation: AllocationResult) -> None:
        self.forget_assumed(key)
        self._assumed[key] = allocation
        for result in allocation.devices:
            self._assumed_devices[result.device_id] = key
        self._note_holding(key)

    def forget_assumed(self, key: ClaimKey) -> None:
        allocation = self._assumed.pop(key, None)
        if allocation is None:
            return
        for result in allocation.devices:
            if self._assumed_devices.get(result.device_id) == key:
                del self._assumed_devices[result.device_id]
        self._note_holding(key)

    def assumed(self, key: ClaimKey) -> AllocationResult | None:
        return self._assumed.get(key)

    # -- queries --------------------------------------------------------------------------------

    def devices_in_use(self) -> frozenset[DeviceID]:
        return frozenset(self._in_use) | frozenset(self._assumed_devices)

    def holders(self, device: DeviceID) -> frozenset[ClaimKey]:
        return frozenset(self._in_use.get(device, ()))

    def taken_by_others(self, key: ClaimKey, allocation: AllocationResult) -> dict[DeviceID, ClaimKey]:
        """Devices of ``allocation`` (meant for claim ``key``) that another claim holds in a way that
        excludes it, written or being written, with one such holder each. As in the allocator,
        admin access excludes nothing, and shares of one device exclude each other only when an
        exclusive allocation is involved."""
        taken: dict[DeviceID, ClaimKey] = {}
        for result in allocation.devices:
            if result.admin_access:
                continue
            device = result.device_id
            candidates = set(self._in_use.get(device, ()))
            writer = self._assumed_devices.get(device)
            if writer is not None:
                candidates.add(writer)
            candidates.discard(key)
            for other in sorted(candidates):
                held = self._holding.get(other)
                if held is None:
                    continue
                for r in held.devices:
                    if r.device_id != device or r.admin_access:
                        continue
                    if r.share_id is None or result.share_id is None:
                        taken[device] = other
                        break
                if device in taken:
                    break
        return taken

    def allocated_claims(self) -> Iterator[ResourceClaim]:
        """Claims holding devices: allocated ones, and those with an allocation being written."""
        for key, claim in self.claims.items():
            if claim.status.allocation is not None:
                yield claim
                continue
            assumed = self._assumed.get(key)
            if assumed is not None:
                yield replace(claim, status=ResourceClaimStatus(allocation=assumed))

    def double_booked(self) -> dict[DeviceID, frozenset[ClaimKey]]:
        """Devices held by more than one claim (shared devices excepted: results with a shareID)."""
        out: dict[DeviceID, frozenset[ClaimKey]] = {}
        for device, holders in self._in_use.items():
            if len(holders) < 2:
                continue
            exclusive = [
                k
                for k in holders
                if not _shares(self.claims.get(k), device) and not _admin_access(self.claims.get(k), device)
            ]
            if len(exclusive) > 1:
                out[device] = frozenset(exclusive)
        return out

    def pending_claims(self) -> Iterator[ResourceClaim]:
        """Claims without an allocation that are not being deleted."""
        return (self.claims[key] for key in list(self._pending))

    def pending_pod_claims(self) -> Iterator[ResourceClaim]:
        """The pending claims (:meth:`pending_claims`) that a Pod owns."""
        return (self.claims[key] for key in list(self._pending_of_pods))

    def slices_of_node(self, node: str) -> list[ResourceSlice]:
        return [s for s in self.slices.values() if s.node_name == node]


def _shares(claim: ResourceClaim | None, device: DeviceID) -> bool:
    if claim is None or claim.status.allocation is None:
        return False
    return any(r.device_id == device and r.share_id for r in claim.status.allocation.devices)


def _admin_access(claim: ResourceClaim | None, device: DeviceID) -> bool:
    # Admin access does not consume the device (it can be allocated again), as in the scheduler.
    if claim is None or claim.status.allocation is None:
        return False
    return any(r.device_id == device and r.admin_access for r in claim.status.allocation.devices)
