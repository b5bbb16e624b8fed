"""How much work a placement may do, CEL included, and the check that stops it.

A :class:`WorkBudget` is a deadline on the CPU clock of the thread that spends it: the event loop's
for its slice, a worker thread's for a search (threads sharing the GIL are not charged for each
other's time). Whoever searches calls :meth:`WorkBudget.check` at its loop points; CEL
evaluation checks the budget that :func:`charged_to` made current for the thread before each
evaluation and at the start of every comprehension, so one expensive selector cannot outrun it.

Upstream has a 10 s timeout per node and a cost limit per CEL evaluation, but nothing across
nodes; here a claim's whole placement answers to one budget.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["BudgetExhausted", "WorkBudget", "charged_to", "check_current", "current", "paced_by"]


class BudgetExhausted(Exception):
    """The budget ran out; the work in progress is abandoned, nothing half-done is kept."""

    def __init__(self, budget: WorkBudget) -> None:
        self.budget = budget
        super().__init__(f"the search used its budget of {budget.seconds:g} s")


class WorkBudget:
    """``seconds`` of ``clock`` from now (or from :meth:`restart`). ``on_loop``: a slice of the
    event loop, where work that cannot be cut short (compiling a long selector) is not started."""

    __slots__ = ("clock", "deadline", "on_loop", "seconds", "started")

    def __init__(
        self, seconds: float, *, clock: Callable[[], float] = time.monotonic, on_loop: bool = False
    ) -> None:
        self.seconds = seconds
        self.clock = clock
        self.on_loop = on_loop
        self.started = clock()
        self.deadline = self.started + seconds

    @classmethod
    def loop_slice(cls, seconds: float) -> WorkBudget:
        """A slice of the event loop thread's CPU time. Not wall-clock time: while worker threads
        search, the loop waits for the GIL now and then, and an easy claim measured on the wall
        clock would be sent to the threads, to wait behind the hard searches it was slowed by."""
        return cls(seconds, clock=time.thread_time, on_loop=True)

    @classmethod
    def thread_cpu(cls, seconds: float) -> WorkBudget:
        """A budget of the calling thread's CPU time (for searches in worker threads)."""
        return cls(seconds, clock=time.thread_time)

    def restart(self) -> None:
        """Start the budget afresh on its clock (a thread's CPU clock counts from the thread's start:
        a budget made elsewhere is restarted by the thread that spends it)."""
        self.started = self.clock()
        self.deadline = self.started + self.seconds

    @property
    def spent(self) -> float:
        return self.clock() - self.started

    @property
    def exhausted(self) -> bool:
        return self.clock() > self.deadline

    def check(self) -> None:
        """Raise :class:`BudgetExhausted` once the deadline has passed; in a paced thread (see
        :func:`paced_by`), first give the interpreter up if the thread's turn is over."""
        now = self.clock()
        if now > self.deadline:
            raise BudgetExhausted(self)
        pace: Callable[[], None] | None = getattr(_current, "pace", None)
        if pace is not None:
            pace()


_current = threading.local()


@contextlib.contextmanager
def charged_to(budget: WorkBudget | None) -> Iterator[None]:
    """Make ``budget`` the one CEL evaluations on this thread check, for the ``with`` block."""
    before = getattr(_current, "budget", None)
    _current.budget = budget
    try:
        yield
    finally:
        _current.budget = before


def current() -> WorkBudget | None:
    """The thread's current budget, if any."""
    budget: WorkBudget | None = getattr(_current, "budget", None)
    return budget


def check_current() -> None:
    """Check the thread's current budget, if any (see :func:`charged_to`)."""
    budget: WorkBudget | None = getattr(_current, "budget", None)
    if budget is not None:
        budget.check()


@contextlib.contextmanager
def paced_by(pace: Callable[[], None]) -> Iterator[None]:
    """Call ``pace`` at every budget check on this thread, for the ``with`` block: a worker thread's
    search hands the interpreter back to the event loop there (see ``planner.offloop``)."""
    before = getattr(_current, "pace", None)
    _current.pace = pace
    try:
        yield
    finally:
        _current.pace = before
