"""Fault injection for the tests: ``DRA_AGENT_TEST_PAUSE_AT`` names one point where a call stops.

- ``prepare-started``: ``PrepareStarted`` recorded, no device touched;
- ``vfio-unbound``: a GPU for passthrough let go by its driver, not yet bound to vfio-pci;
- ``devices-set-up``: devices set up, no CDI spec yet;
- ``cdi-written``: CDI spec written, not yet ``PrepareCompleted``;
- ``unprepare-started``: unprepare of a recorded claim, before anything is torn down or removed.

There the call writes ``<state dir>/paused-at-<point>`` and waits until that file is removed, so a
test can SIGKILL the agent exactly there (crash tests) or restart the kubelet and then let the call
go on (kubelet restart tests). Each point pauses once per handler, so a reissued call goes through.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

PAUSE_ENV: Final = "DRA_AGENT_TEST_PAUSE_AT"
PAUSE_POINTS: Final = (
    "prepare-started",
    "vfio-unbound",
    "devices-set-up",
    "cdi-written",
    "unprepare-started",
)
PAUSE_POLL_SECONDS: Final = 0.1


class PausePoints:
    """The pause point named in the environment when the handler was made, paused at once."""

    def __init__(self, state_dir: Path) -> None:
        self._state_dir = state_dir
        self._pause_at = os.environ.get(PAUSE_ENV, "")
        self._paused: set[str] = set()

    async def reached(self, point: str) -> None:
        if self._pause_at != point or point in self._paused:
            return
        # Once only: the call the kubelet reissues after the paused one must go through.
        self._paused.add(point)
        marker = self._state_dir / f"paused-at-{point}"
        await asyncio.to_thread(marker.write_text, f"{os.getpid()}\n")
        logger.warning("test fault injection: pausing at %s until %s is removed", point, marker)
        # Polled: the marker is the only channel a test has into the agent process.
        while True:
            await asyncio.sleep(PAUSE_POLL_SECONDS)
            if not await asyncio.to_thread(marker.exists):
                break
        logger.warning("test fault injection: going on from %s", point)
