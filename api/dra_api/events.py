"""The one way both programs write a core/v1 Event: what ``kubectl describe`` shows under Events.

An Event explains; it is never state. Its message is cut to the 1024 characters the API server
keeps, and the reporter's names to their limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from dra_api import times

__all__ = ["MAX_MESSAGE", "event_body"]

MAX_MESSAGE: Final = 1024


def event_body(
    *,
    involved: Mapping[str, Any],
    type_: str,
    reason: str,
    message: str,
    component: str,
    instance: str,
    host: str | None = None,
    namespace: str | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about ``involved`` (apiVersion, kind, name, namespace, uid; empty ones left
    out), reported by ``component`` from ``instance`` (and ``host``, a node's name, if any), in
    ``namespace`` (default: the involved object's, else ``default``)."""
    where = namespace or str(involved.get("namespace") or "default")
    now = times.rfc3339()
    source: dict[str, str] = {"component": component}
    if host:
        source["host"] = host
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved.get('name') or 'object'}.", "namespace": where},
        "involvedObject": {k: v for k, v in involved.items() if v},
        "type": type_,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "source": source,
        "reportingComponent": component,
        "reportingInstance": instance[:128],
    }
