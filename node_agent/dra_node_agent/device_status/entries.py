"""``status.devices`` entries: their key, and a claim's list with this driver's entries set or removed.

The list is a map keyed by (driver, pool, device, shareID). A node's agent owns the entries of the
devices it prepared and nothing else: every other entry, another driver's or another pool's, is
kept exactly as it came, in its place. Pure functions over the claim's JSON.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_node_agent.device_status.conditions import Readiness, ready_condition


@dataclass(frozen=True, order=True)
class EntryKey:
    driver: str
    pool: str
    device: str
    share_id: str | None = None

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> EntryKey:
        """The key of a ``status.devices`` entry or of an allocation result."""
        share = entry.get("shareID")
        return cls(
            driver=str(entry.get("driver", "")),
            pool=str(entry.get("pool", "")),
            device=str(entry.get("device", "")),
            share_id=None if share in (None, "") else str(share),
        )

    def fields(self) -> dict[str, str]:
        out = {"driver": self.driver, "pool": self.pool, "device": self.device}
        if self.share_id is not None:
            out["shareID"] = self.share_id
        return out


@dataclass(frozen=True)
class DesiredEntry:
    """An entry as this driver wants it. ``data_known`` False: the data was rebuilt without what
    prepare knew (after a restart); data already on the server is then kept."""

    key: EntryKey
    readiness: Readiness
    data: Mapping[str, Any]
    data_known: bool = True


def allocated_keys(claim: Mapping[str, Any]) -> frozenset[EntryKey]:
    """The keys of the claim's allocation results: the only entries the API server accepts."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return frozenset(EntryKey.of(r) for r in results)


def current_entries(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(e) for e in (claim.get("status") or {}).get("devices") or []]


def _entry(desired: DesiredEntry, previous: Mapping[str, Any] | None, *, now: str) -> dict[str, Any]:
    old_conditions: Sequence[Mapping[str, Any]] = (previous or {}).get("conditions") or []
    out: dict[str, Any] = {
        **desired.key.fields(),
        "conditions": ready_condition(desired.readiness, previous=old_conditions, now=now),
    }
    data: Mapping[str, Any] | None = desired.data
    if not desired.data_known and previous is not None and previous.get("data"):
        data = previous["data"]
    if data:
        out["data"] = dict(data)
    return out


def merged_entries(
    current: Sequence[Mapping[str, Any]],
    *,
    desired: Sequence[DesiredEntry] = (),
    remove: Collection[EntryKey] = (),
    now: str,
) -> list[dict[str, Any]]:
    """``current`` with ``desired`` entries set (replaced in place, or appended) and those keyed in
    ``remove`` dropped; every other entry as it was."""
    wanted = {d.key: d for d in desired}
    out: list[dict[str, Any]] = []
    seen: set[EntryKey] = set()
    for entry in current:
        key = EntryKey.of(entry)
        if key in remove and key not in wanted:
            continue
        if key in wanted and key not in seen:
            out.append(_entry(wanted[key], entry, now=now))
            seen.add(key)
            continue
        out.append(dict(entry))
    for key, desire in wanted.items():
        if key not in seen:
            out.append(_entry(desire, None, now=now))
    return out
