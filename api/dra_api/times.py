"""Times as the API server writes them (RFC 3339, UTC), one way for both programs.

``rfc3339`` formats whole seconds with a ``Z`` (creationTimestamp, lastTransitionTime, an Event's
times); ``parse`` reads that and every other RFC 3339 form the API server or Kopf writes (a zone
offset, fractions of a second), and is memoised: a burst of claims carries a handful of distinct
stamps, and parsing is slow next to a dictionary lookup.
"""

from __future__ import annotations

import datetime
import functools
import time

__all__ = ["parse", "rfc3339"]


def rfc3339(seconds: float | None = None) -> str:
    """``seconds`` since the epoch (now when None) as ``2026-11-27T14:28:41Z``."""
    when = time.time() if seconds is None else seconds
    return datetime.datetime.fromtimestamp(int(when), tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@functools.lru_cache(maxsize=1024)
def parse(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time; a time without a zone is taken as UTC. None
    when the text is not one."""
    if not text:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        try:  # the looser form strptime reads (single-digit months and days)
            parsed = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:
            return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()
