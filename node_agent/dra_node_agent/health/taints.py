"""Device taints rendered from health problems, and the slice devices that carry them.

Keys live under the driver's domain (``gpu.nvidia.com/xid``, ``gpu.nvidia.com/gpu-lost``,
``tpu.google.com/unhealthy``); the value names the cause (the XID number, ``row-remap-failure``);
``timeAdded`` is when the problem was first seen. A server without device taints (DRADeviceTaints
off) silently drops the field, so there the unhealthy device leaves the slice instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Final

from dra_api.times import rfc3339
from dra_node_agent.health.state import Problem

MAX_TAINTS_PER_DEVICE: Final = 16  # resource.k8s.io/v1 validation limit (4 before 1.35)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


def label_value(raw: str) -> str:
    """``raw`` squeezed into a label value (at most 63 characters of ``[A-Za-z0-9_.-]``)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw)[:63].strip("-_.")
    if not _LABEL_VALUE.fullmatch(cleaned):  # pragma: no cover - the substitutions above guarantee it
        raise ValueError(f"taint value {raw!r}: cannot be made a label value")
    return cleaned


def render_taints(*, driver: str, problems: Sequence[Problem], effect: TaintEffect) -> list[dict[str, str]]:
    """One taint per problem (the oldest first), at most the API's limit per device."""
    taints: list[dict[str, str]] = []
    for problem in sorted(problems, key=lambda p: (p.first_seen, p.kind.value, p.value)):
        taint = {"key": f"{driver}/{problem.kind.value}", "effect": effect.value}
        if problem.value:
            taint["value"] = label_value(problem.value)
        taint["timeAdded"] = rfc3339(problem.first_seen)
        taints.append(taint)
    return taints[:MAX_TAINTS_PER_DEVICE]


def decorate_devices(
    devices: Sequence[Mapping[str, Any]],
    *,
    taints: Mapping[str, Sequence[Mapping[str, str]]],
    taints_supported: bool,
) -> list[dict[str, Any]]:
    """The slice devices with their taints; without server support, tainted devices are left out."""
    out: list[dict[str, Any]] = []
    for device in devices:
        found = taints.get(str(device.get("name", "")))
        if not found:
            out.append(dict(device))
        elif taints_supported:
            out.append({**device, "taints": [dict(t) for t in found]})
    return out
