"""Background tasks that a component starts and forgets, drained with a grace period when it stops.

The event loop keeps only weak references to tasks, so a task nobody holds can vanish mid-run;
`BackgroundTasks` holds each one until it ends. A task that fails is logged when it ends rather
than by asyncio's "exception was never retrieved" whenever it is collected. At stop, `drain` gives
the tasks still running a bounded time, then cancels them, so a stuck call never holds up a stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class BackgroundTasks:
    """A set of running tasks, each held until it ends.

    With ``log_failures`` (the default) a task that ends with an exception is logged here; turn it
    off where whoever spawned the tasks awaits them and reports their failures itself.
    """

    def __init__(self, *, log_failures: bool = True) -> None:
        self._log_failures = log_failures
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Start ``coro`` as a task on the running loop and hold it until it ends."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not self._log_failures or task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            logger.error("background task %s failed", task.get_name(), exc_info=exc)

    async def join(self) -> None:
        """Wait until no task runs, those started meanwhile included (tests)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def drain(self, *, grace: float, cancel: bool = True) -> set[asyncio.Task[Any]]:
        """Wait up to ``grace`` seconds for the tasks running now; return those still running then.

        With ``cancel`` (the default) those are cancelled, and waited for until they have ended;
        without it they are left running. Never raises a task's exception.
        """
        if not self._tasks:
            return set()
        _, late = await asyncio.wait(set(self._tasks), timeout=grace)
        if cancel and late:
            for task in late:
                task.cancel()
            await asyncio.wait(late)
        return late
