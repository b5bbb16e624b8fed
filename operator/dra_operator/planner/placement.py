"""Placement: choose a node and devices for a claim, or say why none fits.

The claim lifecycle depends only on the :class:`Placer` protocol; the operator runs
:class:`dra_operator.planner.PlannerPlacer` (cluster-wide placement over the structured allocator).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dra_api.model import AllocationResult, ResourceClaim
from dra_operator.cel import WorkBudget
from dra_operator.model.cluster import ClusterModel


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the claims go: one allocation result per claim, in order, and the node (None when the
    devices are reachable from every node)."""

    node: str | None
    allocations: tuple[AllocationResult, ...]


@dataclass(frozen=True, slots=True)
class ClassSelectorFault:
    """A DeviceClass's selector that fails on devices: the class's problem, not only the claim's."""

    class_name: str
    index: int
    detail: str


@dataclass(frozen=True, slots=True)
class Unallocatable:
    """Why the claims cannot be allocated now. ``reason`` is a short CamelCase word for Events and
    metrics; ``message`` says what to change."""

    reason: str
    message: str
    spent_s: float | None = None
    """What the placement cost (CPU seconds), when it was searched in a worker thread."""
    class_selector: ClassSelectorFault | None = None
    """The class selector that failed, when that is why."""


@dataclass(frozen=True, slots=True)
class OutOfBudget:
    """The placement used its budget before it had an answer. ``message`` says how far it got;
    ``spent_s`` is what it used."""

    message: str
    spent_s: float


Outcome = Placement | Unallocatable | OutOfBudget


class Placer(Protocol):
    def place(
        self,
        *,
        claims: Sequence[ResourceClaim],
        model: ClusterModel,
        policy: str | None = None,
        node: str | None = None,
        budget: WorkBudget | None = None,
    ) -> Outcome:
        """Where ``claims`` go together, by the placer's own policy or by ``policy`` ('first-fit',
        'bin-pack', 'spread') for this one call; with ``node``, on that node or nowhere. On the
        event loop: within ``budget``, or the placer's slice of the loop when none is given."""
        ...

    async def place_off_loop(
        self,
        *,
        claims: Sequence[ResourceClaim],
        model: ClusterModel,
        namespace: str,
        check: Callable[[], Unallocatable | None] | None = None,
    ) -> Outcome:
        """The same, searched in a worker thread with the placer's whole budget (for claims that
        outgrew their slice of the loop); ``namespace`` takes its turn with the others'; ``check``
        runs first, in the thread (validation that compiles selectors). The answer reflects the
        model when the call was made."""
        ...

    def disagreements(self, model: ClusterModel) -> list[str]:
        """Where the placer's own view of free devices differs from ``model`` (empty: none)."""
        ...

    def rebuild(self) -> None:
        """Forget every view derived from the model; the next placement starts from the model."""
        ...
