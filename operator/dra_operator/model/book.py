"""The claim book: everything the operator keeps about claims beyond the cluster's own state.

The model (:mod:`dra_operator.model.cluster`) holds what the API server says of a claim; the book
holds what the operator decided about it: what it was last told, how its retries and searches
stand, whether a pod has reserved it, how long it has given way to kube-scheduler, the devices
reserved for it. The parts of the claim path (allocate, release, the scheduler waits and
reservations, the back-offs) read and change a claim's entries here and keep none of their own;
:meth:`ClaimBook.forget` drops all of a claim's at once when it is gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dra_operator.model.cluster import ClaimKey

if TYPE_CHECKING:
    # Types the book stores, made by the layers above it (placement, the scheduler reservations).
    from dra_operator.planner.placement import Unallocatable
    from dra_operator.scheduler.reservation import Reservation


@dataclass(slots=True)
class Wait:
    """A claim giving way to kube-scheduler: since when (time.monotonic()), and whether its
    condition and Event have said so."""

    since: float
    announced: bool = False


@dataclass(slots=True)
class Search:
    """How a claim's placement stands with its budget (see ``backoff.SearchBackoff``)."""

    off_loop: bool = False
    """Its placement outgrew the loop's slice once: the next goes straight to a worker thread."""
    exhausted: int = 0
    """Searches in a row that used the whole budget."""
    due_at: float = 0.0
    """When the next search may start after one that used the whole budget."""
    cooling_until: float = 0.0
    """When the next search may start after one in a thread that found no room."""
    deferred: bool = False
    """Something asked for the claim while it cooled down: it comes back when that ends."""


@dataclass(slots=True)
class ClaimBook:
    failures: dict[ClaimKey, Unallocatable] = field(default_factory=dict)
    """Claims that cannot be allocated now, with what they were last told (said once while it
    stays the same): the placement's own answer, kept as it came."""
    retries: dict[ClaimKey, int] = field(default_factory=dict)
    """Attempts in a row that failed (API errors, races): the back-off's exponent."""
    searches: dict[ClaimKey, Search] = field(default_factory=dict)
    reserved_by_pods: set[ClaimKey] = field(default_factory=set)
    """Claims a pod has reserved: a template claim no pod reserves any more is deallocated."""
    waits: dict[ClaimKey, Wait] = field(default_factory=dict)
    """Claims that gave way to kube-scheduler, since the first time (kept until allocated or gone)."""
    waiting: set[ClaimKey] = field(default_factory=set)
    """Those giving way now."""
    reservations: dict[ClaimKey, Reservation] = field(default_factory=dict)
    tried_nodes: dict[ClaimKey, set[str]] = field(default_factory=dict)
    """Nodes a reservation for the claim was tried on and given up."""

    def forget(self, key: ClaimKey) -> None:
        """The claim is gone: everything about it (its reservation's rules are the caller's to delete
        first)."""
        self.failures.pop(key, None)
        self.retries.pop(key, None)
        self.searches.pop(key, None)
        self.reserved_by_pods.discard(key)
        self.waits.pop(key, None)
        self.waiting.discard(key)
        self.reservations.pop(key, None)
        self.tried_nodes.pop(key, None)
