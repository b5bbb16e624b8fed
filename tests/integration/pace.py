"""How much slower than an idle machine this one runs now, for the few bounds that are about time.

Most integration tests poll for a condition and need nothing of this. A handful state a promise in
seconds (issue 28's "every standalone claim allocated within 10 s while pods stream in"), or must
let a few passes of the operator go by before checking that nothing happened. On a shared 2-core
machine a fixed number of seconds is either too tight under load or too loose on an idle one, so
those tests scale theirs by :func:`slowdown`, measured around the work they time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

MOST = 3.0
"""The largest factor: a bound three times its idle value still tells the fixed behaviour from the
regression each scaled test guards against (their docstrings say why)."""


def slowdown(*, most: float = MOST) -> float:
    """The 1-minute load average per CPU (runnable and waiting tasks for each CPU that could run
    them), at least 1 and at most ``most``."""
    cpus = os.cpu_count() or 1
    return min(most, max(1.0, os.getloadavg()[0] / cpus))


@dataclass
class Pace:
    """The largest :func:`slowdown` seen at the start and the end of a piece of work."""

    factor: float = 1.0

    def seen(self) -> None:
        self.factor = max(self.factor, slowdown())

    def scaled(self, seconds: float) -> float:
        return seconds * self.factor


@contextmanager
def measured() -> Iterator[Pace]:
    """``with measured() as pace:`` around the timed work; ``pace.scaled(bound)`` afterwards."""
    pace = Pace()
    pace.seen()
    yield pace
    pace.seen()


def let_pass(seconds: float) -> None:
    """Sleep ``seconds`` scaled by :func:`slowdown`: the time a test gives the system to do
    something it must not do (a second Event, a deallocation) before checking that it did not."""
    time.sleep(seconds * slowdown())
