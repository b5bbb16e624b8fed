"""The queue of claims that need attention: which are queued, which are being written, and the
wake-up that the worker waits on.

A key is in ``dirty`` at most once however often it is marked, and a claim being written is not
taken again until its write ends: one task per claim at a time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from dra_operator.clustermodel import ClaimKey


class ClaimQueue:
    def __init__(self) -> None:
        # A dict, not a set: claims come out in the order they were marked, before sorting.
        self.dirty: dict[ClaimKey, None] = {}
        self.busy: set[ClaimKey] = set()
        self.wake = asyncio.Event()

    def idle(self) -> bool:
        """No claim queued or being written."""
        return not self.dirty and not self.busy

    def mark(self, key: ClaimKey) -> None:
        self.dirty[key] = None
        self.wake.set()

    def mark_all(self, keys: Iterable[ClaimKey]) -> None:
        """Queue ``keys``; wake the worker only if there were any."""
        woke = False
        for key in keys:
            self.dirty[key] = None
            woke = True
        if woke:
            self.wake.set()

    def mark_later(self, delay: float, key: ClaimKey) -> None:
        asyncio.get_running_loop().call_later(delay, self.mark, key)

    def take(self, order: Callable[[ClaimKey], Any]) -> list[ClaimKey]:
        """The queued claims not being written now, in ``order``; they leave the queue."""
        batch = [k for k in self.dirty if k not in self.busy]
        for key in batch:
            del self.dirty[key]
        return sorted(batch, key=order)

    def start(self, key: ClaimKey) -> None:
        """The claim is being written until ``done``."""
        self.busy.add(key)

    def done(self, key: ClaimKey) -> None:
        """The claim's write ended: wake the worker if it was marked again meanwhile."""
        self.busy.discard(key)
        if key in self.dirty:
            self.wake.set()

    async def drain(self, *, within: float = 30.0) -> None:
        """Wait until the queue is empty and no claim is being written (tests)."""
        deadline = time.monotonic() + within
        while self.dirty or self.busy:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"claims still queued: {sorted(map(str, self.dirty | dict.fromkeys(self.busy)))}"
                )
            await asyncio.sleep(0.02)
