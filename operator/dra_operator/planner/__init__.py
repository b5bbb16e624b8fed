"""Cluster-wide placement of claims and explanations of why claims do not fit.

Public API::

    planner = Planner(classes=classes, slices=slices, nodes=nodes, allocated=allocations,
                      gates=FeatureGates(), policy="first-fit")   # or "bin-pack", "spread"
    outcome = planner.plan([claim, ...], node=None)   # claims allocated together, like a pod's
    # -> Planned(node, node_bound, allocations) | NotPlaced(explanation) | PlanError(message)
    #    | OutOfBudget(explanation) with planner.plan(..., budget=WorkBudget(seconds))
    planner.note_allocated(allocation)    # after committing; note_released(...) when freed
    outcome.explanation.full / .short     # several lines / one line of at most 1024 characters

    placer = PlannerPlacer(policy="bin-pack")   # the operator's Placer protocol over a ClusterModel
    placer.place(claims=[claim], model=model)   # -> Placement | Unallocatable | OutOfBudget, on the loop
    await placer.place_off_loop(claims=[claim], model=model, namespace=ns)   # in a worker thread

See :mod:`dra_operator.planner.planner` for how nodes are chosen and
:mod:`dra_operator.planner.index` for the free-device index.
"""

from __future__ import annotations

from dra_operator.planner.explain import EVENT_MESSAGE_LIMIT, Explanation, NodeAttempt, truncate
from dra_operator.planner.index import FreeDeviceIndex, KeyCounts
from dra_operator.planner.offloop import PlannerSnapshot, SearchThreads
from dra_operator.planner.placer import PlannerPlacer
from dra_operator.planner.planner import (
    BIN_PACK,
    FIRST_FIT,
    POLICIES,
    SPREAD,
    NotPlaced,
    OutOfBudget,
    PlanError,
    Planned,
    Planner,
    PlanOutcome,
)

__all__ = [
    "BIN_PACK",
    "EVENT_MESSAGE_LIMIT",
    "FIRST_FIT",
    "POLICIES",
    "SPREAD",
    "Explanation",
    "FreeDeviceIndex",
    "KeyCounts",
    "NodeAttempt",
    "NotPlaced",
    "OutOfBudget",
    "PlanError",
    "PlanOutcome",
    "Planned",
    "Planner",
    "PlannerPlacer",
    "PlannerSnapshot",
    "SearchThreads",
    "truncate",
]
