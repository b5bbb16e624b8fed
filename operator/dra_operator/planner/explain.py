"""Why claims cannot be allocated, in plain words, per request, with what to change.

The text is built from two sources: the planner's free-device index (cluster-wide counts per
request: devices matching the class, the request's selectors, free ones, the most on one node) and
the allocator's per-node funnel (:meth:`~dra_operator.allocator.Allocator.funnel`) on the few nodes
that come closest, plus the constraint rejections the allocator counted where it searched.

:class:`Explanation` has a ``full`` form (several lines, for ``simulate``) and a ``short`` one
(one line of at most 1024 characters, for an Event message and a condition).
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Hashable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dra_api.model import ALL, DeviceClass, Node, ResourceClaim
from dra_operator.allocator import Allocator, MatchValues, RequestFunnel, Shortfall, constraint_text
from dra_operator.planner.demand import DemandKey, request_keys
from dra_operator.planner.index import FreeDeviceIndex


class PlannerState(Protocol):
    """What an explanation reads of the planner (``planner.Planner`` has it). A protocol, so that
    this module does not import the planner that calls it: no import circle."""

    @property
    def index(self) -> FreeDeviceIndex: ...

    @property
    def classes(self) -> dict[str, DeviceClass]: ...

    @property
    def allocator(self) -> Allocator: ...


EVENT_MESSAGE_LIMIT = 1024
_BEST_NODES = 3
_SHOWN_VALUES = 6  # attribute values listed per request before "and N more"


@dataclass(frozen=True, slots=True)
class NodeAttempt:
    """One node the allocator searched without success: a node-local failure (invalid pools, a
    timeout) or the devices each constraint turned away, by (claim ref, constraint index)."""

    node: str
    failure: str | None = None
    constraint_rejections: Mapping[tuple[str, int], int] = field(default_factory=dict)
    invalid_pools: tuple[str, ...] = ()
    """The node's invalid pools, "driver/pool (reason)", when they are why it failed."""
    shortfall: Shortfall | None = None
    """What the feasibility check found missing on the node, before (instead of) a search."""


@dataclass(frozen=True, slots=True)
class Explanation:
    full: str
    short: str

    @classmethod
    def simple(cls, text: str) -> Explanation:
        return cls(full=text, short=truncate(text))

    def __str__(self) -> str:
        return self.full


def truncate(text: str, limit: int = EVENT_MESSAGE_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def explain(
    *,
    planner: PlannerState,
    claims: Sequence[ResourceClaim],
    attempts: Sequence[NodeAttempt],
    fixed: Node | None,
    memo: MutableMapping[Hashable, ExplanationBody] | None = None,
) -> Explanation:
    """Explain why ``claims`` found no node (``fixed``: the only node that was allowed).

    ``memo``: explanations of single claims by what they depend on besides the planner's state
    (the requests, constraints, the searched nodes' findings and ``fixed``); the caller empties it
    whenever that state changes. A queue of alike claims that cannot fit (a tenant's flood, or a
    full cluster's backlog tried again after each release) then costs one explanation, not one
    each: an explanation reads every request's funnel on the closest nodes (0.4-0.8 ms of CPU at
    100 and 1,000 nodes; bench/refusals.py).

    Raises :class:`~dra_operator.allocator.AllocationError` when the funnel meets an error."""
    what = ("claim " if len(claims) == 1 else "claims ") + ", ".join(c.ref for c in claims)
    if fixed is not None:
        header = f"{what} cannot be allocated on node {fixed.name}"
    else:
        nodes = len(planner.index.nodes)
        tried = len(attempts)
        others = "" if tried >= nodes else "; the others have too few free matching devices"
        header = (
            f"{what} cannot be allocated on any of {nodes} node{'s' if nodes != 1 else ''} "
            f"({tried} searched{others})"
        )
    key = _memo_key(claims=claims, attempts=attempts, fixed=fixed) if memo is not None else None
    body = memo.get(key) if memo is not None and key is not None else None
    if body is None:
        body = _body(planner=planner, claims=claims, attempts=attempts, fixed=fixed)
        if memo is not None and key is not None:
            if len(memo) >= MEMO_SIZE:
                memo.clear()  # many different specs at one state: start over, bounded
            memo[key] = body
    return Explanation(
        full="\n".join([header + ".", *body.lines]), short=truncate(". ".join([header, *body.short]))
    )


MEMO_SIZE = 256
"""Explanations a planner keeps for one state of the cluster (see :func:`explain`)."""


@dataclass(frozen=True, slots=True)
class ExplanationBody:
    """An explanation without its first line (which names the claims): the lines of the full form
    and the parts of the short one."""

    lines: tuple[str, ...]
    short: tuple[str, ...]


def _memo_key(
    *, claims: Sequence[ResourceClaim], attempts: Sequence[NodeAttempt], fixed: Node | None
) -> Hashable | None:
    """What a single claim's explanation depends on besides the planner's state; None for several
    claims (their names are in the text) or anything unhashable."""
    if len(claims) != 1:
        return None
    spec = claims[0].spec
    key = (
        spec.requests,
        spec.constraints,
        fixed.name if fixed is not None else None,
        tuple(
            (a.node, a.failure, a.invalid_pools, tuple(sorted(a.constraint_rejections.items())), a.shortfall)
            for a in attempts
        ),
    )
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _body(
    *,
    planner: PlannerState,
    claims: Sequence[ResourceClaim],
    attempts: Sequence[NodeAttempt],
    fixed: Node | None,
) -> ExplanationBody:
    """Everything of the explanation but its first line (:func:`explain`)."""
    best = [fixed] if fixed is not None else _best_nodes(planner=planner, claims=claims)
    constraint_names = {
        (c.ref, i): constraint_text(k.match_attribute, k.distinct_attribute, k.requests)
        for c in claims
        for i, k in enumerate(c.spec.constraints)
    }
    cluster = _cluster_lines(planner=planner, claims=claims)
    closest = _closest(
        planner=planner, claims=claims, best=best, attempts=attempts, fixed=fixed, names=constraint_names
    )
    advice = _together(planner=planner, claims=claims) + _advice(
        funnels=closest.funnels,
        attempts=attempts,
        constraint_names=constraint_names,
        fixed=fixed,
        claims=claims,
        shortfalls=[*closest.shortfalls, *(a.shortfall for a in attempts if a.shortfall is not None)],
    )
    if not best:
        advice = [
            "no node has free devices matching the requests: add nodes or devices, or wait for "
            "claims to release theirs"
        ]
    lines = [*cluster]
    if closest.lines:
        lines.append("closest nodes:" if fixed is None else "on this node:")
        lines.extend(f"  {line}" for line in closest.lines)
    refusal = closest.refusal
    refused = [a for a in attempts if a.shortfall is not None]
    if refused and refusal is None:
        refusal = f"on {refused[0].node}: {refused[0].shortfall}"
        if fixed is None:
            lines.append(
                f"refused before any search on {len(refused)} of {len(attempts)} searched node(s); {refusal}"
            )
    failures = [a for a in attempts if a.failure and a.node not in {n.name for n in best}]
    if failures:
        lines.append(f"{len(failures)} other node(s) failed: {failures[0].node}: {failures[0].failure}")
    if advice:
        lines.append("to change: " + "; ".join(dict.fromkeys(advice)))
    short_parts: list[str] = []
    if refusal is not None:
        short_parts.append(f"refused before any search ({len(refused)} of {len(attempts)} nodes); {refusal}")
    if advice:
        short_parts.append("to change: " + "; ".join(dict.fromkeys(advice)))
    if closest.lines:
        short_parts.append(closest.short_first_node or closest.lines[0])
    short_parts.extend(cluster)
    return ExplanationBody(lines=tuple(lines), short=tuple(short_parts))


def _cluster_lines(*, planner: PlannerState, claims: Sequence[ResourceClaim]) -> list[str]:
    """Cluster-wide counts per request, from the index."""
    index = planner.index
    cluster: list[str] = []
    for ref, request, key, count, mode in request_keys(claims=claims, classes=planner.classes):
        class_counts = index.counts(DemandKey(key.class_name, key.class_selectors, ()), complete=True)
        counts = index.counts(key, complete=True)
        wanted = "all" if mode == ALL else str(count)
        most = max(counts.free, default=0)
        where = f" ({_prefix(ref, claims)}request {request})" if len(claims) > 1 else f" request {request}"
        cluster.append(
            f"cluster:{where} wants {wanted} of class {key.class_name}: {class_counts.cluster_total} match "
            f"the class, {counts.cluster_total} match the selectors, {counts.cluster_free} free"
            + (f" ({counts.shared_free} reachable from every node)" if counts.shared_total else "")
            + f"; most free on one node: {most}"
        )
    return cluster


@dataclass(slots=True)
class _Closest:
    """What the closest nodes show, a line each, and the funnels behind the lines."""

    lines: list[str] = field(default_factory=list)
    # The first shortfall the feasibility check found, as a node line gives it ("node: text"):
    # the one-line form leads with it (``short_first_node``: that node's line without it), the
    # counts per request after.
    refusal: str | None = None
    short_first_node: str | None = None
    shortfalls: list[Shortfall] = field(default_factory=list)
    funnels: list[tuple[str, list[RequestFunnel], NodeAttempt | None]] = field(default_factory=list)


def _closest(
    *,
    planner: PlannerState,
    claims: Sequence[ResourceClaim],
    best: Sequence[Node],
    attempts: Sequence[NodeAttempt],
    fixed: Node | None,
    names: Mapping[tuple[str, int], str],
) -> _Closest:
    """Per node in ``best``: each request's funnel, the node's failure, what the feasibility check
    finds there and the devices each constraint turned away (``names``: the constraints' names)."""
    by_node = {a.node: a for a in attempts}
    named = {name: key for key, name in names.items()}
    out = _Closest()
    for node in best:
        rows = planner.allocator.funnel(node=node, claims=list(claims))
        parts = [_funnel_text(row, prefix=_prefix(row.claim, claims)) for row in rows]
        attempt = by_node.get(node.name)
        if attempt is not None and attempt.failure:
            parts.append(attempt.failure)
        # What the feasibility check finds there: from the search, or worked out now (a search that
        # gave up within its easy start never ran it).
        found_short = attempt.shortfall if attempt is not None else None
        if found_short is None and (attempt is not None or fixed is not None):
            found_short = planner.allocator.shortfall(node=node, claims=list(claims))
        if found_short is not None:
            out.shortfalls.append(found_short)
            text = str(found_short)
            ck = named.get(found_short.constraint or "")
            values = _match_values_text(rows=rows, key=ck, claims=claims) if ck is not None else None
            found = f"{text}: {values}" if values else text
            parts.append(found)
            if out.refusal is None:
                out.refusal = f"on {node.name}: {found}"
                out.short_first_node = f"{node.name}: " + "; ".join(parts[:-1])
        if attempt is not None:
            for ck, rejected in sorted(attempt.constraint_rejections.items()):
                name = names.get(ck, f"constraint #{ck[1]}")
                text = f"{name} turned away {rejected} device{'s' if rejected != 1 else ''}"
                values = _match_values_text(rows=rows, key=ck, claims=claims)
                parts.append(f"{text} and failed: {values}" if values else text)
        out.lines.append(f"{node.name}: " + "; ".join(parts))
        out.funnels.append((node.name, rows, attempt))
    return out


def _prefix(ref: str, claims: Sequence[ResourceClaim]) -> str:
    return f"claim {ref} " if len(claims) > 1 else ""


def _match_values_text(
    *, rows: Sequence[RequestFunnel], key: tuple[str, int], claims: Sequence[ResourceClaim]
) -> str | None:
    """For a matchAttribute constraint: the attribute's values among each covered request's usable
    devices on the node, and whether any one value has enough of them for every request, e.g.
    "usable resource.kubernetes.io/pcieRoot values: request gpu: pci0000:3a (1); request nic:
    pci0000:15 (1); no one value has enough for every request (gpu needs 1, nic needs 1)"."""
    ref, index = key
    covered: list[tuple[RequestFunnel, MatchValues]] = [
        (row, mv) for row in rows if row.claim == ref for mv in row.match_values if mv.constraint == index
    ]
    if not covered:
        return None
    pieces = []
    for row, mv in covered:
        shown = ", ".join(f"{value} ({n})" for value, n in mv.values[:_SHOWN_VALUES]) or "none"
        if len(mv.values) > _SHOWN_VALUES:
            shown += f" and {len(mv.values) - _SHOWN_VALUES} more"
        if mv.missing:
            shown += f", {mv.missing} without the attribute"
        pieces.append(f"{_prefix(row.claim, claims)}request {row.request}: {shown}")

    def need(row: RequestFunnel) -> int:
        return 1 if row.mode == ALL else row.wanted

    def enough(value: str) -> bool:
        return all(dict(mv.values).get(value, 0) >= need(row) for row, mv in covered)

    fitting = [value for value, _ in covered[0][1].values if enough(value)]
    if fitting:
        verdict = (
            f"{', '.join(fitting[:_SHOWN_VALUES])} would have enough for every request, but not together "
            "with the claim's other requests and constraints"
        )
    else:
        needs = ", ".join(
            f"{row.request} needs {'all' if row.mode == ALL else need(row)}" for row, _ in covered
        )
        verdict = f"no one value has enough for every request ({needs})"
    return f"usable {covered[0][1].attribute} values: " + "; ".join(pieces) + f"; {verdict}"


_STAGES = (
    ("class_matched", "match class {cls}"),
    ("selectors_kept", "match the selectors"),
    ("free", "free"),
    ("untainted", "untainted"),
    ("within_counters", "within counters"),
    ("within_capacity", "with enough capacity"),
)


def _short_at(row: RequestFunnel) -> str | None:
    """The first stage at which the request has fewer devices than it needs, if any."""
    need = 1 if row.mode == ALL else row.wanted
    for name, _ in _STAGES:
        if getattr(row, name) < need:
            return name
    return None


def _funnel_text(row: RequestFunnel, *, prefix: str) -> str:
    """E.g. "request gpu: 8 match class gpu.nvidia.com, 8 match the selectors, 2 free; needs 4"."""
    stop = _short_at(row)
    parts = [f"{row.devices} devices"]
    for name, label in _STAGES:
        parts.append(f"{getattr(row, name)} {label.format(cls=row.device_class)}")
        if name == stop:
            break
    needs = "all of them" if row.mode == ALL else str(row.wanted)
    text = f"{prefix}request {row.request}: {', '.join(parts)}; needs {needs}"
    if row.binding_excluded:
        text += f" ({row.binding_excluded} with binding conditions left out)"
    if row.node_operations_excluded:
        text += (
            f" ({row.node_operations_excluded} skipping node operations left out: needs "
            "DRAOptionalNodeOperations on, and declared by the node)"
        )
    if row.counters_excluded:
        text += f" ({row.counters_excluded} consuming counters left out: DRAPartitionableDevices is off)"
    if row.unavailable_pools:
        text += f" (unusable pools: {', '.join(row.unavailable_pools)})"
    if stop == "within_counters" and row.short_counters:
        text += f" (counters used up: {_counter_list(row)})"
    return text


def _counter_list(row: RequestFunnel) -> str:
    """E.g. "node-1 gpu-0-counter-set/memory-slice-2 for 3 devices, ..." (the most common first)."""
    shown = [
        f"{name} for {n} device{'s' if n != 1 else ''}" for name, n in row.short_counters[:_SHOWN_VALUES]
    ]
    more = len(row.short_counters) - _SHOWN_VALUES
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _progress(row: RequestFunnel) -> tuple[int, ...]:
    stop = _short_at(row)
    reached = len(_STAGES) if stop is None else [name for name, _ in _STAGES].index(stop)
    return (reached, *(getattr(row, name) for name, _ in reversed(_STAGES)))


def _advice(
    *,
    funnels: Sequence[tuple[str, list[RequestFunnel], NodeAttempt | None]],
    attempts: Sequence[NodeAttempt],
    constraint_names: Mapping[tuple[str, int], str],
    fixed: Node | None,
    claims: Sequence[ResourceClaim],
    shortfalls: Sequence[Shortfall] = (),
) -> list[str]:
    """What to change, judged per request on the node where that request gets furthest."""
    out: list[str] = []
    best: dict[tuple[str, str], tuple[str, RequestFunnel]] = {}
    for node, rows, _ in funnels:
        for row in rows:
            if row.unavailable_pools:
                out.append(f"wait for pools {', '.join(row.unavailable_pools)} to be complete and valid")
            key = (row.claim, row.request)
            if key not in best or _progress(row) > _progress(best[key][1]):
                best[key] = (node, row)
    for node, row in best.values():
        text = _request_advice(node=node, row=row, fixed=fixed, claims=claims)
        if text is not None:
            out.append(text)
    if out:
        return out
    # Every request fits alone somewhere: the requests together, or the constraints, do not.
    where = f"node {fixed.name}" if fixed is not None else "any node"
    if shortfalls:
        return [_shortfall_advice(shortfalls[0], where=where)]
    together = [node for node, rows, _ in funnels if all(_short_at(r) is None for r in rows)]
    if not together and len({node for node, _ in best.values()}) > 1:
        places = ", ".join(
            f"{_prefix(row.claim, claims)}request {row.request} on {node}" for node, row in best.values()
        )
        return [f"no node has room for all requests together ({places} at best): free devices or split them"]
    rejected: dict[tuple[str, int], int] = {}
    for attempt in attempts:
        for ck, n in attempt.constraint_rejections.items():
            rejected[ck] = rejected.get(ck, 0) + n
    if rejected:
        worst = max(rejected.items(), key=lambda item: item[1])[0]
        name = constraint_names.get(worst, f"constraint #{worst[1]}")
        return [f"relax {name}: no set of free devices on {where} satisfies it"]
    failed = next((a.failure for a in attempts if a.failure), None)
    if failed:
        return [f"fix the nodes' resource pools ({failed})"]
    return [f"the requests together need more devices than {where} offers: lower the counts"]


def _request_advice(
    *, node: str, row: RequestFunnel, fixed: Node | None, claims: Sequence[ResourceClaim]
) -> str | None:
    """What to change for one request, by the stage of the funnel on ``node`` where it falls short;
    None when it does not, or when the node's pools are unusable (advised on already)."""
    stage = _short_at(row)
    if stage is None:
        return None
    request = f"{_prefix(row.claim, claims)}request {row.request}"
    where = f"node {node}" if fixed is not None else f"the closest node, {node},"
    if row.devices == 0 and row.unavailable_pools:
        return None  # the node's pools are unusable: said above
    if row.devices == 0:
        return (
            f"node {node} publishes no devices: check that the driver runs there"
            if fixed is not None
            else "no node publishes devices: check that the driver runs"
        )
    if stage == "class_matched" and row.class_matched == row.devices:
        return (
            f"{where} has only {row.devices} devices for {request}: lower its count or add nodes "
            "with more devices"
        )
    if stage == "class_matched":
        return (
            f"too few devices match class {row.device_class} for {request}: use another class or "
            "fix the class selectors"
        )
    if stage == "selectors_kept":
        return f"relax the selectors of {request} or lower its count"
    if stage == "free":
        return f"lower the count of {request} or wait for other claims to release devices"
    if stage == "untainted":
        return f"add a toleration to {request} for the devices' taints, or fix the devices"
    if stage == "within_counters" and row.counters_excluded:
        # No partition can be released to make room: the gate, not the counters, keeps them out.
        n = row.counters_excluded
        return (
            f"{n} device{'s' if n != 1 else ''} for {request} consume counters, which the allocator "
            "skips while feature gate DRAPartitionableDevices is off: ask for devices that consume "
            "no counters, or turn the gate on"
        )
    if stage == "within_counters":
        used_up = f" (counters used up: {_counter_list(row)})" if row.short_counters else ""
        return f"release other partitions of the same devices{used_up}, or lower the count of {request}"
    return f"lower the capacity {request} asks for"


def _together(*, planner: PlannerState, claims: Sequence[ResourceClaim]) -> list[str]:
    """Requests that select the same devices and together want more of them than any node has free
    (each alone may fit): named, so that the claim says which to change."""
    by_key: dict[DemandKey, list[tuple[str, str, int]]] = {}
    for ref, request, key, count, mode in request_keys(claims=claims, classes=planner.classes):
        if mode != ALL and "/" not in request:  # subrequests are alternatives, not together
            by_key.setdefault(key, []).append((ref, request, count))
    out = []
    for key, requests in by_key.items():
        wanted = sum(n for _, _, n in requests)
        if len(requests) < 2:
            continue
        counts = planner.index.counts(key, complete=True)
        most = max(counts.free, default=0) + counts.shared_free
        if wanted > most:
            names = ", ".join(f"{_prefix(ref, claims)}{request}" for ref, request, _ in requests)
            out.append(
                f"requests {names} select the same devices and together want {wanted} of them, where the "
                f"most free on one node is {most}: lower their counts, or select different devices for each"
            )
    return out


def _shortfall_advice(s: Shortfall, *, where: str) -> str:
    who = ", ".join(s.requests)
    if s.constraint is not None:
        return f"relax {s.constraint}: no set of free devices on {where} satisfies it for {who}"
    if len(s.requests) == 1:
        return f"lower the count of {who}: {where} has fewer devices that can serve it"
    return (
        f"the requests together need more devices than {where} offers ({who} can use only the same "
        f"{s.offered} devices, for {s.wanted}): lower their counts, or select different devices for each"
    )


def explain_unfinished(
    *,
    claims: Sequence[ResourceClaim],
    attempts: Sequence[NodeAttempt],
    nodes: int,
    spent_s: float,
    cut: str | None,
) -> Explanation:
    """Why claims are not placed when the budget ran out first: what the nodes searched showed."""
    what = ("claim " if len(claims) == 1 else "claims ") + ", ".join(c.ref for c in claims)
    header = (
        f"{what}: the search used its budget ({spent_s:.1f} s) after {len(attempts)} of {nodes} "
        f"node{'s' if nodes != 1 else ''} without finding room"
    )
    lines = [header + "."]
    if cut is not None:
        lines.append(f"the search was cut short on node {cut}")
    refused = [a for a in attempts if a.shortfall is not None]
    if refused:
        first = refused[0]
        lines.append(
            f"refused before any search on {len(refused)} node(s); on {first.node}: {first.shortfall}"
        )
    rejected = sum(n for a in attempts for n in a.constraint_rejections.values())
    if rejected:
        lines.append(f"the claims' constraints turned away {rejected} devices on the nodes searched")
    lines.append(
        "to change: fewer requests, fewer devices per request, or simpler constraints and selectors "
        "make the search cheaper"
    )
    full = "\n".join(lines)
    return Explanation(full=full, short=truncate(". ".join(lines)))


def _best_nodes(*, planner: PlannerState, claims: Sequence[ResourceClaim]) -> list[Node]:
    """The nodes with the most free devices matching the requests (then the most matching)."""
    index = planner.index
    keys = [key for _, _, key, _, _ in request_keys(claims=claims, classes=planner.classes)]
    if not keys or not index.nodes:
        return index.nodes[:1]
    counts = [index.counts(k, complete=True) for k in dict.fromkeys(keys)]
    if len(counts) == 1:
        free, total = counts[0].free, counts[0].total
    else:
        free = list(map(sum, zip(*(c.free for c in counts), strict=True)))
        total = list(map(sum, zip(*(c.total for c in counts), strict=True)))
    # Every refused claim is explained, on every node: tuples compared in C, no Python call per node
    # (a sort with a key function took 10 ms of the loop per claim at 5,000 nodes).
    ranked = zip(map(operator.neg, free), map(operator.neg, total), range(len(index.nodes)), strict=True)
    return [index.nodes[r] for _, _, r in heapq.nsmallest(_BEST_NODES, ranked)]


__all__ = [
    "EVENT_MESSAGE_LIMIT",
    "Explanation",
    "ExplanationBody",
    "NodeAttempt",
    "explain",
    "explain_unfinished",
    "truncate",
]
