"""The ``Ready`` condition of a prepared device, from what the health monitor knows of it.

A prepared device is Ready while nothing is known against it: ``True`` with reason ``Healthy``, or
``HealthUnknown`` / ``Prepared`` where its health cannot be told or is not watched. An unhealthy
device is ``False`` with the reason of its first problem (``GPULost``, ``XID``, or the probe's own
word such as ``RowRemapPending``) and the monitor's message, which names every problem.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dra_node_agent.health.state import DeviceHealthState, Problem, ProblemKind, State

READY: Final = "Ready"
# metav1.Condition validation: reason is a CamelCase word, the message at most 32768 characters.
MAX_REASON_LENGTH: Final = 1024
MAX_MESSAGE_LENGTH: Final = 32768
# resource.k8s.io: at most 8 conditions per status.devices entry.
MAX_CONDITIONS: Final = 8
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_KIND_REASONS: Final[Mapping[ProblemKind, str]] = {ProblemKind.XID: "XID", ProblemKind.GPU_LOST: "GPULost"}


@dataclass(frozen=True)
class Readiness:
    """What the ``Ready`` condition says: ``True``/``False``, a CamelCase reason and a message."""

    status: str
    reason: str
    message: str


def _problem_reason(problem: Problem) -> str:
    known = _KIND_REASONS.get(problem.kind)
    if known is not None:
        return known
    # Any other fault is named by its value ("row-remap-pending" -> "RowRemapPending").
    words = "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", problem.value))
    return words if _REASON.fullmatch(words) else "Unhealthy"


def readiness(state: DeviceHealthState | None, *, monitored: bool) -> Readiness:
    """The device's readiness now; ``monitored`` False where no health monitor runs for the driver."""
    if not monitored:
        return Readiness("True", "Prepared", "prepared; this driver's device health is not monitored")
    if state is None:
        return Readiness("True", "HealthUnknown", "prepared; the health monitor does not watch this device")
    if state.state is State.UNHEALTHY:
        problems = state.active()
        reason = _problem_reason(problems[0]) if problems else "Unhealthy"
        return Readiness("False", reason, state.message() or "unhealthy")
    if state.state is State.UNKNOWN:
        return Readiness("True", "HealthUnknown", f"prepared; health unknown: {state.unknown_reason}")
    return Readiness("True", "Healthy", "prepared and healthy")


def ready_condition(
    readiness: Readiness, *, previous: Sequence[Mapping[str, Any]], now: str
) -> list[dict[str, Any]]:
    """``previous`` conditions with ``Ready`` set to ``readiness`` and first: its lastTransitionTime
    kept while the status stays, other types kept as they are (at most ``MAX_CONDITIONS`` in all)."""
    ready: dict[str, Any] = {
        "type": READY,
        "status": readiness.status,
        "reason": readiness.reason[:MAX_REASON_LENGTH],
        "message": readiness.message[:MAX_MESSAGE_LENGTH],
        "lastTransitionTime": now,
    }
    others: list[dict[str, Any]] = []
    for condition in previous:
        if condition.get("type") != READY:
            others.append(dict(condition))
        elif condition.get("status") == readiness.status and condition.get("lastTransitionTime"):
            ready["lastTransitionTime"] = condition["lastTransitionTime"]
    return [ready, *others[: MAX_CONDITIONS - 1]]
