"""The operator's :class:`~dra_operator.planner.placement.Placer` protocol on top of :class:`Planner`.

:class:`PlannerPlacer` keeps one planner per model generation (classes, slices, nodes); a new
generation builds a new slice index from the previous one, so unchanged devices keep their CEL
results. Between calls it brings the planner's allocations in line with the model's (allocated
claims and allocations being written), touching only claims whose allocation changed.

A placement on the loop runs within a slice of it (``slice_s``); one that needs more is searched
again in a worker thread from a snapshot, within ``budget_s`` (see :mod:`offloop`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence

from dra_api.model import AllocationResult, ResourceClaim
from dra_operator.allocator import FeatureGates, SliceIndex
from dra_operator.base.settings import SEARCH_BUDGET_S
from dra_operator.cel import WorkBudget
from dra_operator.model.cluster import ClaimKey, ClusterModel
from dra_operator.planner.index import exclusive_devices
from dra_operator.planner.offloop import PlannerSnapshot, SearchThreads
from dra_operator.planner.placement import Outcome, OutOfBudget, Placement, Unallocatable
from dra_operator.planner.planner import (
    FIRST_FIT,
    NotPlaced,
    PlanError,
    Planner,
    PlanOutcome,
)
from dra_operator.planner.planner import (
    OutOfBudget as Unfinished,
)

# Defaults of the operator's settings (see Settings for what each means).
SLICE_S = 0.05
BUDGET_S = SEARCH_BUDGET_S
THREADS = 2
SHARE = 0.5


class PlannerPlacer:
    """Cluster-wide placement for the claim reconciler (policy: first-fit, bin-pack or spread)."""

    def __init__(
        self,
        *,
        policy: str = FIRST_FIT,
        gates: FeatureGates | None = None,
        prefer_last_devices: bool = False,
        slice_s: float = SLICE_S,
        budget_s: float = BUDGET_S,
        threads: int = THREADS,
        share: float = SHARE,
    ) -> None:
        self.policy = policy
        self.gates = gates or FeatureGates()
        self.slice_s = slice_s
        self.budget_s = budget_s
        self.search = SearchThreads(threads=threads, share=share)
        # kube-scheduler takes the first free devices of a pool; an allocator running beside it takes
        # the last ones, so the two stay apart until a pool is nearly full (results name devices, so
        # the order is otherwise invisible).
        self.prefer_last_devices = prefer_last_devices
        self._planner: Planner | None = None
        self._generation = -1
        self._noted: dict[ClaimKey, AllocationResult] = {}
        self._model: ClusterModel | None = None
        self._position = 0

    def planner_for(self, model: ClusterModel) -> Planner:
        """The planner for the model as it is now (allocations included)."""
        current = model.holding_allocations()
        if self._planner is None or self._generation != model.generation or self._model is not model:
            previous = self._planner.slices if self._planner is not None else None
            slices = list(model.slices.values())
            if self.prefer_last_devices:
                slices = [dataclasses.replace(s, devices=tuple(reversed(s.devices))) for s in slices]
            self._planner = Planner(
                classes=model.classes,
                slices=SliceIndex(slices, previous=previous),
                nodes=model.nodes.values(),
                allocated=current.values(),
                gates=self.gates,
                policy=self.policy,
            )
            self._generation = model.generation
            self._model = model
            self._noted = dict(current)
            self._position = model.holding_position
            return self._planner
        planner = self._planner
        changed = model.holding_changes_since(self._position)
        self._position = model.holding_position
        for key in changed if changed is not None else set(self._noted) | set(current):
            old, new = self._noted.get(key), current.get(key)
            if new is old:
                continue
            if old is not None:
                planner.note_released(old)
                del self._noted[key]
            if new is not None:
                planner.note_allocated(new)
                self._noted[key] = new
        return planner

    def rebuild(self) -> None:
        """Drop the planner: the next placement builds it afresh from the model."""
        self._planner = None

    def disagreements(self, model: ClusterModel) -> list[str]:
        """Where the planner, brought up to date with ``model`` as a placement would, disagrees
        with it: devices held by a different number of allocations than the model's holding
        allocations say, and free counts of the index that do not match its own devices. Empty
        when they agree. O(devices in use + devices evaluated): for tests and for checking a
        suspicion, not for every placement."""
        planner = self.planner_for(model)
        expected = Counter(did for a in model.holding_allocations().values() for did in exclusive_devices(a))
        problems = []
        counted = planner.index.holder_counts()
        mismatched = [d for d in expected.keys() | counted.keys() if expected.get(d, 0) != counted.get(d, 0)]
        for did in sorted(mismatched):
            want, have = expected.get(did, 0), counted.get(did, 0)
            holders = ", ".join(
                sorted(str(k) for k, a in model.holding_allocations().items() if did in exclusive_devices(a))
            )
            problems.append(
                f"index counts {have} holders of {'/'.join(did)}, the model {want} ({holders or 'none'})"
            )
        allocator_held = planner.allocator.allocated.devices
        for did in sorted(allocator_held ^ expected.keys()):
            problems.append(
                f"allocator counts {'/'.join(did)} {'held' if did in allocator_held else 'free'}, "
                f"the model {'held' if did in expected else 'free'}"
            )
        problems += planner.index.count_problems()
        return problems

    def place(
        self,
        *,
        claims: Sequence[ResourceClaim],
        model: ClusterModel,
        policy: str | None = None,
        node: str | None = None,
        budget: WorkBudget | None = None,
    ) -> Outcome:
        budget = budget if budget is not None else WorkBudget.loop_slice(self.slice_s)
        return _outcome(self.planner_for(model).plan(list(claims), policy=policy, node=node, budget=budget))

    def snapshot(self, model: ClusterModel) -> PlannerSnapshot:
        """What a worker thread needs to place claims on the model as it is now (cheap: the slice
        index is shared, the rest are copies of references)."""
        planner = self.planner_for(model)
        return PlannerSnapshot(
            slices=planner.slices,
            classes=dict(planner.classes),
            nodes=list(planner.nodes),
            allocations=list(model.holding_allocations().values()),
            gates=self.gates,
            policy=self.policy,
        )

    async def place_off_loop(
        self,
        *,
        claims: Sequence[ResourceClaim],
        model: ClusterModel,
        namespace: str,
        check: Callable[[], Unallocatable | None] | None = None,
    ) -> Outcome:
        snapshot = self.snapshot(model)
        claims = list(claims)
        budget_s = self.budget_s

        def work() -> tuple[PlanOutcome | Unallocatable, float]:
            refused = check() if check is not None else None
            if refused is not None:
                return refused, 0.0
            return snapshot.plan(claims, budget_s=budget_s)

        outcome, spent = await self.search.run(namespace=namespace, work=work)
        found = outcome if isinstance(outcome, Unallocatable) else _outcome(outcome)
        return dataclasses.replace(found, spent_s=spent) if isinstance(found, Unallocatable) else found


def _outcome(outcome: PlanOutcome) -> Outcome:
    if isinstance(outcome, PlanError):
        return Unallocatable(
            reason=outcome.reason, message=outcome.message[:1024], class_selector=outcome.class_selector
        )
    if isinstance(outcome, NotPlaced):
        # A node ruled out by invalid pools is upstream's error case: the driver's slices need
        # fixing, so the reason says so (the message still explains every node).
        reason = "InvalidResourceSlices" if outcome.invalid_pools else "NoFit"
        return Unallocatable(reason=reason, message=outcome.explanation.short)
    if isinstance(outcome, Unfinished):
        return OutOfBudget(message=outcome.explanation.short, spent_s=outcome.spent_s)
    return Placement(node=outcome.node if outcome.node_bound else None, allocations=outcome.allocations)
