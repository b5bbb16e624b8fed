"""Giving devices back: a deleted claim we allocated, a template claim its pod no longer uses,
reservations of pods that are gone, and our copy of a device another allocator also wrote.

A claim a pod still uses is never deallocated from under it; our finalizer leaves a deleted claim
only after its devices are released.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from dra_api.model import ResourceClaim
from dra_operator.claims.status import ClaimStatusWriter, involved
from dra_operator.claims.tell import Released
from dra_operator.client.errors import Conflict, Gone
from dra_operator.client.events import EventSink
from dra_operator.client.kubeapi import KubeApi
from dra_operator.model.book import ClaimBook
from dra_operator.model.cluster import ClaimKey, ClusterModel
from dra_operator.model.metrics import Metrics
from dra_operator.model.ownership import allocated_by_us, generated_from_template
from dra_operator.model.shares import ShareLedger
from dra_operator.model.workqueue import ClaimQueue

logger = logging.getLogger(__name__)

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class ClaimReleaser:
    def __init__(
        self,
        *,
        model: ClusterModel,
        api: KubeApi,
        metrics: Metrics,
        events: EventSink,
        writer: ClaimStatusWriter,
        queue: ClaimQueue,
        refetch: Callable[[ClaimKey], Awaitable[None]],
        book: ClaimBook | None = None,
    ) -> None:
        self.model = model
        self.api = api
        self.metrics = metrics
        self.events = events
        self.writer = writer
        self.queue = queue
        self.refetch = refetch
        self.shares = ShareLedger(model)
        # The claim book's claims a pod has reserved: a template claim among them is deallocated
        # when no pod reserves it any more (a claim never reserved is waiting for its first pod).
        self.was_reserved: set[ClaimKey] = (book if book is not None else ClaimBook()).reserved_by_pods

    async def _deallocate(self, claim: ResourceClaim) -> ResourceClaim | None:
        current = await self.writer.clear_allocation(claim)
        self.metrics.deallocations.inc()
        return current

    async def release_deleted(self, claim: ResourceClaim) -> Released | None:
        """A deleted claim we allocated: deallocate it once no pod uses it, then let it go."""
        reserved = [
            r
            for r in claim.status.reserved_for
            if not await self._consumer_gone(claim, r.name, r.uid, r.resource)
        ]
        if reserved:
            if len(reserved) != len(claim.status.reserved_for):
                await self.writer.set_reserved_for(claim, [r.to_json() for r in reserved])
            return None  # a pod still uses it: never pulled from under a running pod
        current: ResourceClaim | None = claim
        released: Released | None = None
        if claim.status.allocation is not None:
            current = await self._deallocate(claim)
            if current is None:
                return None
            released = Released(claim=claim, allocation=claim.status.allocation, why="claim deleted")
        if current is not None:
            await self.writer.patch_meta(current, finalizer=False, condition=None)
        return released

    async def maintain_allocated(self, claim: ResourceClaim) -> Released | None:
        """An allocated claim of ours: drop stale reservations; deallocate a template claim that
        its pod no longer uses."""
        key = ClaimKey(claim.namespace, claim.name)
        live = [
            r
            for r in claim.status.reserved_for
            if not await self._consumer_gone(claim, r.name, r.uid, r.resource)
        ]
        if len(live) != len(claim.status.reserved_for):
            logger.info("claim %s: removing reservations of pods that are gone", key)
            updated = await self.writer.set_reserved_for(claim, [r.to_json() for r in live])
            if updated is None:
                return None
            claim = updated
        if not claim.status.reserved_for and key in self.was_reserved and generated_from_template(claim):
            assert claim.status.allocation is not None
            allocation = claim.status.allocation
            current = await self._deallocate(claim)
            self.was_reserved.discard(key)
            if current is not None:
                await self.writer.patch_meta(current, finalizer=False, condition=None)
            return Released(claim=claim, allocation=allocation, why="no pod uses the claim any more")
        return None

    async def _consumer_gone(self, claim: ResourceClaim, name: str, uid: str, resource: str) -> bool:
        """Whether a reservedFor pod is gone, replaced (other UID) or finished. The pod watch may
        lag behind, so 'gone' is confirmed with the API server before acting on it."""
        if resource != "pods":
            return False  # other consumers (PodGroups) are left to their owners
        known = self.model.pods.get((claim.namespace, name))
        if known is not None and known.uid == uid and known.phase not in _TERMINAL_PHASES:
            return False
        pod = await self.api.get_pod(namespace=claim.namespace, name=name)
        if pod is None:
            return True
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase", "")
        return meta.get("uid") != uid or phase in _TERMINAL_PHASES

    async def repair_double_bookings(self) -> None:
        """A device in two claims, or shares of a device that together pass its capacity, can only
        come from two allocators racing on different claims (the scheduler and this operator). Give
        up our copy if no pod uses it yet.

        kube-scheduler (1.36) keeps allocated devices in a set, adds a claim's devices when it sees
        the claim allocated and removes them when it sees it deallocated or deleted; an update that
        leaves the allocation as it was changes nothing. So after this release it counts the device
        free although the other claim still holds it, until it lists claims again: no write of ours
        can tell it otherwise. Avoiding the race (the scheduler grace period) is the real cure.
        (Shares are counted by their share IDs and consumed capacity, so releasing ours leaves its
        count right.)"""
        conflicts = [(device, holders, False) for device, holders in self.model.double_booked().items()]
        conflicts += [(device, holders, True) for device, holders in self.shares.overbooked().items()]
        for device, holders, shares in conflicts:
            for key in sorted(holders):
                claim = self.model.claims.get(key)
                if claim is None or not allocated_by_us(claim) or claim.status.reserved_for:
                    continue
                others = [k for k in holders if k != key]
                what = "shares beyond the capacity of device" if shares else "device"
                logger.warning("%s %s allocated to %s and %s; releasing ours", what, device, key, others)
                # Other tenants' claims are counted, not named (the log names them).
                message = (
                    f"device {'/'.join(device)}: this claim's share and those of {len(others)} other "
                    "claim(s), allocated by another allocator at the same time, together ask for more "
                    "than the device has; allocating this claim again"
                    if shares
                    else f"device {'/'.join(device)} was also allocated to {len(others)} other claim(s) "
                    "by another allocator at the same time; allocating this claim again"
                )
                self.events.post(
                    involved=involved(claim, api_version=self.api.api_version),
                    type_="Warning",
                    reason="DeviceConflict",
                    message=message,
                )
                try:
                    await self._deallocate(claim)
                except (Conflict, Gone):
                    await self.refetch(key)
                self.queue.mark(key)
                break
