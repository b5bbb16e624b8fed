"""A polynomial check that claims can fit on a node, run before the exponential search.

The search (``allocator.py``) backtracks over every combination of devices when no combination
works: two requests that select the same 24 devices through different selectors, asking for 12 and
13, take it through millions of steps before it gives up, on every node. This check answers such
claims at once. It relaxes the problem to bipartite matchings, each solvable in polynomial time:

- **Devices**: every request unit gets its own device among those the request can use on the node
  (free, selected, untainted, within counters and capacity, each device on its own). A device that
  allows several allocations serves each request once and is left out of the matching.
- **matchAttribute**: some value of the attribute has devices enough for all the covered requests
  at once (the matching above, restricted to devices with that value), and within it values
  enough for each distinctAttribute.
- **distinctAttribute**: the covered requests' units each get a value of their own.

Each is a necessary condition: a claim that fails one cannot fit, so the search is skipped and the
answer names the requests that together want more than the node has (Hall's condition: the set of
requests whose devices are all taken by each other). A claim that passes them all may still not fit
(counters shared across devices, constraints together): the search decides, within its budget.
Upstream's allocator has no such check.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["DistinctValues", "Need", "SameValue", "Shortfall", "shortfall"]


@dataclass(frozen=True, slots=True)
class Need:
    """One request: how many devices it wants and which of the node's devices (by index) can serve it."""

    label: str
    count: int
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SameValue:
    """A matchAttribute constraint: ``needs`` (indices) must all use devices sharing one value;
    ``values`` gives each device's values (absent: the device cannot serve a covered request)."""

    label: str
    needs: tuple[int, ...]
    values: Mapping[int, frozenset[Hashable]]


@dataclass(frozen=True, slots=True)
class DistinctValues:
    """A distinctAttribute constraint: the devices of ``needs`` have pairwise different values."""

    label: str
    needs: tuple[int, ...]
    values: Mapping[int, frozenset[Hashable]]


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Requests that together want more than the node offers them."""

    requests: tuple[str, ...]
    wanted: int
    offered: int
    """Devices (or, under distinctAttribute, values) that can serve them; under matchAttribute the
    most that share one value, which may reach ``wanted`` when the values are split unevenly."""
    constraint: str | None = None
    distinct: bool = False

    def __str__(self) -> str:
        who = _join(self.requests)
        verb = "wants" if len(self.requests) == 1 else "together want"
        them = "it" if len(self.requests) == 1 else "them"
        if self.constraint is None:
            return f"{who} {verb} {self.wanted} devices; {self.offered} devices of the node can serve {them}"
        if self.distinct:
            return (
                f"{who} {verb} {self.wanted} devices with different values under {self.constraint}; "
                f"the devices that can serve {them} have {self.offered} values"
            )
        most = f" (the most sharing one value: {self.offered})" if self.offered < self.wanted else ""
        return (
            f"{who} {verb} {self.wanted} devices sharing one value under {self.constraint}; "
            f"no value has that many that can serve {them} together{most}"
        )


def _join(labels: Sequence[str]) -> str:
    if len(labels) == 1:
        return labels[0]
    return ", ".join(labels[:-1]) + " and " + labels[-1]


def shortfall(
    *,
    needs: Sequence[Need],
    same: Sequence[SameValue] = (),
    distinct: Sequence[DistinctValues] = (),
    check: Callable[[], None] | None = None,
) -> Shortfall | None:
    """The first necessary condition the needs fail, or None when they pass them all. ``check`` is
    called between matchings (a budget's check; it may raise)."""
    found = _devices_shortfall(needs, None)
    if found is not None:
        return found
    for constraint in same:
        if check is not None:
            check()
        found = _same_value_shortfall(needs, constraint, distinct, check)
        if found is not None:
            return found
    for apart in distinct:
        if check is not None:
            check()
        found = _distinct_shortfall(needs, apart)
        if found is not None:
            return found
    return None


def _devices_shortfall(needs: Sequence[Need], label: str | None) -> Shortfall | None:
    adjacency = [list(n.devices) for n in needs]
    short = _match([n.count for n in needs], adjacency)
    if short is None:
        return None
    members, offered = short
    return Shortfall(
        requests=tuple(needs[i].label for i in members),
        wanted=sum(needs[i].count for i in members),
        offered=offered,
        constraint=label,
    )


def _same_value_shortfall(
    needs: Sequence[Need],
    constraint: SameValue,
    distinct: Sequence[DistinctValues],
    check: Callable[[], None] | None,
) -> Shortfall | None:
    covered = [i for i in constraint.needs if needs[i].count > 0]
    if sum(needs[i].count for i in covered) <= 1:
        return None  # one device fixes the value: nothing to match it with
    values = constraint.values
    # Candidate values: those with devices enough for each covered request on its own.
    per_request: list[dict[Hashable, int]] = []
    for i in covered:
        counts: dict[Hashable, int] = {}
        for d in needs[i].devices:
            for v in values.get(d, ()):
                counts[v] = counts.get(v, 0) + 1
        per_request.append(counts)
    candidates = [
        v
        for v in per_request[0]
        if all(counts.get(v, 0) >= needs[i].count for i, counts in zip(covered, per_request, strict=True))
    ]
    covered_set = set(covered)
    for v in sorted(candidates, key=repr):  # deterministic order
        if check is not None:
            check()
        restricted = [
            Need(label=n.label, count=n.count, devices=tuple(d for d in n.devices if v in values.get(d, ())))
            if i in covered_set
            else n
            for i, n in enumerate(needs)
        ]
        # The value must leave devices enough, and values enough for every distinctAttribute too
        # (a NUMA constraint inside one PCIe root, say).
        if _devices_shortfall(restricted, constraint.label) is None and all(
            _distinct_shortfall(restricted, apart) is None for apart in distinct
        ):
            return None
    # The most devices of the covered requests that share one value.
    sharing: dict[Hashable, set[int]] = {}
    for i in covered:
        for d in needs[i].devices:
            for v in values.get(d, ()):
                sharing.setdefault(v, set()).add(d)
    return Shortfall(
        requests=tuple(needs[i].label for i in covered),
        wanted=sum(needs[i].count for i in covered),
        offered=max((len(ds) for ds in sharing.values()), default=0),
        constraint=constraint.label,
    )


def _distinct_shortfall(needs: Sequence[Need], constraint: DistinctValues) -> Shortfall | None:
    covered = [i for i in constraint.needs if needs[i].count > 0]
    values = constraint.values
    index: dict[Hashable, int] = {}
    adjacency: list[list[int]] = []
    for i in covered:
        reachable: set[int] = set()
        for d in needs[i].devices:
            device_values = values.get(d)
            if device_values is None:
                continue
            if not device_values:
                return None  # an empty list clashes with nothing: no bound to draw
            for v in device_values:
                reachable.add(index.setdefault(v, len(index)))
        adjacency.append(sorted(reachable))
    short = _match([needs[i].count for i in covered], adjacency)
    if short is None:
        return None
    members, offered = short
    return Shortfall(
        requests=tuple(needs[covered[m]].label for m in members),
        wanted=sum(needs[covered[m]].count for m in members),
        offered=offered,
        constraint=constraint.label,
        distinct=True,
    )


def _match(counts: Sequence[int], adjacency: Sequence[Sequence[int]]) -> tuple[list[int], int] | None:
    """Give each of ``counts[i]`` units of left node ``i`` its own right node among
    ``adjacency[i]`` (Kuhn's augmenting paths; units of one left node are interchangeable). None
    when every unit is served; else a Hall violator: left nodes that together want more than the
    right nodes they can reach, and how many those are."""
    owner: dict[int, int] = {}

    def augment(left: int, seen: set[int]) -> bool:
        for right in adjacency[left]:
            if right in seen:
                continue
            seen.add(right)
            holder = owner.get(right)
            if holder is None or augment(holder, seen):
                owner[right] = left
                return True
        return False

    for left, count in enumerate(counts):
        for _ in range(count):
            if not augment(left, set()):
                return _violator(left, adjacency, owner)
    return None


def _violator(
    start: int, adjacency: Sequence[Sequence[int]], owner: Mapping[int, int]
) -> tuple[list[int], int]:
    """Left nodes reachable from an unserved one by alternating paths, and the right nodes they
    reach (all held by them): the smallest explanation of the shortfall the matching found."""
    lefts = {start}
    rights: set[int] = set()
    frontier = [start]
    while frontier:
        left = frontier.pop()
        for right in adjacency[left]:
            if right in rights:
                continue
            rights.add(right)
            holder = owner.get(right)
            if holder is not None and holder not in lefts:
                lefts.add(holder)
                frontier.append(holder)
    return sorted(lefts), len(rights)
