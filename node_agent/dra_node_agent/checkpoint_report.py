"""Telling the cluster that a driver's checkpoint fails closed: a gauge and a Warning Event on the Node.

The store (`checkpoint.CheckpointStore`) calls a `CorruptionReporter` every time it refuses a call
because its file cannot be trusted, from whichever thread used it. The reporter sets
``dra_agent_checkpoint_corrupt{driver}`` to 1 at once and posts a ``CheckpointCorrupted`` Warning
Event on the Node: once per distinct reason, and again for the same reason only after
``repeat_after`` seconds while calls keep being refused, so a kubelet retrying prepares causes no
Event storm. The Event is posted on the event loop in the background: it never blocks or fails a
prepare, and a failed post is logged. After `CheckpointStore.quarantine()` the gauge returns to 0.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

from prometheus_client import Gauge

from dra_api.aiotasks import BackgroundTasks
from dra_node_agent.checkpoint import CheckpointCorrupt

logger = logging.getLogger(__name__)

REASON: Final = "CheckpointCorrupted"  # NVIDIA's driver names the Event so (its PR #1259)
RECOVERY_SECTION: Final = "'Recovering from a corrupt checkpoint' in accel-dra's docs/operations.md"
REPEAT_AFTER: Final = 600.0
# The corruption detail is cut to this many characters, so the message (Events keep 1024) still
# ends with what is refused and where the recovery is described.
MAX_DETAIL: Final = 480
CLOSE_GRACE: Final = 5.0

CHECKPOINT_CORRUPT = Gauge(
    "dra_agent_checkpoint_corrupt",
    "1 while the driver's prepared-claims checkpoint cannot be trusted (every prepare and unprepare "
    "fails closed until an operator fixes it), 0 otherwise.",
    ["driver"],
)


class EventRecorder(Protocol):
    """Where the Event goes (`health.events.NodeEvents`); must log rather than raise."""

    async def record(self, *, type: str, reason: str, message: str) -> None: ...


def corruption_message(*, driver: str, path: Path, error: CheckpointCorrupt) -> str:
    """The Event's message: which file, why, what is refused and where the way out is described."""
    detail = str(error).removeprefix(f"checkpoint {path}: ")
    if len(detail) > MAX_DETAIL:
        detail = detail[: MAX_DETAIL - 3] + "..."
    return (
        f"Checkpoint {path} of driver {driver} cannot be trusted: {detail}. Every prepare and "
        f"unprepare of {driver} claims on this node fails closed until it is fixed; the agent keeps "
        f"the file untouched and never discards it. To recover, see {RECOVERY_SECTION}."
    )


class CorruptionReporter:
    """A `checkpoint.CorruptionListener` for one driver's store; safe to call from any thread."""

    def __init__(
        self,
        *,
        driver: str,
        path: Path,
        events: EventRecorder | None,
        loop: asyncio.AbstractEventLoop,
        repeat_after: float = REPEAT_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.driver = driver
        self.path = path
        self._events = events
        self._loop = loop
        self._repeat_after = repeat_after
        self._clock = clock
        self._lock = threading.Lock()
        self._posted_at: dict[str, float] = {}  # corruption text -> when its Event was last posted
        self._posts = BackgroundTasks()
        self.reported = 0
        CHECKPOINT_CORRUPT.labels(driver).set(0)

    def __call__(self, error: CheckpointCorrupt | None) -> None:
        if error is None:
            CHECKPOINT_CORRUPT.labels(self.driver).set(0)
            with self._lock:
                self._posted_at.clear()  # a later corruption is a new incident, reported again
            return
        CHECKPOINT_CORRUPT.labels(self.driver).set(1)
        reason = str(error)
        now = self._clock()
        with self._lock:
            last = self._posted_at.get(reason)
            if last is not None and now - last < self._repeat_after:
                return
            self._posted_at[reason] = now
            self.reported += 1
        if self._events is None:
            return
        message = corruption_message(driver=self.driver, path=self.path, error=error)
        try:
            self._loop.call_soon_threadsafe(self._spawn, message)
        except RuntimeError:  # the loop is closed: the agent is stopping, the log has the error
            logger.warning("driver %s: cannot post the %s Event, the agent is stopping", self.driver, REASON)

    def _spawn(self, message: str) -> None:
        self._posts.spawn(self._post(message), name=f"checkpoint-event-{self.driver}")

    async def _post(self, message: str) -> None:
        assert self._events is not None
        try:
            await self._events.record(type="Warning", reason=REASON, message=message)
        except Exception as exc:  # best effort: the gauge and the log already say it
            logger.warning("driver %s: cannot post the %s Event: %s", self.driver, REASON, exc)

    async def aclose(self, *, grace: float = CLOSE_GRACE) -> None:
        """Give Events still being posted ``grace`` seconds (one found just before a stop), then
        cancel them."""
        await asyncio.sleep(0)  # run posts scheduled from threads but not yet started
        await self._posts.drain(grace=grace)
