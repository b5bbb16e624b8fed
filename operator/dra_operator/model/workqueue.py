"""The queue of claims that need attention: which are queued, which are being written, and the
wake-up that the worker waits on.

A key is in ``dirty`` at most once however often it is marked, and a claim being written is not
taken again until its write ends: one task per claim at a time.

The worker takes claims one at a time, as write slots free up (:meth:`ClaimQueue.next`): the most
urgent tier first and, within a tier, the namespaces in turn, each namespace's claims in order. A
claim marked while others wait takes its namespace's turn, so a tenant that creates a thousand
claims at once does not put another tenant's one claim behind all of them.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from dra_operator.model.cluster import ClaimKey


class Turns:
    """Claims taken from the queue and not started yet, by tier of urgency (lower first) and
    namespace; namespaces take turns within a tier. Each operation costs O(1) amortised, whatever
    the number of claims (a takeover queues every claim of the cluster)."""

    def __init__(self) -> None:
        self._lanes: dict[tuple[int, str], deque[ClaimKey]] = {}
        self._rotation: dict[int, deque[str]] = {}
        self._keys: set[ClaimKey] = set()
        # Namespaces that had a turn before: one that comes back joins the end of the line; one
        # never served goes before them (it has waited longest of all), after the others never served.
        self._served: set[str] = set()
        self._unserved: dict[int, int] = {}  # per tier: how many at the front of its line were never served

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def add(self, keys: Iterable[ClaimKey], *, tier: Callable[[ClaimKey], int]) -> None:
        """Queue ``keys`` (in the given order within each namespace); keys queued already stay put."""
        for key in keys:
            if key in self._keys:
                continue
            self._keys.add(key)
            level = tier(key)
            lane = self._lanes.get((level, key.namespace))
            if lane is None:
                lane = self._lanes[(level, key.namespace)] = deque()
                rotation = self._rotation.setdefault(level, deque())
                if key.namespace in self._served:
                    rotation.append(key.namespace)
                else:
                    front = self._unserved.get(level, 0)
                    rotation.insert(front, key.namespace)
                    self._unserved[level] = front + 1
            lane.append(key)

    def next(self) -> ClaimKey | None:
        """The next claim: the lowest tier's next namespace in turn, and its oldest queued claim."""
        if not self._rotation:
            return None
        level = min(self._rotation)
        rotation = self._rotation[level]
        namespace = rotation.popleft()
        if namespace not in self._served:
            self._served.add(namespace)
            self._unserved[level] -= 1
        lane = self._lanes[(level, namespace)]
        key = lane.popleft()
        if lane:
            rotation.append(namespace)
        else:
            del self._lanes[(level, namespace)]
            if not rotation:
                del self._rotation[level]
                self._unserved.pop(level, None)
        self._keys.discard(key)
        return key

    def drain(self) -> list[ClaimKey]:
        """Every claim still waiting its turn; none is left."""
        out = list(self._keys)
        self._lanes.clear()
        self._rotation.clear()
        self._unserved.clear()
        self._keys.clear()
        return out


class ClaimQueue:
    def __init__(self) -> None:
        # A dict, not a set: claims come out in the order they were marked, before sorting.
        self.dirty: dict[ClaimKey, None] = {}
        self.busy: set[ClaimKey] = set()
        self.turns = Turns()
        self.wake = asyncio.Event()

    def idle(self) -> bool:
        """No claim queued, waiting its turn or being written."""
        return not self.dirty and not self.busy and not self.turns

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

    def next(self, *, order: Callable[[ClaimKey], Any], tier: Callable[[ClaimKey], int]) -> ClaimKey | None:
        """The next claim to reconcile (see the module docstring); claims marked since the last
        call join the turns first (sorted by ``order`` among themselves)."""
        if self.dirty:
            self.turns.add(self.take(order=order), tier=tier)
        return self.turns.next()

    def hold_back(self) -> None:
        """Put the claims waiting their turn back into the queue (the worker pauses)."""
        for key in self.turns.drain():
            self.dirty[key] = None

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
