"""Per-device health: the problems seen on a device, its state, and a bounded history of transitions.

A problem is anything that makes a device unfit (a fatal XID, a lost GPU, a failed row remap, a
missing device node). Each problem remembers when it was first and last seen. Events (an XID) are
seen once; polled conditions (a lost GPU, a pending row remap) are seen again on every poll while
they last. A problem stays active until ``recovery_period`` seconds have passed since it was last
seen, so a device returns to healthy only after a quiet period and a flapping one stays out.
All times are Unix seconds from the injected clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

DEFAULT_HISTORY: Final = 32


class State(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"


class ProblemKind(StrEnum):
    """What went wrong; each kind becomes one taint key under the driver's domain."""

    XID = "xid"
    GPU_LOST = "gpu-lost"
    UNHEALTHY = "unhealthy"  # any other device fault; the taint value names it


@dataclass(frozen=True)
class Observation:
    """One thing a probe saw on one device at ``time``.

    ``kind`` None means "checked and fine" (it marks the device as monitored, nothing more).
    ``value`` is the taint value (the XID number, or a short reason such as ``row-remap-failure``).
    """

    device: str
    time: float
    kind: ProblemKind | None = None
    value: str = ""
    message: str = ""


@dataclass
class Problem:
    kind: ProblemKind
    value: str
    message: str
    first_seen: float
    last_seen: float

    @property
    def key(self) -> tuple[ProblemKind, str]:
        return (self.kind, self.value)


@dataclass(frozen=True)
class Transition:
    time: float
    old: State
    new: State
    reasons: tuple[str, ...]


@dataclass
class DeviceHealthState:
    """The state machine of one device: unknown until first checked, then healthy or unhealthy."""

    device: str
    recovery_period: float
    history_size: int = DEFAULT_HISTORY
    state: State = State.UNKNOWN
    since: float = 0.0
    unknown_reason: str = "not checked yet"
    problems: dict[tuple[ProblemKind, str], Problem] = field(default_factory=dict)
    history: deque[Transition] = field(init=False)

    def __post_init__(self) -> None:
        self.history = deque(maxlen=self.history_size)

    def observe(self, observation: Observation) -> bool:
        """Record one observation; returns whether the state changed."""
        if observation.kind is not None:
            key = (observation.kind, observation.value)
            found = self.problems.get(key)
            if found is None:
                self.problems[key] = Problem(
                    kind=observation.kind,
                    value=observation.value,
                    message=observation.message,
                    first_seen=observation.time,
                    last_seen=observation.time,
                )
            else:
                found.last_seen = max(found.last_seen, observation.time)
                found.message = observation.message or found.message
        elif self.state is State.UNKNOWN and not self.problems:
            return self._move(State.HEALTHY, now=observation.time)
        return self._settle(now=observation.time)

    def mark_unknown(self, *, now: float, reason: str) -> bool:
        """The device cannot be checked (monitoring unsupported or failing); problems are kept."""
        self.unknown_reason = reason
        if self.problems or self.state is State.UNKNOWN:
            return False
        return self._move(State.UNKNOWN, now=now)

    def expire(self, *, now: float) -> bool:
        """Drop problems quiet for ``recovery_period``; returns whether the state changed."""
        for key in [k for k, p in self.problems.items() if now - p.last_seen >= self.recovery_period]:
            del self.problems[key]
        return self._settle(now=now)

    def next_expiry(self) -> float | None:
        """When the next problem will expire if not seen again (None without problems)."""
        if not self.problems:
            return None
        return min(p.last_seen for p in self.problems.values()) + self.recovery_period

    def active(self) -> list[Problem]:
        return sorted(self.problems.values(), key=lambda p: (p.kind.value, p.value))

    def reasons(self) -> tuple[str, ...]:
        return tuple(_reason(p) for p in self.active())

    def message(self) -> str:
        if self.state is State.UNHEALTHY:
            return "; ".join(p.message or _reason(p) for p in self.active())
        if self.state is State.UNKNOWN:
            return self.unknown_reason
        return ""

    def _settle(self, *, now: float) -> bool:
        if self.problems:
            return self._move(State.UNHEALTHY, now=now)
        if self.state is State.UNHEALTHY:
            return self._move(State.HEALTHY, now=now)
        return False

    def _move(self, new: State, *, now: float) -> bool:
        if new is self.state:
            return False
        self.history.append(Transition(time=now, old=self.state, new=new, reasons=self.reasons()))
        self.state = new
        self.since = now
        return True


def _reason(problem: Problem) -> str:
    return f"{problem.kind.value}={problem.value}" if problem.value else problem.kind.value
