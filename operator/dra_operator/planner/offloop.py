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
threads, so one tenant's claims cannot keep another's waiting behind them.

The interpreter: threads share the GIL with the loop, and left alone each CPU-bound thread gets as
much of it as the loop, so two searches would leave the loop a third, and a tenant's hopeless
claims would slow every other claim's allocation. :class:`InterpreterShare` paces them: one search
computes at a time, in turns of a few milliseconds of its CPU time, and after each turn sleeps
(the GIL released) long enough that the searches together take at most ``share`` of the
interpreter (``--allocation-search-share``). The budget counts the thread's CPU time, so pacing
makes a search's answer later, never shorter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from dra_api.model import AllocationResult, DeviceClass, Node, ResourceClaim
from dra_operator.allocator import FeatureGates, SliceIndex
from dra_operator.cel import WorkBudget
from dra_operator.cel.budget import paced_by
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


class InterpreterShare:
    """Search threads take turns of ``turn_s`` of their CPU time, one at a time, first come first
    served; each turn is followed by a rest (the GIL free for the loop) so that together they take
    at most ``share`` of the interpreter."""

    def __init__(self, share: float, *, turn_s: float = 0.005) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"the searches' share of the interpreter must be in (0, 1], got {share:g}")
        self.share = share
        self.turn_s = turn_s
        self.rest_s = turn_s * (1 - share) / share
        self._cond = threading.Condition()
        self._waiting: deque[object] = deque()
        self._held = False
        self._turn = threading.local()
        self.rests = 0
        """Rests taken so far (a count for tests and curiosity)."""

    @contextlib.contextmanager
    def searching(self) -> Iterator[None]:
        """Hold a turn for the ``with`` block; budget checks inside it pace the thread. A share of
        1 paces nothing: the threads and the loop take the interpreter as the GIL hands it out."""
        if self.share >= 1:
            yield
            return
        self._enter()
        try:
            with paced_by(self._pace):
                yield
        finally:
            self._leave()

    def _enter(self) -> None:
        ticket = object()
        with self._cond:
            self._waiting.append(ticket)
            self._cond.wait_for(lambda: not self._held and self._waiting[0] is ticket)
            self._waiting.popleft()
            self._held = True
        self._turn.began = time.thread_time()

    def _leave(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def _pace(self) -> None:
        if time.thread_time() - self._turn.began < self.turn_s:
            return
        self.rests += 1
        if self.rest_s > 0:
            time.sleep(self.rest_s)  # still holding the turn: no other search takes the rest
        if self._waiting:  # another search waits: its turn now
            self._leave()
            self._enter()
        else:
            self._turn.began = time.thread_time()


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
    """Runs searches in ``threads`` worker threads, one per namespace at a time, namespaces in turn,
    taking together at most ``share`` of the interpreter."""

    def __init__(self, *, threads: int, share: float = 0.5) -> None:
        self.threads = threads
        self.share = InterpreterShare(share)
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
        running = loop.run_in_executor(self._executor, self._paced, job.work)

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

    def _paced(self, work: Callable[[], T]) -> T:
        with self.share.searching():
            return work()

    def shutdown(self) -> None:
        """Stop taking work; searches running finish within their budgets."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
