"""The structured allocator: one node, a list of claims, first solution wins (incubating variant)."""

from __future__ import annotations

import functools
import logging
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from dra_api.model import (
    ALL,
    EXACT_COUNT,
    FROM_CLAIM,
    FROM_CLASS,
    AllocationResult,
    DeviceAllocationConfiguration,
    DeviceClass,
    DeviceRequestAllocationResult,
    DeviceTaint,
    DeviceToleration,
    ExactDeviceRequest,
    Node,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceClaim,
    ResourceSlice,
)
from dra_api.quantity import Quantity
from dra_operator.allocator import capacity as cap
from dra_operator.allocator.constraints import (
    Constraint,
    DistinctAttribute,
    Lookup,
    MatchAttribute,
    Value,
    attribute_text,
    constraint_text,
    lookup_attribute,
)
from dra_operator.allocator.errors import (
    AllocationError,
    AllocationTimeout,
    FailedAllocationOnNode,
    SelectorFailed,
)
from dra_operator.allocator.feasibility import DistinctValues, Need, SameValue, Shortfall, shortfall
from dra_operator.allocator.gates import FeatureGates
from dra_operator.allocator.pools import DeviceEntry, Pool, PoolID, SliceEntry, SliceIndex
from dra_operator.allocator.state import AllocatedState, DeviceID, device_id_text
from dra_operator.cel import (
    BudgetExhausted,
    CelCompileError,
    CelRuntimeError,
    WorkBudget,
    charged_to,
    compile_derived,
    compile_selector,
)

logger = logging.getLogger(__name__)

# AllocationResultsMaxSize: devices per claim.
MAX_DEVICES_PER_CLAIM = 32
_ZERO = Quantity.from_int(0)
# The node feature (status.declaredFeatures) that devices of slices with skipNodeOperations need.
OPTIONAL_NODE_OPERATIONS = "DRAOptionalNodeOperations"

# DRADeviceCompatibilityGroups: what the devices placed on one counter set so far declare, as
# (all declared no groups, intersection of their groups); no entry = no device placed yet.
GroupState = tuple[bool, frozenset[str]]


def _groups_admit(state: GroupState | None, groups: frozenset[str]) -> bool:
    """A device without groups shares a counter set only with other devices without groups."""
    if state is None:
        return True
    all_empty, common = state
    if not groups:
        return all_empty
    return not all_empty and not common.isdisjoint(groups)


def _groups_join(state: GroupState | None, groups: frozenset[str]) -> GroupState:
    if state is None:
        return (not groups, groups)
    all_empty, common = state
    if all_empty or not groups:
        return state
    return (False, common & groups)


class _MaxSizeExceeded(Exception):
    """Internal: this branch would put more than 32 devices into one claim."""


class _Infeasible(Exception):
    """Internal: the feasibility check, run once the search outgrew its easy start, refused."""


class Spec:
    """One request (``exactly``) or one subrequest, prepared for the search."""

    __slots__ = (
        "admin",
        "all_devices",
        "capacity",
        "claim_index",
        "derived",
        "device_class",
        "full",
        "key",
        "lookup",
        "mode",
        "num_devices",
        "parent",
        "request",
        "tolerations",
    )

    def __init__(
        self,
        *,
        key: int,
        claim_index: int,
        parent: str,
        full: str,
        request: ExactDeviceRequest,
        device_class: DeviceClass,
    ) -> None:
        self.key = key
        self.claim_index = claim_index
        self.parent = parent
        self.full = full  # "req" or "req/sub", as written into results
        self.request = request
        self.device_class = device_class
        self.mode = request.mode
        self.admin = bool(request.admin_access)
        self.tolerations: tuple[DeviceToleration, ...] = request.tolerations
        self.capacity: Mapping[str, Quantity] | None = request.capacity or None
        self.num_devices = 0
        self.all_devices: list[tuple[Pool, SliceEntry, int]] = []
        # DRADerivedAttributes: attribute name -> CEL expression, and how the request's constraints
        # see a device's attributes (the derived ones shadowing the device's own).
        self.derived: Mapping[str, str] = {}
        self.lookup: Lookup = lookup_attribute


@dataclass(slots=True)
class _Request:
    name: str
    single: Spec | None
    subs: tuple[Spec, ...]


@dataclass(slots=True)
class _Claim:
    claim: ResourceClaim
    ref: str
    requests: list[_Request]
    constraints: list[Constraint]


@dataclass(slots=True)
class _Pick:
    spec: Spec
    entry: DeviceEntry
    share_id: str | None
    consumed: dict[str, Quantity] | None


@dataclass(frozen=True, slots=True)
class RequestFunnel:
    """How many of a node's devices survive each check, in order, for one (sub)request.

    Each count is a subset of the previous one: ``devices`` (in complete, valid pools, reachable from
    the node) -> ``class_matched`` -> ``selectors_kept`` (request selectors) -> ``free`` (not
    allocated to another claim) -> ``untainted`` -> ``within_counters`` -> ``within_capacity``.
    ``wanted`` is the count asked for (for All: the devices that qualify).
    """

    claim: str
    request: str
    device_class: str
    mode: str
    wanted: int
    devices: int
    class_matched: int
    selectors_kept: int
    free: int
    untainted: int
    within_counters: int
    within_capacity: int
    binding_excluded: int = 0  # devices with binding conditions while the feature is off
    # Devices of slices with skipNodeOperations that this node cannot take (DRAOptionalNodeOperations
    # off, or the node does not declare the feature).
    node_operations_excluded: int = 0
    # Devices that consume counters while DRAPartitionableDevices is off: they fail at
    # ``within_counters`` whatever the counters hold, because the gate makes the allocator skip them.
    counters_excluded: int = 0
    unavailable_pools: tuple[str, ...] = ()  # "driver/pool (reason)" for incomplete or invalid pools
    match_values: tuple[MatchValues, ...] = ()  # per matchAttribute constraint covering the request
    # The counters that turned devices away at ``within_counters``: ("<pool> <counter set>/<counter>",
    # devices short of it), most first.
    short_counters: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class MatchValues:
    """The values of one matchAttribute constraint's attribute among a request's devices that pass
    every check of the funnel (``within_capacity``): what the constraint has to choose from.

    ``values`` pairs each value (as text) with how many such devices have it, most first;
    ``missing`` counts those without the attribute (the constraint never takes them).
    """

    constraint: int  # index in the claim's constraints
    attribute: str
    values: tuple[tuple[str, int], ...]
    missing: int = 0


def _counters_fit(available: Mapping[tuple[str, str], Quantity], entry: DeviceEntry) -> bool:
    return not _short_counters(available, entry)


def _short_counters(
    available: Mapping[tuple[str, str], Quantity], entry: DeviceEntry
) -> list[tuple[str, str]]:
    """The (counter set, counter) pairs the device needs more of than is left."""
    need: dict[tuple[str, str], Quantity] = {}
    for consumption in entry.device.consumes_counters:
        for name, value in consumption.counters.items():
            key = (consumption.counter_set, name)
            need[key] = need[key] + value if key in need else value
    return [
        key for key, value in available.items() if (value - need[key] if key in need else value).sign() < 0
    ]


def evaluate_selector(
    *, prefix: str, index: int, expression: str | None, entry: DeviceEntry, class_name: str | None = None
) -> bool:
    """Evaluate one selector on a device; errors are fatal, worded as upstream's (those on the
    device are :class:`SelectorFailed`, naming ``class_name`` for a class's selector)."""
    if expression is None:
        raise AllocationError(
            f"{prefix}: selector #{index}: CEL expression empty (unsupported selector type?)"
        )
    try:
        compiled = compile_selector(expression)
    except CelCompileError as exc:
        raise AllocationError(f"{prefix}: selector #{index}: CEL compile error: {exc}") from exc
    where = f"{prefix}: selector #{index} on device {device_id_text(entry.id)}: CEL runtime error"
    if entry.unsupported_attribute is not None:
        detail = f"CEL runtime error: attribute {entry.unsupported_attribute}: unsupported attribute value"
        raise SelectorFailed(
            f"{where}: {detail[len('CEL runtime error: ') :]}",
            class_name=class_name,
            index=index,
            detail=detail,
        )
    try:
        return bool(compiled.matches(entry.cel_input))
    except CelRuntimeError as exc:
        raise SelectorFailed(
            f"{where}: {exc}", class_name=class_name, index=index, detail=f"CEL runtime error: {exc}"
        ) from exc


def class_matches(device_class: DeviceClass, entry: DeviceEntry) -> bool:
    """Whether the device satisfies all of the class's selectors; cached on the entry (a hook for
    placement: count matching devices per node without running the allocator everywhere)."""
    cache = entry.class_matches
    if cache is None:
        cache = entry.class_matches = {}
    found = cache.get(device_class.selectors)
    if found is None:
        found = True
        for i, selector in enumerate(device_class.selectors):
            if not evaluate_selector(
                prefix=f"class {device_class.name}",
                index=i,
                expression=selector.cel,
                entry=entry,
                class_name=device_class.name,
            ):
                found = False
                break
        cache[device_class.selectors] = found
    return found


class Allocator:
    """Allocates claims on one node at a time, like upstream ``Allocator.Allocate``.

    Build it once per allocated state (cheap when ``slices`` is a prebuilt :class:`SliceIndex`) and
    call :meth:`allocate` for as many nodes as needed; class-selector results and available
    counters are cached across calls.
    """

    def __init__(
        self,
        *,
        classes: Mapping[str, DeviceClass] | Iterable[DeviceClass],
        slices: SliceIndex | Iterable[ResourceSlice],
        allocated: AllocatedState | None = None,
        gates: FeatureGates | None = None,
        feasibility: bool = True,
    ) -> None:
        self.gates = gates or FeatureGates()
        # The polynomial check before the search (feasibility.py); off only to measure the search
        # as upstream runs it.
        self.feasibility = feasibility
        self.classes: Mapping[str, DeviceClass] = (
            classes if isinstance(classes, Mapping) else {c.name: c for c in classes}
        )
        self.index = slices if isinstance(slices, SliceIndex) else SliceIndex(slices)
        self.allocated = allocated or AllocatedState()
        self._in_use = self.allocated.in_use_ids()
        self._available_counters: dict[tuple[PoolID, int], dict[tuple[str, str], Quantity]] = {}
        self._group_baselines: dict[tuple[PoolID, int], dict[str, GroupState]] = {}
        #: ``allocateOne`` invocations of the last :meth:`allocate` call (search effort).
        self.last_invocations = 0
        #: (claim ref, constraint index) -> devices that constraint turned away in the last call.
        self.last_constraint_rejections: dict[tuple[str, int], int] = {}
        #: Why the last call's claims cannot fit, found before any search (feasibility.py).
        self.last_shortfall: Shortfall | None = None

    def note_allocated(self, allocation: AllocationResult) -> None:
        """Record an allocation made with this allocator's results (keeps its caches coherent)."""
        self.allocated.add_allocation(allocation)
        for result in allocation.devices:
            if not result.admin_access:
                self._in_use.add(result.device_id)
        self._available_counters.clear()
        self._group_baselines.clear()

    def note_released(self, allocation: AllocationResult) -> None:
        """Forget an allocation (the claim was deallocated)."""
        self.allocated.remove_allocation(allocation)
        self._in_use = self.allocated.in_use_ids()
        self._available_counters.clear()
        self._group_baselines.clear()

    def pools(self, node: Node) -> tuple[Pool, ...]:
        """The node's pools in search order (hook for explanations and placement)."""
        return self.index.pools_for(
            node,
            partitionable=self.gates.partitionable_devices,
            compatibility_groups=self.gates.compatibility_groups,
        )

    def allocate(
        self,
        *,
        node: Node,
        claims: Sequence[ResourceClaim],
        timeout: float | None = None,
        budget: WorkBudget | None = None,
    ) -> list[AllocationResult] | None:
        """One result per claim (in order; no claims: no results), None if the claims do not fit on
        ``node`` together (:attr:`last_shortfall` says why when the feasibility check, not the search,
        found it).

        Raises :class:`AllocationError` for errors (unknown class, CEL errors, disabled features,
        too many devices, ...), :class:`FailedAllocationOnNode` when nothing fits and the node has
        invalid pools, :class:`~dra_operator.cel.BudgetExhausted` when ``budget`` runs out first
        (CEL evaluation included), and :class:`AllocationTimeout` when ``timeout`` seconds pass
        first (upstream's per-node limit, in upstream's words).
        """
        run = _Run(self, node, claims)
        if timeout is not None and budget is None:
            run.budget = WorkBudget(timeout)
        elif budget is not None:
            run.budget = budget
        self.last_shortfall = None
        try:
            with charged_to(run.budget):
                return run.run()
        except BudgetExhausted:
            if budget is None:
                raise AllocationTimeout(
                    f"filter operation aborted: allocation on node {node.name} took longer than the timeout"
                ) from None
            raise
        finally:
            self.last_invocations = run.invocations
            self.last_shortfall = run.shortfall
            self.last_constraint_rejections = {
                (c.ref, k.index): k.rejections for c in run.claims for k in c.constraints if k.rejections
            }

    def funnel(self, *, node: Node, claims: Sequence[ResourceClaim]) -> list[RequestFunnel]:
        """Per request and subrequest, how many devices of ``node`` survive each check (for
        explaining why claims do not fit). Raises the same errors as :meth:`allocate`."""
        run = _Run(self, node, claims)
        if not claims:
            return []
        run.prepare()
        return [
            run.funnel(spec)
            for c in run.claims
            for r in c.requests
            for spec in (r.subs or (r.single,))
            if spec
        ]

    def shortfall(self, *, node: Node, claims: Sequence[ResourceClaim]) -> Shortfall | None:
        """What the feasibility check finds missing for ``claims`` on ``node``, without a search
        (for explanations: the search may have given up before the check ran). None when the check
        is off or finds nothing. Raises the same errors as :meth:`allocate`'s preparation."""
        if not self.feasibility or not claims:
            return None
        run = _Run(self, node, claims)
        run.prepare()
        return run._shortfall()

    # ---- caches shared by runs -----------------------------------------------------------------

    def available_counters(self, pool: Pool) -> dict[tuple[str, str], Quantity]:
        """Counter values minus what allocated devices of the pool consume (may be negative)."""
        key = (pool.id, pool.generation)
        found = self._available_counters.get(key)
        if found is None:
            found = {
                (set_name, name): value
                for set_name, counters in pool.counter_sets.items()
                for name, value in counters.items()
            }
            for s in pool.all_slices():
                for d in s.devices:
                    if d.consumes_counters and (s.driver, s.pool.name, d.name) in self._in_use:
                        for consumption in d.consumes_counters:
                            for name, value in consumption.counters.items():
                                k = (consumption.counter_set, name)
                                if k in found:
                                    found[k] = found[k] - value
            self._available_counters[key] = found
        return found

    def group_baseline(self, pool: Pool) -> dict[str, GroupState]:
        """Per counter set, the compatibility groups of the pool's devices other claims hold
        (read from the slices, as their counters are)."""
        key = (pool.id, pool.generation)
        found = self._group_baselines.get(key)
        if found is None:
            found = {}
            for s in pool.all_slices():
                for d in s.devices:
                    if d.consumes_counters and (s.driver, s.pool.name, d.name) in self._in_use:
                        for consumption in d.consumes_counters:
                            name = consumption.counter_set
                            found[name] = _groups_join(
                                found.get(name), frozenset(consumption.compatibility_groups)
                            )
            self._group_baselines[key] = found
        return found


def _tolerated(taints: tuple[DeviceTaint, ...], tolerations: tuple[DeviceToleration, ...]) -> bool:
    for taint in taints:
        if taint.blocks_scheduling and not any(t.tolerates(taint) for t in tolerations):
            return False
    return True


class _Run:
    """State of one ``allocate`` call."""

    def __init__(self, alloc: Allocator, node: Node, claims: Sequence[ResourceClaim]) -> None:
        self.alloc = alloc
        self.gates = alloc.gates
        self.node = node
        self.input_claims = claims
        self.cc = self.gates.consumable_capacity
        self.invocations = 0
        self.budget: WorkBudget | None = None
        self.shortfall: Shortfall | None = None
        self.check_at = -1  # the search step at which the feasibility check runs (-1: never)
        self.pools: tuple[Pool, ...] = ()
        self.claims: list[_Claim] = []
        self.results: list[list[_Pick]] = []
        self.selected: list[list[Spec | None]] = []
        self.allocating: dict[DeviceID, list[int]] = {}
        self.allocating_capacity: dict[DeviceID, dict[str, Quantity]] = {}
        self.consumed_counters: dict[PoolID, dict[tuple[str, str], Quantity]] = {}
        # DRADeviceCompatibilityGroups: per pool and counter set, the devices placed in this run.
        self.groups: dict[PoolID, dict[str, GroupState]] = {}
        # With the gate on, devices of slices with skipNodeOperations are allocatable only on a node
        # that declares the feature (upstream's experimental variant). With it off, the field is
        # ignored, as kube-scheduler's default (incubating) variant does: the operator allocates as
        # the scheduler beside it would.
        self.node_operations = (
            not self.gates.optional_node_operations or OPTIONAL_NODE_OPERATIONS in node.declared_features
        )
        self.selectable: dict[tuple[DeviceID, int], bool] = {}
        # DRADerivedAttributes: (device, expression) -> the value derived in this run.
        self.derived_values: dict[tuple[DeviceID, str], Value] = {}
        self._serve_errors = False
        self.compiled: dict[tuple[int, int], object] = {}
        self._next_key = 0

    # ---- entry point -----------------------------------------------------------------------------

    def prepare(self) -> None:
        """Validate the claims and compute request data (the part of ``run`` before the search)."""
        self.pools = self.alloc.pools(self.node)
        for ci, claim in enumerate(self.input_claims):
            self.claims.append(self._prepare_claim(ci, claim))
        self.results = [[] for _ in self.claims]
        self.selected = [[None] * len(c.requests) for c in self.claims]

    def run(self) -> list[AllocationResult] | None:
        if not self.input_claims:
            return []  # as upstream: nothing to allocate is a (trivial) success
        self.prepare()
        # One Python frame per device slot and request: make room for claims with many devices.
        depth = sum(MAX_DEVICES_PER_CLAIM + 2 * len(c.requests) + 2 for c in self.claims) + 200
        if depth > sys.getrecursionlimit():
            sys.setrecursionlimit(depth)
        # Claims of several requests, or with constraints, are checked before the search: that is
        # where requests compete for devices. Otherwise the check costs more than an easy search, so
        # it runs once the search has taken more steps than placing every device straight away
        # would (a search that will succeed mostly does).
        needed = sum(
            s.num_devices for c in self.claims for r in c.requests for s in (r.subs or (r.single,)) if s
        )
        competing = sum(len(c.requests) for c in self.claims) > 1 or any(c.constraints for c in self.claims)
        self.check_at = -1 if not self.alloc.feasibility else 1 if competing else 2 * needed + 8
        try:
            done = self._one(0, 0, 0, 0, False, None)
        except (_MaxSizeExceeded, _Infeasible):
            done = False
        if not done:
            invalid = [p for p in self.pools if p.invalid]
            if invalid:
                logger.debug(
                    "invalid pools on node %s: %s", self.node.name, [p.invalid_reason for p in invalid]
                )
                # Upstream's words first (callers match on them), then which pools and why.
                named = tuple(f"{p.text} ({p.invalid_reason})" for p in invalid)
                raise FailedAllocationOnNode(
                    f"invalid resource pools were encountered: {'; '.join(named)}", invalid_pools=named
                )
            return None
        return [self._result(ci, c) for ci, c in enumerate(self.claims)]

    # ---- preparation ---------------------------------------------------------------------------

    def _prepare_claim(self, ci: int, claim: ResourceClaim) -> _Claim:
        ref = claim.ref
        requests: list[_Request] = []
        # Devices the claim needs at least (a prioritized list counts its smallest alternative),
        # checked request by request, so the error names the request that goes over the limit.
        min_devices = 0
        for request in claim.spec.requests:
            if request.first_available:
                if not self.gates.prioritized_list:
                    raise AllocationError(
                        f"claim {ref}, request {request.name}: has subrequests, but the DRAPrioritizedList "
                        "feature is disabled"
                    )
                if not self.cc:
                    for s in request.first_available:
                        if s.spec.capacity is not None:
                            raise AllocationError(
                                f"claim {ref}, subrequest {s.name}: has capacity requests, but the "
                                "DRAConsumableCapacity feature is disabled"
                            )
                subs = tuple(
                    self._prepare_spec(ci, ref, request.name, f"{request.name}/{s.name}", s.spec)
                    for s in request.first_available
                )
                requests.append(_Request(name=request.name, single=None, subs=subs))
                needed = min(s.num_devices for s in subs)
            else:
                exact = request.exactly
                assert exact is not None  # the model guarantees exactly one of the two
                if not self.cc and exact.capacity is not None:
                    raise AllocationError(
                        f"claim {ref}, request {request.name}: has capacity requests, but the "
                        "DRAConsumableCapacity feature is disabled"
                    )
                spec = self._prepare_spec(ci, ref, request.name, request.name, exact)
                requests.append(_Request(name=request.name, single=spec, subs=()))
                needed = spec.num_devices
            if needed > MAX_DEVICES_PER_CLAIM - min_devices:
                raise AllocationError(
                    f"claim {ref}, request {request.name}: adding {needed} devices exceeds the claim limit "
                    f"of {MAX_DEVICES_PER_CLAIM}, with {min_devices} already accounted for"
                )
            min_devices += needed
        constraints: list[Constraint] = []
        lists = self.gates.list_type_attributes
        for i, c in enumerate(claim.spec.constraints):
            if c.match_attribute is not None:
                constraints.append(
                    MatchAttribute(index=i, requests=c.requests, attribute=c.match_attribute, lists=lists)
                )
            elif c.distinct_attribute is not None:
                constraints.append(
                    DistinctAttribute(
                        index=i, requests=c.requests, attribute=c.distinct_attribute, lists=lists
                    )
                )
            else:
                raise AllocationError(
                    f"claim {ref}, constraint #{i}: empty constraint (unsupported constraint type?)"
                )
        return _Claim(claim=claim, ref=ref, requests=requests, constraints=constraints)

    def _prepare_spec(self, ci: int, ref: str, parent: str, full: str, request: ExactDeviceRequest) -> Spec:
        where = f"claim {ref}, request {full}"
        if request.derived_attributes and not self.gates.derived_attributes:
            # Refused rather than ignored (what constraints need), as every upstream variant does.
            raise AllocationError(
                f"{where}: cannot handle request with derived attributes, the feature is disabled"
            )
        for i, selector in enumerate(request.selectors):
            if selector.cel is None:
                raise AllocationError(
                    f"{where}, selector #{i}: CEL expression empty (unsupported selector type?)"
                )
        if request.admin_access is not None and not self.gates.admin_access:
            raise AllocationError(f"{where}: admin access is requested, but the feature is disabled")
        if not request.device_class_name:
            raise AllocationError(f"{where}: missing device class name (unsupported request type?)")
        device_class = self.alloc.classes.get(request.device_class_name)
        if device_class is None:
            raise AllocationError(
                f"{where}: could not retrieve device class {request.device_class_name}: "
                f'deviceclass.resource.k8s.io "{request.device_class_name}" not found'
            )
        self._next_key += 1
        spec = Spec(
            key=self._next_key,
            claim_index=ci,
            parent=parent,
            full=full,
            request=request,
            device_class=device_class,
        )
        if request.derived_attributes and self.gates.derived_attributes:
            spec.derived = {d.name: d.expression for d in request.derived_attributes}
            spec.lookup = self._derived_lookup(spec.derived)
        if spec.mode == EXACT_COUNT:
            spec.num_devices = request.effective_count
        elif spec.mode == ALL:
            for pool in self.pools:
                if pool.incomplete:
                    raise AllocationError(
                        f"{where}: asks for all devices, but resource pool {pool.text} "
                        "is currently being updated"
                    )
                if pool.invalid:
                    raise AllocationError(
                        f"{where}: asks for all devices, but resource pool {pool.text} is currently invalid"
                    )
                for se in pool.slices:
                    for i, entry in enumerate(se.entries):
                        # Static capacity only: a device whose capacity other claims have used up
                        # stays in the set, so "all" fails rather than quietly taking fewer devices.
                        if self._is_selectable(spec, se, i) and (
                            not self.cc or self._capacity_fits(spec, entry, static=True)
                        ):
                            spec.all_devices.append((pool, se, i))
            spec.num_devices = len(spec.all_devices)
        else:
            raise AllocationError(f"{where}: unsupported count mode {spec.mode}")
        return spec

    def _derived_lookup(self, derived: Mapping[str, str]) -> Lookup:
        """A request's view of devices' attributes: its derived ones, evaluated once per device and
        expression in this run (errors are fatal, in upstream's words), else the device's own."""

        def lookup(entry: DeviceEntry, name: str) -> Value:
            expression = derived.get(name)
            if expression is None:
                return lookup_attribute(entry, name)
            key = (entry.id, expression)
            found = self.derived_values.get(key)
            if found is None:
                try:
                    compiled = compile_derived(expression)
                except CelCompileError as exc:
                    raise AllocationError(f"compile derived attribute {name} failed: {exc}") from exc
                try:
                    found = self.derived_values[key] = compiled.value(entry.cel_input)
                except CelRuntimeError as exc:
                    device = device_id_text(entry.id)
                    raise AllocationError(
                        f"evaluate derived attribute {name} on device {device} failed: {exc}"
                    ) from exc
            return found

        return lookup

    # ---- device checks -------------------------------------------------------------------------

    def _evaluate(self, *, prefix: str, index: int, expression: str | None, entry: DeviceEntry) -> bool:
        return evaluate_selector(prefix=prefix, index=index, expression=expression, entry=entry)

    def _class_matches(self, spec: Spec, entry: DeviceEntry) -> bool:
        return class_matches(spec.device_class, entry)

    def _is_selectable(self, spec: Spec, se: SliceEntry, index: int) -> bool:
        entry = se.entries[index]
        if entry.device.binding_conditions and not self.gates.device_binding_and_status:
            return False
        key = (entry.id, spec.key)
        found = self.selectable.get(key)
        if found is not None:
            return found
        found = self._class_matches(spec, entry)
        selectors = spec.request.selectors
        if found and selectors:
            # Cached on the device beside its classes' results (a pure function of the device and
            # the selectors): a claim placed on node after node, or again later, evaluates once.
            cache = entry.class_matches
            cached = cache.get(selectors) if cache is not None else None
            if cached is None:
                prefix = f"claim {self.input_claims[spec.claim_index].ref}"
                cached = all(
                    self._evaluate(prefix=prefix, index=i, expression=selector.cel, entry=entry)
                    for i, selector in enumerate(selectors)
                )
                if cache is not None:
                    cache[selectors] = cached
            found = cached
        if found and se.node_ok is not None:
            found = se.node_ok[index]
        self.selectable[key] = found
        return found

    def _capacity_fits(
        self, spec: Spec, entry: DeviceEntry, *, static: bool = False, in_flight: bool = True
    ) -> bool:
        """Whether the request fits the device's capacity: what is left of it (by other claims and,
        with ``in_flight``, by this search's own picks so far), or (``static``) all of it. A request
        the device's policy cannot represent, or a negative amount, is an error."""
        device = entry.device
        if not spec.capacity and (not device.capacity or not device.allow_multiple_allocations):
            # A dedicated device without capacity requests consumes all of its capacity: always fits.
            return True
        try:
            return cap.fits(
                device=device,
                driver=entry.id[0],
                requests=spec.capacity,
                consumed=None if static else self.alloc.allocated.capacity.get(entry.id),
                allocating=None if static or not in_flight else self.allocating_capacity.get(entry.id),
                fractional=self.gates.fractional_capacity_range,
            )
        except cap.CapacityError as exc:
            # Upstream names the device by its name in the "all" pre-scan, by its ID elsewhere.
            device_text = device.name if static else device_id_text(entry.id)
            raise AllocationError(
                f"claim {self.input_claims[spec.claim_index].ref}, request {spec.full}: "
                f"checking capacity for device {device_text}: {exc}"
            ) from exc

    def _consume_counters(self, pool: Pool, entry: DeviceEntry) -> bool:
        available = self.alloc.available_counters(pool)
        consumed = self.consumed_counters.setdefault(pool.id, {})
        self._add_counters(consumed, entry, sign=1)
        for key, value in available.items():
            used = consumed.get(key)
            if (value if used is None else value - used).sign() < 0:
                self._add_counters(consumed, entry, sign=-1)
                return False
        return True

    @staticmethod
    def _add_counters(consumed: dict[tuple[str, str], Quantity], entry: DeviceEntry, *, sign: int) -> None:
        for consumption in entry.device.consumes_counters:
            for name, value in consumption.counters.items():
                key = (consumption.counter_set, name)
                before = consumed.get(key, _ZERO)
                consumed[key] = before + value if sign > 0 else before - value

    def _take_groups(self, pool: Pool, entry: DeviceEntry) -> Callable[[], None] | None:
        """DRADeviceCompatibilityGroups: place the device on each counter set it consumes if its
        groups intersect those of every device already there (other claims' and this run's);
        returns how to take it off again, or None (and no change) if it does not fit."""
        running = self.groups.get(pool.id)
        if running is None:
            running = self.groups[pool.id] = {}
        baseline = self.alloc.group_baseline(pool)
        saved: list[tuple[str, GroupState | None]] = []

        def restore() -> None:
            for name, before in reversed(saved):
                if before is None:
                    del running[name]
                else:
                    running[name] = before

        for consumption in entry.device.consumes_counters:
            name = consumption.counter_set
            before = running.get(name)
            state = before if before is not None else baseline.get(name)
            groups = frozenset(consumption.compatibility_groups)
            if not _groups_admit(state, groups):
                restore()
                return None
            saved.append((name, before))
            running[name] = _groups_join(state, groups)
        return restore

    def _release(
        self, pool: Pool, entry: DeviceEntry, *, counted: bool, groups: Callable[[], None] | None
    ) -> None:
        if counted:
            self._add_counters(self.consumed_counters[pool.id], entry, sign=-1)
        if groups is not None:
            groups()

    def _allocate_device(
        self, spec: Spec, pool: Pool, entry: DeviceEntry, *, must: bool
    ) -> Callable[[], None] | None:
        """Check and record one device; returns the undo function, or None if it cannot be used."""
        device = entry.device
        did = entry.id
        ci = spec.claim_index
        multi = self.cc and device.allow_multiple_allocations
        if spec.admin:
            if not multi and ci in self.allocating.get(did, ()):
                return None
        elif did in self.alloc.allocated.devices or (not multi and did in self.allocating):
            return None
        if entry.slice.skip_node_operations and not self.node_operations:
            return None
        if device.consumes_counters and not self.gates.partitionable_devices:
            return None
        if self.gates.device_taints and device.taints and not _tolerated(device.taints, spec.tolerations):
            return None
        counted = False
        groups: Callable[[], None] | None = None
        # Another share of a multi-allocatable device in use: its counters (and compatibility
        # groups) are accounted for already.
        if device.consumes_counters and not (
            multi and (did in self.alloc._in_use or did in self.allocating_capacity)
        ):
            if self.gates.compatibility_groups:
                groups = self._take_groups(pool, entry)
                if groups is None:
                    return None
            if not self._consume_counters(pool, entry):
                self._release(pool, entry, counted=False, groups=groups)
                return None
            counted = True
        claim = self.claims[ci]
        added: list[Constraint] = []
        for constraint in claim.constraints:
            try:
                taken = constraint.add(spec.parent, spec.full, entry, spec.lookup)
            except AllocationError:
                for c in reversed(added):
                    c.remove(spec.parent, spec.full, entry)
                self._release(pool, entry, counted=counted, groups=groups)
                raise
            if taken:
                added.append(constraint)
                continue
            constraint.rejections += 1
            for c in reversed(added):
                c.remove(spec.parent, spec.full, entry)
            self._release(pool, entry, counted=counted, groups=groups)
            if must:
                raise AllocationError(
                    f"claim {claim.ref}, request {spec.full}: cannot add device {device_id_text(did)} "
                    "because a claim constraint would not be satisfied"
                )
            return None
        share_id: str | None = None
        consumed: dict[str, Quantity] | None = None
        if self.cc and (device.capacity or spec.capacity):
            try:
                fits = self._capacity_fits(spec, entry)
                if fits and multi:
                    consumed = cap.consumption(
                        device=device,
                        driver=did[0],
                        requests=spec.capacity,
                        fractional=self.gates.fractional_capacity_range,
                    )
            except AllocationError:
                for c in reversed(added):
                    c.remove(spec.parent, spec.full, entry)
                self._release(pool, entry, counted=counted, groups=groups)
                raise
            if not fits:
                for c in reversed(added):
                    c.remove(spec.parent, spec.full, entry)
                self._release(pool, entry, counted=counted, groups=groups)
                return None
            if consumed is not None:
                share_id = str(uuid.uuid4())
                inflight = self.allocating_capacity.setdefault(did, {})
                for name, value in consumed.items():
                    inflight[name] = inflight[name] + value if name in inflight else value
        elif multi:
            share_id = str(uuid.uuid4())
        if not multi:
            self.allocating.setdefault(did, []).append(ci)
        results = self.results[ci]
        results.append(_Pick(spec=spec, entry=entry, share_id=share_id, consumed=consumed))
        size = len(results) - 1

        def undo() -> None:
            del results[size:]
            if not multi:
                holders = self.allocating[did]
                holders.pop()
                if not holders:
                    del self.allocating[did]
            if consumed:
                inflight = self.allocating_capacity[did]
                for name, value in consumed.items():
                    inflight[name] = inflight[name] - value
                if all(v.is_zero() for v in inflight.values()):
                    del self.allocating_capacity[did]
            for c in reversed(added):
                c.remove(spec.parent, spec.full, entry)
            self._release(pool, entry, counted=counted, groups=groups)

        return undo

    def funnel(self, spec: Spec) -> RequestFunnel:
        counts = [0] * 7
        matching = [
            k
            for k in self.claims[spec.claim_index].constraints
            if isinstance(k, MatchAttribute) and k.covers(spec.parent, spec.full)
        ]
        seen: dict[int, dict[str, int]] = {k.index: {} for k in matching}
        missing: dict[int, int] = dict.fromkeys(seen, 0)
        binding_excluded = 0
        node_operations_excluded = 0
        counters_excluded = 0
        unavailable: list[str] = []
        short_counters: dict[str, int] = {}
        taints = self.gates.device_taints
        for pool in self.pools:
            if pool.unusable:
                unavailable.append(
                    f"{pool.text} ({'incomplete' if pool.incomplete else pool.invalid_reason})"
                )
                continue
            available = self.alloc.available_counters(pool)
            for se in pool.slices:
                for i, entry in enumerate(se.entries):
                    if se.node_ok is not None and not se.node_ok[i]:
                        continue
                    device = entry.device
                    counts[0] += 1
                    if device.binding_conditions and not self.gates.device_binding_and_status:
                        binding_excluded += 1
                        continue
                    if se.slice.skip_node_operations and not self.node_operations:
                        node_operations_excluded += 1
                        continue
                    if not self._class_matches(spec, entry):
                        continue
                    counts[1] += 1
                    if not self._is_selectable(spec, se, i):
                        continue
                    counts[2] += 1
                    multi = self.cc and device.allow_multiple_allocations
                    if not spec.admin and entry.id in self.alloc.allocated.devices:
                        continue
                    counts[3] += 1
                    if taints and device.taints and not _tolerated(device.taints, spec.tolerations):
                        continue
                    counts[4] += 1
                    if device.consumes_counters:
                        if not self.gates.partitionable_devices:
                            counters_excluded += 1
                            continue
                        if not (multi and entry.id in self.alloc._in_use):
                            short = _short_counters(available, entry)
                            for set_name, counter in short:
                                key = f"{pool.text} {set_name}/{counter}"
                                short_counters[key] = short_counters.get(key, 0) + 1
                            if short:
                                continue
                    counts[5] += 1
                    if self.cc and not self._capacity_fits(spec, entry):
                        continue
                    counts[6] += 1
                    for k in matching:
                        try:
                            value = spec.lookup(entry, k.attribute)
                        except AllocationError:
                            value = None  # an explanation, not a placement: count it as missing
                        text = attribute_text(value, lists=k.lists)
                        if text is None:
                            missing[k.index] += 1
                        else:
                            seen[k.index][text] = seen[k.index].get(text, 0) + 1
        return RequestFunnel(
            claim=self.input_claims[spec.claim_index].ref,
            request=spec.full,
            device_class=spec.device_class.name,
            mode=spec.mode,
            wanted=spec.num_devices,
            devices=counts[0],
            class_matched=counts[1],
            selectors_kept=counts[2],
            free=counts[3],
            untainted=counts[4],
            within_counters=counts[5],
            within_capacity=counts[6],
            binding_excluded=binding_excluded,
            node_operations_excluded=node_operations_excluded,
            counters_excluded=counters_excluded,
            unavailable_pools=tuple(unavailable),
            short_counters=tuple(sorted(short_counters.items(), key=lambda item: (-item[1], item[0]))),
            match_values=tuple(
                MatchValues(
                    constraint=k.index,
                    attribute=k.attribute,
                    values=tuple(sorted(seen[k.index].items(), key=lambda item: (-item[1], item[0]))),
                    missing=missing[k.index],
                )
                for k in matching
            ),
        )

    # ---- the feasibility check -----------------------------------------------------------------

    def _shortfall(self) -> Shortfall | None:
        """What the feasibility check (feasibility.py) finds missing before any search; None when
        the claims may fit, or when there is nothing to combine (one device at most)."""
        specs = [s for c in self.claims for r in c.requests for s in (r.subs or (r.single,)) if s]
        if sum(s.num_devices for s in specs if not s.admin) <= 1:
            return None
        # In mode All a device a constraint turns away is an error, which the search reports where
        # it meets it: such claims are left to the search (All leaves it nothing to combine anyway).
        if any(
            s.mode == ALL and any(k.covers(s.parent, s.full) for k in self.claims[s.claim_index].constraints)
            for s in specs
        ):
            return None
        self._serve_errors = False
        if self._derived_errors(specs):
            return None  # an error the search reports as upstream does, if it gets there
        devices: dict[DeviceID, int] = {}
        entries: list[DeviceEntry] = []
        serving: dict[int, list[int]] = {}  # spec key -> devices it can use (multi-allocatable apart)
        shared: dict[int, int] = {}  # spec key -> multi-allocatable devices it can use
        for spec in specs:
            if spec.admin:
                continue
            candidates = spec.all_devices if spec.mode == ALL else self._all_positions()
            own = serving[spec.key] = []
            for pool, se, i in candidates:
                entry = se.entries[i]
                if not self._can_serve(spec, pool, se, i):
                    continue
                if self._serve_errors:
                    return None  # an error the search reports as upstream does, if it gets there
                if self.cc and entry.device.allow_multiple_allocations:
                    shared[spec.key] = shared.get(spec.key, 0) + 1
                    continue
                index = devices.get(entry.id)
                if index is None:
                    index = devices[entry.id] = len(entries)
                    entries.append(entry)
                own.append(index)
        needs: list[Need] = []
        needs_of: list[tuple[_Claim, _Request, int]] = []
        for claim in self.claims:
            for request in claim.requests:
                options = request.subs or ((request.single,) if request.single else ())
                if not options or any(s.admin for s in options):
                    continue  # admin access takes nothing from others
                # The fewest devices any option needs beyond the shareable ones it can use.
                count = min(max(0, s.num_devices - shared.get(s.key, 0)) for s in options)
                if count <= 0:
                    continue
                served = sorted({d for s in options for d in serving[s.key]})
                label = f"request {request.name}"
                if len(self.claims) > 1:
                    label = f"claim {claim.ref} {label}"
                needs_of.append((claim, request, len(needs)))
                needs.append(Need(label=label, count=count, devices=tuple(served)))
        same, distinct = self._constraint_bounds(needs_of, entries)
        check = self.budget.check if self.budget is not None else None
        return shortfall(needs=needs, same=same, distinct=distinct, check=check)

    def _derived_errors(self, specs: list[Spec]) -> bool:
        """Whether a derived attribute that a constraint reads fails to evaluate on a device its
        request could take (admin access included). The search would stop with that error if it
        met it, so the check must not answer first; evaluated values are kept for the search."""
        for spec in specs:
            names = {
                k.attribute
                for k in self.claims[spec.claim_index].constraints
                if k.attribute in spec.derived and k.covers(spec.parent, spec.full)
            }
            if not names:
                continue
            candidates = spec.all_devices if spec.mode == ALL else self._all_positions()
            for pool, se, i in candidates:
                if not self._can_serve(spec, pool, se, i):
                    continue
                for name in names:
                    try:
                        spec.lookup(se.entries[i], name)
                    except AllocationError:
                        return True
        return False

    def _all_positions(self) -> list[tuple[Pool, SliceEntry, int]]:
        return [
            (pool, se, i)
            for pool in self.pools
            if not pool.unusable
            for se in pool.slices
            for i in range(len(se.entries))
        ]

    def _can_serve(self, spec: Spec, pool: Pool, se: SliceEntry, index: int) -> bool:
        """Whether ``spec`` could take this device on its own (the search's checks, without the
        other devices of the claim). Errors count as yes: the search reports them where it meets them."""
        entry = se.entries[index]
        device = entry.device
        # In the search's order: a device it would evaluate (and fail on) comes before the others.
        if entry.id in self.alloc.allocated.devices:
            return False
        try:
            if not self._is_selectable(spec, se, index):
                return False
            # Not the search's own picks so far: the check may run in the middle of a search.
            if self.cc and not self._capacity_fits(spec, entry, in_flight=False):
                return False
        except AllocationError:
            self._serve_errors = True
            return True
        if entry.slice.skip_node_operations and not self.node_operations:
            return False
        if device.consumes_counters and not self.gates.partitionable_devices:
            return False
        if self.gates.device_taints and device.taints and not _tolerated(device.taints, spec.tolerations):
            return False
        multi = self.cc and device.allow_multiple_allocations
        if device.consumes_counters and not (multi and entry.id in self.alloc._in_use):
            return _counters_fit(self.alloc.available_counters(pool), entry)
        return True

    def _constraint_bounds(
        self, needs_of: list[tuple[_Claim, _Request, int]], entries: list[DeviceEntry]
    ) -> tuple[list[SameValue], list[DistinctValues]]:
        same: list[SameValue] = []
        distinct: list[DistinctValues] = []
        by_claim: dict[int, list[tuple[_Request, int]]] = {}
        for claim, request, n in needs_of:
            by_claim.setdefault(id(claim), []).append((request, n))
        for claim in self.claims:
            mine = by_claim.get(id(claim), [])
            for k in claim.constraints:
                if self._derives(claim, k):
                    continue  # the value depends on the request as well as the device: no bound
                # A request counts as covered only when all of its subrequests are.
                covered = tuple(
                    n
                    for request, n in mine
                    if all(k.covers(s.parent, s.full) for s in (request.subs or (request.single,)) if s)
                )
                if not covered:
                    continue
                values: dict[int, frozenset[object]] = {}
                for d, entry in enumerate(entries):
                    found = k.check_values(lookup_attribute(entry, k.attribute))
                    if found is not None:
                        values[d] = found
                written = claim.claim.spec.constraints[k.index]
                label = constraint_text(written.match_attribute, written.distinct_attribute, written.requests)
                if isinstance(k, MatchAttribute):
                    same.append(SameValue(label=label, needs=covered, values=values))
                else:
                    distinct.append(DistinctValues(label=label, needs=covered, values=values))
        return same, distinct

    @staticmethod
    def _derives(claim: _Claim, constraint: Constraint) -> bool:
        """Whether a request the constraint covers derives the constraint's attribute."""
        return any(
            constraint.attribute in s.derived
            for r in claim.requests
            for s in (r.subs or (r.single,))
            if s is not None and constraint.covers(s.parent, s.full)
        )

    # ---- the search ----------------------------------------------------------------------------

    def _one(
        self, ci: int, ri: int, si: int, di: int, in_sub: bool, start: tuple[int, int, int] | None
    ) -> bool:
        self.invocations += 1
        if self.invocations == self.check_at:
            self.shortfall = self._shortfall()
            if self.shortfall is not None:
                raise _Infeasible
        budget = self.budget
        if budget is not None and not self.invocations & 255 and budget.clock() > budget.deadline:
            raise BudgetExhausted(budget)
        if ci >= len(self.claims):
            return True
        claim = self.claims[ci]
        if ri >= len(claim.requests):
            try:
                return self._one(ci + 1, 0, 0, 0, False, None)
            except _MaxSizeExceeded:
                return False
        request = claim.requests[ri]
        if request.subs and not in_sub:
            only_max_size = True
            for s in range(len(request.subs)):
                try:
                    if self._one(ci, ri, s, 0, True, None):
                        return True
                except _MaxSizeExceeded:
                    continue
                only_max_size = False
            if only_max_size:
                raise _MaxSizeExceeded
            return False
        spec = request.subs[si] if request.subs else request.single
        assert spec is not None
        self.selected[ci][ri] = spec
        if spec.mode == ALL and not spec.all_devices:
            return False
        if di >= spec.num_devices:
            return self._one(ci, ri + 1, 0, 0, False, None)
        if len(self.results[ci]) + spec.num_devices - di > MAX_DEVICES_PER_CLAIM:
            raise _MaxSizeExceeded
        if spec.mode == ALL:
            pool, se, index = spec.all_devices[di]
            undo = self._allocate_device(spec, pool, se.entries[index], must=True)
            if undo is None:
                return False
            try:
                if self._one(ci, ri, si, di + 1, in_sub, None):
                    return True
            except _MaxSizeExceeded:
                undo()
                raise
            undo()
            return False
        allocated_devices = self.alloc.allocated.devices
        allocating = self.allocating
        p0, s0, d0 = start or (0, 0, 0)
        pools = self.pools
        for pi in range(p0, len(pools)):
            pool = pools[pi]
            if pool.unusable:
                continue
            slices = pool.slices
            for sli in range(s0 if pi == p0 else 0, len(slices)):
                se = slices[sli]
                entries = se.entries
                for dvi in range(d0 if pi == p0 and sli == s0 else 0, len(entries)):
                    entry = entries[dvi]
                    did = entry.id
                    if spec.admin:
                        if ci in allocating.get(did, ()):
                            continue
                    elif did in allocated_devices or did in allocating:
                        continue
                    if not self._is_selectable(spec, se, dvi):
                        continue
                    if self.cc and not self._capacity_fits(spec, entry):
                        continue
                    undo = self._allocate_device(spec, pool, entry, must=False)
                    if undo is None:
                        continue
                    try:
                        if self._one(ci, ri, si, di + 1, in_sub, (pi, sli, dvi + 1)):
                            return True
                    except _MaxSizeExceeded:
                        undo()  # the caller may try another subrequest: leave no trace
                        raise
                    undo()
        return False

    # ---- results -------------------------------------------------------------------------------

    def _result(self, ci: int, claim: _Claim) -> AllocationResult:
        binding = self.gates.device_binding_and_status
        devices = []
        for pick in self.results[ci]:
            device = pick.entry.device
            driver, pool, name = pick.entry.id
            devices.append(
                DeviceRequestAllocationResult(
                    request=pick.spec.full,
                    driver=driver,
                    pool=pool,
                    device=name,
                    admin_access=True if pick.spec.admin else None,
                    tolerations=pick.spec.tolerations,
                    binding_conditions=device.binding_conditions if binding else (),
                    binding_failure_conditions=device.binding_failure_conditions if binding else (),
                    share_id=pick.share_id,
                    consumed_capacity=MappingProxyType(pick.consumed)
                    if pick.consumed
                    else MappingProxyType({}),
                    skip_node_operations=pick.entry.slice.skip_node_operations
                    if self.gates.optional_node_operations
                    else (),
                )
            )
        return AllocationResult(
            devices=tuple(devices),
            config=self._config(ci, claim),
            node_selector=self._node_selector(self.results[ci]),
        )

    def _config(self, ci: int, claim: _Claim) -> tuple[DeviceAllocationConfiguration, ...]:
        selected = [s for s in self.selected[ci] if s is not None]
        by_class: dict[str, list[str]] = {}
        for spec in selected:
            by_class.setdefault(spec.device_class.name, []).append(spec.full)
        config: list[DeviceAllocationConfiguration] = []
        for class_name, names in by_class.items():
            for class_entry in self.alloc.classes[class_name].config:
                if class_entry.opaque is None:
                    continue  # a configuration type this code does not know: nothing to pass on
                config.append(
                    DeviceAllocationConfiguration(
                        source=FROM_CLASS, requests=tuple(names), opaque=class_entry.opaque
                    )
                )
        known = {s.parent for s in selected} | {s.full for s in selected}
        for claim_entry in claim.claim.spec.config:
            if claim_entry.opaque is None:
                continue
            if not claim_entry.requests or any(r in known for r in claim_entry.requests):
                config.append(
                    DeviceAllocationConfiguration(
                        source=FROM_CLAIM, requests=claim_entry.requests, opaque=claim_entry.opaque
                    )
                )
        out: list[DeviceAllocationConfiguration] = []
        for item in config:
            if item.requests and all(s.parent in item.requests or s.full in item.requests for s in selected):
                item = replace(item, requests=())
            out.append(item)
        return tuple(out)

    def _node_selector(self, picks: list[_Pick]) -> NodeSelector | None:
        binding = self.gates.device_binding_and_status
        fields: list[NodeSelectorRequirement] = []
        expressions: list[NodeSelectorRequirement] = []
        for pick in picks:
            s = pick.entry.slice
            d = pick.entry.device
            per_device = s.per_device_node_selection
            if s.node_name or (per_device and d.node_name) or (binding and d.binds_to_node):
                return _node_selector_for(self.node.name)
            selector = (
                s.node_selector if s.node_selector is not None else (d.node_selector if per_device else None)
            )
            if selector is None:
                continue
            if len(selector.terms) != 1:
                raise AllocationError(
                    f"unsupported ResourceSlice.NodeSelector with {len(selector.terms)} terms"
                )
            term = selector.terms[0]
            _merge(fields, term.match_fields)
            _merge(expressions, term.match_expressions)
        if not fields and not expressions:
            return None
        return NodeSelector(
            terms=(NodeSelectorTerm(match_expressions=tuple(expressions), match_fields=tuple(fields)),)
        )


@functools.lru_cache(maxsize=4096)
def _node_selector_for(node_name: str) -> NodeSelector:
    return NodeSelector.for_node(node_name)


def _merge(into: list[NodeSelectorRequirement], requirements: Iterable[NodeSelectorRequirement]) -> None:
    for r in requirements:
        if not any(
            x.key == r.key and x.operator == r.operator and set(x.values) == set(r.values) for x in into
        ):
            into.append(r)
