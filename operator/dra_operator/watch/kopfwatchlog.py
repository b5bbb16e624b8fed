"""Kopf's watch restarts, logged and counted like the operator's own.

Kopf drops a watch stream that brought nothing, not even a bookmark, for its inactivity timeout
(``settings.watching.inactivity_timeout``, set from ``watch_inactivity_timeout_s``) and resumes it
from the last resourceVersion; on 410 Gone it lists again. It says so only at DEBUG and has no hook
for it. A silently stalled watch is worth a WARNING and a counter
(``dra_operator_watch_restarts_total{resource, reason}``), so a filter on Kopf's watching logger
recognises those two messages, counts them, and raises the inactivity one to WARNING; every other
record keeps the level the operator's logging asked for.

The messages are Kopf's own text (``kopf/_cogs/clients/watching.py``); a unit test pins them, so an
upgrade of Kopf that rewords them fails there rather than going quiet.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from dra_operator.model.metrics import Metrics

KOPF_WATCHING_LOGGER = "kopf._cogs.clients.watching"

# "Watch-stream for resourceslices.v1.resource.k8s.io cluster-wide is inactive, reconnecting."
_INACTIVE = re.compile(r"^Watch-stream for (?P<resource>\S+) (?P<where>.+) is inactive, reconnecting\.")
# "Restarting the watch-stream for resourceslices.v1.resource.k8s.io cluster-wide."
_EXPIRED = re.compile(r"^Restarting the watch-stream for (?P<resource>\S+) (?P<where>.+)\.$")


def _plural(resource: str) -> str:
    """The plural of Kopf's resource text (``plural.version.group``, ``plural.v1`` for the core)."""
    return resource.split(".", 1)[0]


class KopfWatchRestarts(logging.Filter):
    """Counts Kopf's watch restarts and logs the silent ones at WARNING; drops other records below
    ``level`` (the logger itself is lowered to DEBUG so Kopf's DEBUG messages reach this filter)."""

    def __init__(self, *, metrics: Metrics, inactivity_timeout_s: float, level: int) -> None:
        super().__init__()
        self.metrics = metrics
        self.inactivity_timeout_s = inactivity_timeout_s
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if match := _INACTIVE.match(text):
            plural = _plural(match["resource"])
            self.metrics.watch_restarts.labels(plural, "inactive").inc()
            record.msg = (
                "the %s watch (%s) went silent: nothing, not even a bookmark, for %g s; Kopf dropped it "
                "and resumes from the last resourceVersion"
            )
            record.args = (plural, match["where"], self.inactivity_timeout_s)
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
            return record.levelno >= self.level
        if match := _EXPIRED.match(text):
            self.metrics.watch_restarts.labels(_plural(match["resource"]), "expired").inc()
        return record.levelno >= self.level


def install(*, metrics: Metrics, inactivity_timeout_s: float) -> Callable[[], None]:
    """Put the filter on Kopf's watching logger; returns what undoes it."""
    logger = logging.getLogger(KOPF_WATCHING_LOGGER)
    saved_level = logger.level
    # Another operator in this process (tests) has lowered the logger already: keep its level.
    level = next(
        (f.level for f in logger.filters if isinstance(f, KopfWatchRestarts)), logger.getEffectiveLevel()
    )
    keep = KopfWatchRestarts(metrics=metrics, inactivity_timeout_s=inactivity_timeout_s, level=level)
    logger.addFilter(keep)
    logger.setLevel(logging.DEBUG)

    def uninstall() -> None:
        logger.removeFilter(keep)
        logger.setLevel(saved_level)

    return uninstall
