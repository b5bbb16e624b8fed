"""Claims giving way to kube-scheduler: which wait, since when, and when to try them again.

A waiting claim stays in ``waiting`` and is placed again on every change of pods, claims or
devices (one try per burst, ``RECHECK_DELAY_S`` after it), until it is allocated, unallocatable,
deleted or no longer ours. See :mod:`dra_operator.scheduler.contention` for when a placement must
give way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection

from dra_api.model import AllocationResult
from dra_operator.base.settings import Settings
from dra_operator.cel import BudgetExhausted, WorkBudget, charged_to
from dra_operator.model.book import ClaimBook, Wait
from dra_operator.model.cluster import ClaimKey, ClusterModel, DeviceID
from dra_operator.model.workqueue import ClaimQueue
from dra_operator.scheduler.contention import (
    PARKED_RETRY_WINDOW_S,
    Clearance,
    Crowded,
    SchedulerDemand,
    scheduler_demand,
)

WAITING_REASON = "WaitingForScheduler"
POD_STREAM_WINDOW_S = 2.0
"""For this long after a pod last started waiting for kube-scheduler, the operator assumes another
may be waiting that it has not seen yet: its pod events come through Kopf, which hands an object's
events over only after 0.1 s without another, while kube-scheduler may place a new pod within tens
of milliseconds. A benchmark at five pods a second saw the operator take a device such a pod got in
the same moment (bench/RESULTS.md)."""
RECHECK_DELAY_S = 0.1
UNFINISHED_RECHECK_S = 1.0
"""When a claim whose check against the waiting pods ran out of its slice is checked again."""
"""Claims waiting for kube-scheduler are placed again this long after a change of pods, claims or
devices: one try for a burst of changes."""


def reserved_message(*, demand: SchedulerDemand, node: str, devices: list[str], rules: list[str]) -> str:
    """What the WaitingForScheduler condition and the NodeReserved Event say once devices are
    reserved for the claim."""
    pods = _pods_text(demand)
    return (
        f"kube-scheduler is placing {pods} that take every device this claim could get as soon as it "
        f"is freed. Node {node}'s {', '.join(devices)} are now reserved for this claim (DeviceTaintRule "
        f"{', '.join(rules)}, effect NoSchedule: the pods using them keep them); the claim is "
        "allocated there once they are free, and the rules are deleted then"
    )


def _pods_text(demand: SchedulerDemand) -> str:
    if not demand.pods:
        return "pods that keep coming (one arrived less than 2 s ago)"
    return f"{demand.pods} pod{'s' if demand.pods != 1 else ''}"


def waiting_message(*, demand: SchedulerDemand, crowded: Crowded) -> str:
    """What the WaitingForScheduler condition and Event say."""
    pods = _pods_text(demand)
    device = "/".join(crowded.device)
    if crowded.unfinished:
        return (
            f"kube-scheduler is placing {pods} that could use the devices this claim would get; "
            "working out which devices those pods could reach takes their claims' selectors longer "
            "than the operator's slice of its event loop, so the operator gives way for now and checks "
            f"again in {UNFINISHED_RECHECK_S:g} s, from where it stopped"
        )
    return (
        f"kube-scheduler is placing {pods} that could use the devices this claim would get, and "
        f"allocates from the same devices: {device} has {crowded.ahead} free device"
        f"{'s' if crowded.ahead != 1 else ''} ahead of it, where those pods could take {crowded.needed}. "
        "The operator gives way rather than risk both taking one device; it tries again whenever "
        "those pods, their claims or the devices change, and allocates as soon as it finds devices "
        "they cannot reach"
    )


class SchedulerWaits:
    def __init__(
        self,
        *,
        model: ClusterModel,
        settings: Settings,
        classes: tuple[str, ...],
        queue: ClaimQueue,
        book: ClaimBook | None = None,
    ) -> None:
        self.model = model
        self.settings = settings
        self.classes = classes
        self.queue = queue
        self.clearance = Clearance()
        book = book if book is not None else ClaimBook()
        # The claim book's: the waits since the first time, and the claims giving way now (placed
        # again on every change, until allocated, unallocatable, deleted or no longer ours).
        self.waits: dict[ClaimKey, Wait] = book.waits
        self.waiting: set[ClaimKey] = book.waiting
        self._recheck_timer: asyncio.TimerHandle | None = None
        # When devices were last freed or slices, classes or nodes changed (time.monotonic()):
        # what sends parked pods back to kube-scheduler. -inf until then: nothing did yet.
        self._helped_parked_at = float("-inf")
        # When a pod was last seen waiting for kube-scheduler (time.monotonic()); -inf: never.
        self._pods_waiting_at = float("-inf")
        self._pods_arrived = 0
        self._settle_timer: asyncio.TimerHandle | None = None
        self._settle_at = 0.0

    def longest_wait(self) -> float:
        """Seconds the claim that has waited longest for kube-scheduler has waited so far; 0 if none."""
        starts = [self.waits[k].since for k in self.waiting if k in self.waits]
        return max(0.0, time.monotonic() - min(starts)) if starts else 0.0

    def parked_helped(self) -> None:
        """Devices were freed, or slices, classes or nodes changed: parked pods go back to
        kube-scheduler."""
        self._helped_parked_at = time.monotonic()

    def stop(self, key: ClaimKey) -> None:
        """The claim waits no more (allocated, unallocatable, or no longer ours); its wait is kept
        until it is allocated or gone."""
        self.waiting.discard(key)

    def forget(self, key: ClaimKey) -> Wait | None:
        """The claim is allocated or gone: its wait, if it had one."""
        self.waiting.discard(key)
        return self.waits.pop(key, None)

    def start(self, key: ClaimKey) -> Wait:
        """The claim gives way (again): its wait, since the first time."""
        wait = self.waits.get(key)
        if wait is None:
            wait = self.waits[key] = Wait(since=time.monotonic())
        self.waiting.add(key)
        self._recheck_when_parked_settle()
        return wait

    def pods_changed(self) -> None:
        """A pod changed: note when a pod last started waiting for kube-scheduler (one that keeps
        waiting, such as one no node can take, is not a stream of pods)."""
        if self.model.pods_arrived != self._pods_arrived:
            self._pods_arrived = self.model.pods_arrived
            self._pods_waiting_at = time.monotonic()

    def demand(self) -> SchedulerDemand:
        """What the pods waiting for kube-scheduler could take now; while pods keep coming, at
        least one pod not seen yet (:data:`POD_STREAM_WINDOW_S`)."""
        parked = time.monotonic() - self._helped_parked_at < PARKED_RETRY_WINDOW_S
        found = scheduler_demand(
            self.model, ownership=self.settings.ownership, classes=self.classes, parked=parked
        )
        if found.empty and time.monotonic() - self._pods_waiting_at < POD_STREAM_WINDOW_S:
            return SchedulerDemand(pods=0, requests={}, unknown=1)
        return found

    def crowded(
        self,
        allocation: AllocationResult,
        demand: SchedulerDemand,
        *,
        reserved: Collection[DeviceID] = (),
    ) -> Crowded | None:
        # The pods' requests are tenants' selectors evaluated on the loop: within its slice. What
        # they evaluate to is kept (per device), so a check cut short gets further the next time.
        try:
            with charged_to(WorkBudget.loop_slice(self.settings.allocation_search_slice_s)):
                return self.clearance.crowded(
                    model=self.model,
                    allocation=allocation,
                    demand=demand,
                    headroom=self.settings.scheduler_headroom,
                    reserved=reserved,
                )
        except BudgetExhausted:
            first = next(iter(allocation.devices), None)
            device = first.device_id if first is not None else ("", "", "")
            return Crowded(device=device, ahead=0, needed=0, pods=demand.pods, unfinished=True)

    def recheck(self) -> None:
        """Pods, claims or devices changed: try the waiting claims again shortly."""
        if self.waiting and self._recheck_timer is None:
            self._recheck_timer = asyncio.get_running_loop().call_later(
                RECHECK_DELAY_S, self._release_waiting
            )

    def _recheck_when_parked_settle(self) -> None:
        """Parked pods stop counting a while after the last change that may help them, and a pod
        stream after its last pod, with no event to say so: try the waiting claims again then."""
        settle = (
            max(self._helped_parked_at + PARKED_RETRY_WINDOW_S, self._pods_waiting_at + POD_STREAM_WINDOW_S)
            - time.monotonic()
        )
        if settle <= 0 or (self._settle_timer is not None and self._settle_at >= settle + time.monotonic()):
            return
        if self._settle_timer is not None:
            self._settle_timer.cancel()
        self._settle_at = time.monotonic() + settle
        self._settle_timer = asyncio.get_running_loop().call_later(settle + 0.01, self._settled)

    def _settled(self) -> None:
        self._settle_timer = None
        self.recheck()

    def _release_waiting(self) -> None:
        self._recheck_timer = None
        for key in self.waiting:
            self.queue.dirty[key] = None
        self.queue.wake.set()
