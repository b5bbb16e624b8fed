"""When to try a claim again after an API error.

Per claim, the delay doubles with each consecutive failure (``base``, 2 x ``base``, ... up to
``cap``) and starts over after a success, as client-go's per-item rate limiter does. A 429 or 503
with Retry-After pauses *every* write until then: the server asked this client to back off, and the
next claim's write would only be refused the same way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from typing import Any

from dra_operator.model.book import Search


class Backoff:
    def __init__(
        self,
        *,
        base: float = 0.5,
        cap: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        failures: dict[Any, int] | None = None,
    ) -> None:
        self.base = base
        self.cap = cap
        self.clock = clock
        # Failed attempts in a row per claim: the claim book's, when the reconciler gives it.
        self._failures: dict[Any, int] = {} if failures is None else failures
        self._paused_until = 0.0

    def failed(self, key: Hashable, *, retry_after: float | None = None) -> tuple[int, float]:
        """Record a failed attempt; returns (which attempt it was, seconds to wait before the next)."""
        attempt = self._failures.get(key, 0) + 1
        self._failures[key] = attempt
        delay = min(self.cap, self.base * 2 ** (attempt - 1))
        if retry_after is not None:
            delay = max(delay, retry_after)
            self._paused_until = max(self._paused_until, self.clock() + retry_after)
        return attempt, delay

    def succeeded(self, key: Hashable) -> None:
        self._failures.pop(key, None)

    def forget(self, key: Hashable) -> None:
        self._failures.pop(key, None)

    def pause_left(self) -> float:
        return max(0.0, self._paused_until - self.clock())

    async def wait_for_pause(self) -> None:
        """Sleep while a Retry-After is in force (it may be extended while sleeping)."""
        while True:
            left = self.pause_left()
            if left <= 0:
                return
            await asyncio.sleep(left)


class SearchBackoff:
    """Claims whose placement outgrew the event loop's slice, and when those whose search used its
    whole budget may be searched again.

    A claim that once needed a worker thread goes straight to one on its next attempt: trying it on
    the loop again would only spend another slice. A claim whose search used its whole budget waits
    ``base``, then twice that, and so on up to ``cap``, before the next search, whatever changes in
    the cluster meanwhile: each search is the expensive part, so it is never repeated in a loop. A
    claim whose search in a thread found no room waits ``COOLDOWN_FACTOR`` times what that search
    cost before the next, which the changes that come meanwhile bring about once it is over: an
    expensive claim takes at most a tenth of a thread, however often devices come and go."""

    COOLDOWN_FACTOR = 10.0

    def __init__(
        self,
        *,
        base: float,
        cap: float,
        clock: Callable[[], float] = time.monotonic,
        searches: dict[Any, Search] | None = None,
    ) -> None:
        self.base = base
        self.cap = cap
        self.clock = clock
        # Per claim: the claim book's, when the reconciler gives it.
        self._searches: dict[Any, Search] = {} if searches is None else searches

    def _of(self, key: Hashable) -> Search:
        found = self._searches.get(key)
        if found is None:
            found = self._searches[key] = Search()
        return found

    def off_loop(self, key: Hashable) -> bool:
        """Whether the claim's placement goes straight to a worker thread."""
        found = self._searches.get(key)
        return found is not None and found.off_loop

    def went_off_loop(self, key: Hashable) -> None:
        self._of(key).off_loop = True

    def exhausted(self, key: Hashable) -> tuple[int, float]:
        """Record a search that used its whole budget: (how many have, seconds until the next)."""
        search = self._of(key)
        search.exhausted += 1
        delay = min(self.cap, self.base * 2 ** (search.exhausted - 1))
        search.due_at = self.clock() + delay
        return search.exhausted, delay

    def found_no_room(self, key: Hashable, *, spent_s: float) -> None:
        """A search in a thread that cost ``spent_s`` found no room: cool down before the next."""
        self._of(key).cooling_until = self.clock() + self.COOLDOWN_FACTOR * spent_s

    def waiting(self, key: Hashable) -> bool:
        """Whether the claim must not be searched yet (its back-off is running)."""
        found = self._searches.get(key)
        return found is not None and found.exhausted > 0 and self.clock() < found.due_at

    def defer(self, key: Hashable) -> float | None:
        """Whether the claim is cooling down: None when it may be searched now; else, the first time
        it is asked for meanwhile, the seconds until it may be (to come back then), and 0.0 after."""
        search = self._searches.get(key)
        if search is None or not search.cooling_until:
            return None
        left = search.cooling_until - self.clock()
        if left <= 0:
            search.cooling_until = 0.0
            search.deferred = False
            return None
        if search.deferred:
            return 0.0
        search.deferred = True
        return left

    def forget(self, key: Hashable) -> None:
        """The claim was allocated or deleted."""
        self._searches.pop(key, None)

    def __len__(self) -> int:
        return sum(1 for s in self._searches.values() if s.off_loop or s.exhausted)
