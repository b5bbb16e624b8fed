"""Rate limits for log lines that would repeat once per attempt.

A claim retried with back-off logs each attempt; a fault that keeps coming back (or a bug) must not
turn that into megabytes of the same line. :class:`LogThrottle` lets one line per key through per
interval and tells the next one how many it held back, so nothing is hidden, only counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

_PRUNE_AT = 4096  # keys remembered before the quiet ones are dropped


class LogThrottle:
    def __init__(self, *, interval: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._last: dict[Hashable, float] = {}
        self._held: dict[Hashable, int] = {}

    def allow(self, key: Hashable) -> int | None:
        """None: hold this line back. Otherwise log it; the number is how many lines of ``key``
        were held back since the last one logged."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        if len(self._last) >= _PRUNE_AT:
            self._prune(now)
        self._last[key] = now
        return self._held.pop(key, 0)

    def _prune(self, now: float) -> None:
        for key in [k for k, t in self._last.items() if now - t >= self.interval]:
            del self._last[key]
            self._held.pop(key, None)


def held_back(count: int) -> str:
    """The suffix that says how many lines like this one were not logged."""
    return f" ({count} more like this not logged)" if count else ""
