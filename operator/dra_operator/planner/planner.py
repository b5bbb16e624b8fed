"""Cluster-wide placement: choose a node and devices for claims allocated together.

:class:`Planner` keeps one :class:`~dra_operator.allocator.Allocator` and one
:class:`~dra_operator.planner.index.FreeDeviceIndex` across calls. For each call it derives the
claims' demand (devices needed per CEL projection), asks the index for the nodes that can
possibly meet it, in policy order, and runs the real allocator on those nodes only, the first
solution winning. Allocations the caller commits are fed back with :meth:`Planner.note_allocated`
(and :meth:`Planner.note_released`), which keeps both the allocator and the index current.

Policies: ``first-fit`` (stable node order, by name), ``bin-pack`` (fewest free matching devices
that still fit), ``spread`` (most free matching devices).

A call may be given a :class:`~dra_operator.cel.WorkBudget`: everything it does (the index's CEL,
the feasibility check and search on each node, the explanation) answers to it, and a call that runs
out returns :class:`OutOfBudget` with what it learnt so far rather than searching on.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from dra_api.model import AllocationResult, DeviceClass, Node, ResourceClaim, ResourceSlice
from dra_operator.allocator import (
    AllocatedState,
    AllocationError,
    Allocator,
    FailedAllocationOnNode,
    FeatureGates,
    SelectorFailed,
    SliceIndex,
)
from dra_operator.cel import BudgetExhausted, CelCompileError, WorkBudget, charged_to, compile_selector
from dra_operator.planner.demand import Demand, DemandKey, demand_of, request_specs
from dra_operator.planner.explain import (
    Explanation,
    ExplanationBody,
    NodeAttempt,
    explain,
    explain_unfinished,
)
from dra_operator.planner.index import FreeDeviceIndex, exclusive_devices
from dra_operator.planner.placement import ClassSelectorFault

logger = logging.getLogger(__name__)

FIRST_FIT = "first-fit"
BIN_PACK = "bin-pack"
SPREAD = "spread"
POLICIES = (FIRST_FIT, BIN_PACK, SPREAD)


@dataclass(frozen=True, slots=True)
class Planned:
    """The claims fit: one result per claim, in order. ``node`` is where they were allocated;
    ``node_bound`` says whether any result carries a node selector (False: usable anywhere)."""

    node: str
    node_bound: bool
    allocations: tuple[AllocationResult, ...]
    tried: int = 1


@dataclass(frozen=True, slots=True)
class NotPlaced:
    """No node fits the claims; ``explanation`` says why and what to change."""

    explanation: Explanation
    tried: int = 0
    invalid_pools: tuple[tuple[str, str], ...] = ()
    """(node, "driver/pool (reason)") for each invalid pool that ruled a node out: an error in the
    driver's ResourceSlices, not a capacity problem (upstream fails such a node with an error)."""


@dataclass(frozen=True, slots=True)
class PlanError:
    """The claims cannot be allocated because of an error (missing class, invalid CEL, CEL
    runtime error, disabled feature, too many devices): not a capacity problem."""

    message: str
    reason: str = "AllocationError"
    class_selector: ClassSelectorFault | None = None
    """The DeviceClass selector that failed on a device, when that is the error."""

    @classmethod
    def of(cls, exc: AllocationError) -> PlanError:
        fault = (
            ClassSelectorFault(class_name=exc.class_name, index=exc.index, detail=exc.detail)
            if isinstance(exc, SelectorFailed) and exc.class_name is not None
            else None
        )
        return cls(str(exc), class_selector=fault)


@dataclass(frozen=True, slots=True)
class OutOfBudget:
    """The budget ran out before a node was found or every candidate ruled out; ``explanation``
    says what was learnt (nodes searched, shortfalls found) and that the search was cut short."""

    explanation: Explanation
    tried: int
    spent_s: float


PlanOutcome = Planned | NotPlaced | PlanError | OutOfBudget


@dataclass(slots=True)
class _Search:
    attempts: list[NodeAttempt] = field(default_factory=list)
    current: str | None = None  # the node being searched (where a budget that runs out stopped)


class Planner:
    """Places claims cluster-wide with the structured allocator (see the module docstring)."""

    def __init__(
        self,
        *,
        classes: Mapping[str, DeviceClass] | Iterable[DeviceClass],
        slices: SliceIndex | Iterable[ResourceSlice],
        nodes: Iterable[Node],
        allocated: Iterable[AllocationResult] = (),
        gates: FeatureGates | None = None,
        policy: str = FIRST_FIT,
        feasibility: bool = True,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown placement policy {policy!r}; expected one of {', '.join(POLICIES)}")
        self.policy = policy
        self.gates = gates or FeatureGates()
        self.classes: dict[str, DeviceClass] = (
            dict(classes) if isinstance(classes, Mapping) else {c.name: c for c in classes}
        )
        self.slices = slices if isinstance(slices, SliceIndex) else SliceIndex(slices)
        state = AllocatedState()
        allocations = list(allocated)
        for allocation in allocations:
            state.add_allocation(allocation)
        self.allocator = Allocator(
            classes=self.classes,
            slices=self.slices,
            allocated=state,
            gates=self.gates,
            feasibility=feasibility,
        )
        self.index = _index_for(
            slices=self.slices, nodes=nodes, classes=self.classes, gates=self.gates, allocations=allocations
        )
        # Explanations of this state of the cluster (see explain's memo); emptied on every change.
        self._explained: dict[Hashable, ExplanationBody] = {}

    @property
    def nodes(self) -> list[Node]:
        return self.index.nodes

    # ---- allocations made elsewhere -----------------------------------------------------------

    def note_allocated(self, allocation: AllocationResult) -> None:
        """Record a committed allocation (its devices are no longer free)."""
        self.allocator.note_allocated(allocation)
        self.index.note_allocated(allocation)
        self._explained.clear()

    def note_released(self, allocation: AllocationResult) -> None:
        """Forget an allocation (the claim was deallocated or deleted)."""
        self.allocator.note_released(allocation)
        self.index.note_released(allocation)
        self._explained.clear()

    # ---- placement -----------------------------------------------------------------------------

    def plan(
        self,
        claims: Sequence[ResourceClaim],
        *,
        node: str | Node | None = None,
        policy: str | None = None,
        budget: WorkBudget | None = None,
    ) -> PlanOutcome:
        """Choose a node and devices for ``claims`` (allocated together, like a pod's claims).

        With ``node`` only that node is tried (a name not among the planner's nodes is a node
        without labels); ``policy`` overrides the planner's for this call; ``budget`` bounds the
        whole call (no bound without one). Nothing is recorded: call :meth:`note_allocated` for
        what is committed.
        """
        if policy is not None and policy not in POLICIES:
            raise ValueError(f"unknown placement policy {policy!r}; expected one of {', '.join(POLICIES)}")
        claims = list(claims)
        if not claims:
            return PlanError("no claims to allocate", reason="NoClaims")
        search = _Search()
        try:
            with charged_to(budget):
                problem = self.check(claims)
                if problem is not None:
                    return problem
                return self._plan(claims, search, node=node, policy=policy, budget=budget)
        except BudgetExhausted as exc:
            spent = exc.budget.spent
            explanation = explain_unfinished(
                claims=claims,
                attempts=search.attempts,
                nodes=len(self.nodes),
                spent_s=spent,
                cut=search.current,
            )
            return OutOfBudget(explanation=explanation, tried=len(search.attempts), spent_s=spent)

    def _plan(
        self,
        claims: list[ResourceClaim],
        search: _Search,
        *,
        node: str | Node | None,
        policy: str | None,
        budget: WorkBudget | None,
    ) -> PlanOutcome:
        if node is not None:
            target = node if isinstance(node, Node) else self._node_named(node)
            outcome = self._try(target, claims, search, budget)
            if outcome is not None:
                return outcome
            return self._not_placed(claims, search, fixed=target)
        if not self.nodes:
            return NotPlaced(explanation=Explanation.simple("the cluster has no nodes"), tried=0)
        demand = demand_of(claims=claims, classes=self.classes)
        for rank in self.candidates(demand, policy=policy):
            if budget is not None:
                budget.check()
            outcome = self._try(self.nodes[rank], claims, search, budget)
            if outcome is not None:
                return outcome
        return self._not_placed(claims, search, fixed=None)

    def check(self, claims: Sequence[ResourceClaim]) -> PlanError | None:
        """Errors found without looking at devices: missing classes and selectors that do not
        compile (in the claims or in their classes)."""
        for claim in claims:
            for request in claim.spec.requests:
                for name, spec in request_specs(request):
                    where = f"claim {claim.ref}, request {name}"
                    device_class = self.classes.get(spec.device_class_name)
                    if spec.device_class_name and device_class is None:
                        return PlanError(
                            f"{where}: device class {spec.device_class_name} not found; create it or fix "
                            "the request's deviceClassName",
                            reason="DeviceClassNotFound",
                        )
                    for i, selector in enumerate(spec.selectors):
                        message = _compile_problem(selector.cel)
                        if message:
                            return PlanError(f"{where}: selector #{i}: {message}", reason="InvalidSelector")
                    if device_class is not None:
                        for i, selector in enumerate(device_class.selectors):
                            message = _compile_problem(selector.cel)
                            if message:
                                return PlanError(
                                    f"class {device_class.name}: selector #{i}: {message}",
                                    reason="InvalidDeviceClass",
                                )
        return None

    def candidates(self, demand: Demand, *, policy: str | None = None) -> Iterator[int]:
        """Ranks of the nodes that can possibly satisfy ``demand``, in the order of ``policy`` (by
        default the planner's)."""
        policy = policy or self.policy
        index = self.index
        lazy = policy == FIRST_FIT  # other policies compare all nodes: evaluate them all
        counts = {key: index.counts(key, complete=not lazy) for key in demand.every_key()}
        need = demand.counts
        # The key whose node-local shortfall is largest drives the enumeration.
        driver: DemandKey | None = None
        driver_need = 0
        for key, count in need.items():
            local = count - counts[key].shared_free
            if local > driver_need:
                driver, driver_need = key, local
        if driver is None:
            for key in demand.all_keys:
                if counts[key].shared_total == 0:
                    driver, driver_need = key, 1
                    break

        def fits(rank: int) -> bool:
            for key, count in need.items():
                c = counts[key]
                if c.free[rank] + c.shared_free < count:
                    return False
            for key in demand.all_keys:
                c = counts[key]
                if c.free[rank] != c.total[rank] or c.shared_free != c.shared_total:
                    return False
                if c.total[rank] + c.shared_total == 0:
                    return False
            for choice in demand.choices:
                if not any(counts[k].free[rank] + counts[k].shared_free >= n for k, n in choice):
                    return False
            return True

        scored = list(need) + list(demand.all_keys)

        def score(rank: int) -> int:
            return sum(counts[k].free[rank] + counts[k].shared_free for k in scored)

        ranks: Iterable[int]
        simple = driver is not None and len(counts) == 1
        if driver is not None:
            c = counts[driver]
            if lazy:
                ranks = c.ranks_in_order(driver_need, with_pending=True)
            elif simple:  # one key: bucket order is score order
                ranks = c.ranks_with_at_least(driver_need, descending=policy == SPREAD)
            else:
                ranks = c.ranks_in_order(driver_need)
        else:
            ranks = range(len(self.nodes))
        if policy != FIRST_FIT and not simple:
            eligible = [r for r in ranks if fits(r)]
            if policy == BIN_PACK:
                eligible.sort(key=lambda r: (score(r), r))
            else:
                eligible.sort(key=lambda r: (-score(r), r))
            return iter(eligible)
        if lazy:
            every = list(counts.values())

            def evaluated(rank: int) -> int:
                for c in every:
                    index.ensure(c, rank)
                return rank

            return (r for r in map(evaluated, ranks) if fits(r))
        return (r for r in ranks if fits(r))

    # ---- internals -----------------------------------------------------------------------------

    def _node_named(self, name: str) -> Node:
        rank = self.index.rank.get(name)
        return self.nodes[rank] if rank is not None else Node.make(name)

    def _try(
        self, node: Node, claims: list[ResourceClaim], search: _Search, budget: WorkBudget | None
    ) -> PlanOutcome | None:
        search.current = node.name
        try:
            results = self.allocator.allocate(node=node, claims=claims, budget=budget)
        except FailedAllocationOnNode as exc:
            search.attempts.append(
                NodeAttempt(node=node.name, failure=str(exc), invalid_pools=exc.invalid_pools)
            )
            return None
        except AllocationError as exc:
            return PlanError.of(exc)
        if results is None:
            search.attempts.append(
                NodeAttempt(
                    node=node.name,
                    constraint_rejections=dict(self.allocator.last_constraint_rejections),
                    shortfall=self.allocator.last_shortfall,
                )
            )
            return None
        return Planned(
            node=node.name,
            node_bound=any(r.node_selector is not None for r in results),
            allocations=tuple(results),
            tried=len(search.attempts) + 1,
        )

    def _not_placed(self, claims: list[ResourceClaim], search: _Search, *, fixed: Node | None) -> PlanOutcome:
        try:
            explanation = explain(
                planner=self, claims=claims, attempts=search.attempts, fixed=fixed, memo=self._explained
            )
        except AllocationError as exc:  # the funnel evaluates selectors too: errors stay errors
            return PlanError.of(exc)
        invalid = tuple((a.node, pool) for a in search.attempts for pool in a.invalid_pools)
        return NotPlaced(explanation=explanation, tried=len(search.attempts), invalid_pools=invalid)


def _index_for(
    *,
    slices: SliceIndex,
    nodes: Iterable[Node],
    classes: Mapping[str, DeviceClass],
    gates: FeatureGates,
    allocations: Iterable[AllocationResult],
) -> FreeDeviceIndex:
    """The index with the devices of existing allocations already taken (once per holder)."""
    in_use = [did for a in allocations for did in exclusive_devices(a)]
    return FreeDeviceIndex(slices=slices, nodes=nodes, classes=classes, gates=gates, in_use=in_use)


def _compile_problem(expression: str | None) -> str | None:
    if expression is None:
        return "CEL expression empty (unsupported selector type?)"
    try:
        compile_selector(expression)
    except CelCompileError as exc:
        return f"CEL compile error: {exc}"
    return None
