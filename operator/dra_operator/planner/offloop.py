"""Placements that outgrow their slice of the event loop finish in worker threads.

The operator places a claim on its event loop first, within a short slice (``--allocation-search-
slice-seconds``): nearly every claim is answered there, on the planner the loop keeps current. A
claim that is not answered in its slice is searched again here, with the whole budget
(``--allocation-search-budget-seconds`` of the thread's CPU time), while the loop goes on serving
watches, ``/healthz`` and other claims.

A worker thread never touches the loop's planner: it gets a :class:`PlannerSnapshot` (the current
slice index, which is never changed once built, and copies of the classes, nodes and allocations)
and builds a planner of its own from it. The answer may be stale by the time it comes back: the
caller checks the devices against the model before it holds them, as for any other race.

Fairness: at most one search per namespace runs at a time, and namespaces take turns for the
threads, so one tenant's claims cannot keep another's waiting behind them. Threads share the GIL
with the loop; a CPU-bound search gets about half of the interpreter while the loop is busy, and
all of it while the loop is idle.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from dra_api.model import AllocationResult, DeviceClass, Node, ResourceClaim
from dra_operator.allocator import FeatureGates, SliceIndex
from dra_operator.cel import WorkBudget
from dra_operator.planner.planner import Planner, PlanOutcome

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PlannerSnapshot:
    """What a worker thread needs to place claims as the loop's planner would, without sharing
    anything the loop changes (the slice index is not changed after it is built)."""

    slices: SliceIndex
    classes: dict[str, DeviceClass]
    nodes: list[Node]
    allocations: list[AllocationResult]
    gates: FeatureGates
    policy: str

    def plan(self, claims: Sequence[ResourceClaim], *, budget_s: float) -> tuple[PlanOutcome, float]:
        """Place ``claims`` within ``budget_s`` seconds of this thread's CPU time (run it in the
        thread that spends them); the outcome and the CPU seconds it took."""
        budget = WorkBudget.thread_cpu(budget_s)
        planner = Planner(
            classes=self.classes,
            slices=self.slices,
            nodes=self.nodes,
            allocated=self.allocations,
            gates=self.gates,
            policy=self.policy,
        )
        budget.restart()  # the planner's set-up is the operator's cost, not the claim's
        outcome = planner.plan(list(claims), budget=budget)
        return outcome, budget.spent


@dataclass(slots=True)
class _Job(Generic[T]):
    work: Callable[[], T]
    future: asyncio.Future[T]


@dataclass(slots=True)
class _Turns:
    waiting: dict[str, deque[_Job[Any]]] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    # When each namespace last had a search started (a counter): the one served longest ago goes next.
    served: dict[str, int] = field(default_factory=dict)
    starts: int = 0


class SearchThreads:
    """Runs searches in ``threads`` worker threads, one per namespace at a time, namespaces in turn."""

    def __init__(self, *, threads: int) -> None:
        self.threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._turns = _Turns()

    @property
    def busy(self) -> int:
        """Searches running now."""
        return len(self._turns.running)

    @property
    def queued(self) -> int:
        """Searches waiting for a thread."""
        return sum(len(q) for q in self._turns.waiting.values())

    async def run(self, *, namespace: str, work: Callable[[], T]) -> T:
        """``work()`` in a worker thread, when its namespace's turn comes. Cancelling the caller
        drops a job still waiting; one already running finishes (its budget bounds it) unheard."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._turns.waiting.setdefault(namespace, deque()).append(_Job(work=work, future=future))
        self._dispatch()
        return await future

    def _dispatch(self) -> None:
        turns = self._turns
        while len(turns.running) < self.threads:
            ready = [ns for ns in turns.waiting if ns not in turns.running]
            if not ready:
                return
            namespace = min(ready, key=lambda ns: turns.served.get(ns, -1))
            jobs = turns.waiting[namespace]
            job = jobs.popleft()
            if not jobs:
                del turns.waiting[namespace]
            if job.future.cancelled():
                continue
            turns.running.add(namespace)
            turns.served[namespace] = turns.starts
            turns.starts += 1
            self._start(namespace, job)

    def _start(self, namespace: str, job: _Job[Any]) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self.threads, thread_name_prefix="placement-search"
            )
        loop = asyncio.get_running_loop()
        running = loop.run_in_executor(self._executor, job.work)

        def finished(done: asyncio.Future[Any]) -> None:
            self._turns.running.discard(namespace)
            if namespace not in self._turns.waiting and namespace not in self._turns.running:
                self._turns.served.pop(namespace, None)  # nothing left of it: forget it
            if not job.future.cancelled():
                if done.cancelled():
                    job.future.cancel()
                elif (error := done.exception()) is not None:
                    job.future.set_exception(error)
                else:
                    job.future.set_result(done.result())
            self._dispatch()

        running.add_done_callback(finished)

    def shutdown(self) -> None:
        """Stop taking work; searches running finish within their budgets."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
