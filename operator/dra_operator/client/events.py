"""Events, posted behind the claim writes.

An Event explains; the claim's finalizer and ``status.allocation`` are the state. Each costs the
API server a write, and during a burst of claims the API server is the bottleneck: an ``Allocated``
Event per claim made a third of the operator's writes. So Events wait in a queue and go out when
the claim worker is idle; while it is busy, only Events older than ``max_delay`` are posted, one at
a time, so that explanations still arrive under sustained load.

The queue is bounded, as client-go's event broadcaster is: when it is full, the oldest Normal Event
is dropped (Warnings are kept as long as there are Normal ones to drop) and counted in
``dra_operator_events_dropped``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dra_api.aiotasks import BackgroundTasks

logger = logging.getLogger(__name__)


class EventApi(Protocol):
    async def post_event(
        self, *, involved: Mapping[str, Any], type_: str, reason: str, message: str
    ) -> None: ...


class DropCounter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


@dataclass(frozen=True)
class _Pending:
    involved: Mapping[str, Any]
    type_: str
    reason: str
    message: str
    queued_at: float


class EventSink:
    def __init__(
        self,
        api: EventApi,
        *,
        idle: Callable[[], bool],
        dropped: DropCounter | None = None,
        max_delay: float = 10.0,
        capacity: int = 5000,
        idle_concurrency: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.idle = idle
        self.dropped = dropped
        self.max_delay = max_delay
        self.capacity = capacity
        self.idle_concurrency = idle_concurrency
        self.clock = clock
        self._queue: deque[_Pending] = deque()
        self._queued = asyncio.Event()
        self._in_flight = 0

    def __len__(self) -> int:
        return len(self._queue)

    def post(self, *, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Queue an Event; never waits."""
        if len(self._queue) >= self.capacity and not self._drop_one():
            logger.warning(
                "event queue full: dropping %s event %s on %s", type_, reason, involved.get("name")
            )
            if self.dropped is not None:
                self.dropped.inc()
            return
        self._queue.append(_Pending(involved, type_, reason, message, self.clock()))
        self._queued.set()

    def _drop_one(self) -> bool:
        for i, pending in enumerate(self._queue):
            if pending.type_ == "Normal":
                del self._queue[i]
                logger.info(
                    "event queue full: dropped %s event on %s", pending.reason, pending.involved.get("name")
                )
                if self.dropped is not None:
                    self.dropped.inc()
                return True
        return False

    def _may_send(self) -> bool:
        if not self._queue:
            return False
        if self.idle():
            return self._in_flight < self.idle_concurrency
        return self._in_flight == 0 and self.clock() - self._queue[0].queued_at >= self.max_delay

    async def run(self, *, poll: float = 0.05) -> None:
        """Post queued Events forever."""
        sending = BackgroundTasks()
        while True:
            if not self._queue:
                self._queued.clear()
                await self._queued.wait()
            while self._may_send():
                pending = self._queue.popleft()
                self._in_flight += 1
                sending.spawn(self._send(pending))
            # The worker's idleness is polled rather than signalled: a few checks per second cost
            # nothing next to the writes they wait for.
            await asyncio.sleep(poll)

    async def _send(self, pending: _Pending) -> None:
        try:
            await self.api.post_event(
                involved=pending.involved, type_=pending.type_, reason=pending.reason, message=pending.message
            )
        except Exception:
            logger.exception("posting %s event %s failed", pending.type_, pending.reason)
        finally:
            self._in_flight -= 1

    async def flush(self, *, within: float = 30.0) -> None:
        """Wait until every queued Event has been posted (tests, shutdown)."""
        deadline = self.clock() + within
        while self._queue or self._in_flight:
            if self.clock() > deadline:
                raise TimeoutError(f"{len(self._queue)} events still queued")
            await asyncio.sleep(0.02)
