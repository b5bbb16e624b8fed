"""How many log lines and Events one claim may cause: a tenant whose claim fails every retry, or
who makes many claims fail, must not fill the agent's log or the API server's Events.

``ClaimMessageLimiter.allow`` lets a claim's message through when it is not the same text as one
let through in the last ``repeat_after`` seconds and the claim still has a token: ``burst`` to
begin with, one more every ``interval`` seconds. What it holds back is counted in
``dra_agent_claim_messages_dropped_total{kind}``, and the next message let through for that claim
says how many were. At most ``max_claims`` claims are remembered, the least recently heard of
forgotten first. Pure bookkeeping on the event loop: no I/O, no lock.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import Counter

DROPPED: Final = Counter(
    "dra_agent_claim_messages_dropped_total",
    "Log lines (kind=log) and Events (kind=event) about one claim held back by the per-claim limit.",
    ["kind"],
)
BURST: Final = 5
INTERVAL_S: Final = 60.0
REPEAT_AFTER_S: Final = 600.0
MAX_CLAIMS: Final = 4096
_TEXTS_PER_CLAIM: Final = 8


@dataclass
class _Claim:
    tokens: float
    refilled: float
    dropped: int = 0
    texts: OrderedDict[str, float] = field(default_factory=OrderedDict)


@dataclass(frozen=True)
class Verdict:
    """Whether to write the message, and how many of the claim's were held back since the last one."""

    allowed: bool
    dropped_before: int = 0

    def suffix(self) -> str:
        """What to append to the message that is written: the count of those held back, if any."""
        return (
            f" ({self.dropped_before} earlier messages about this claim held back)"
            if self.dropped_before
            else ""
        )


class ClaimMessageLimiter:
    """Rate limit and de-duplication of messages per claim (see the module docstring)."""

    def __init__(
        self,
        *,
        kind: str,
        burst: int = BURST,
        interval: float = INTERVAL_S,
        repeat_after: float = REPEAT_AFTER_S,
        max_claims: int = MAX_CLAIMS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kind = kind
        self._burst = burst
        self._interval = interval
        self._repeat_after = repeat_after
        self._max_claims = max_claims
        self._clock = clock
        self._claims: OrderedDict[str, _Claim] = OrderedDict()
        self.dropped = 0

    def allow(self, claim: str, text: str) -> Verdict:
        now = self._clock()
        state = self._claims.get(claim)
        if state is None:
            state = _Claim(tokens=float(self._burst), refilled=now)
            self._claims[claim] = state
            while len(self._claims) > self._max_claims:
                self._claims.popitem(last=False)
        self._claims.move_to_end(claim)
        state.tokens = min(float(self._burst), state.tokens + (now - state.refilled) / self._interval)
        state.refilled = now
        seen = state.texts.get(text)
        if (seen is not None and now - seen < self._repeat_after) or state.tokens < 1.0:
            state.dropped += 1
            self.dropped += 1
            DROPPED.labels(self.kind).inc()
            return Verdict(allowed=False)
        state.tokens -= 1.0
        state.texts[text] = now
        state.texts.move_to_end(text)
        while len(state.texts) > _TEXTS_PER_CLAIM:
            state.texts.popitem(last=False)
        verdict = Verdict(allowed=True, dropped_before=state.dropped)
        state.dropped = 0
        return verdict

    def forget(self, claim: str) -> None:
        """The claim is gone (unprepared): its next message, if any, starts afresh."""
        self._claims.pop(claim, None)

    def __len__(self) -> int:
        return len(self._claims)
