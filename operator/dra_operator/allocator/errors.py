"""Allocation errors: fatal ones, and the node-local one that only rules out this node."""

from __future__ import annotations


class AllocationError(Exception):
    """Allocation failed with an error (bad input, CEL error, feature disabled, ...): upstream
    aborts the scheduling attempt for the pod."""


class FailedAllocationOnNode(AllocationError):
    """Nothing fits on this node and the reason is node-specific (invalid resource pools); other
    nodes may still succeed (upstream ``ErrFailedAllocationOnNode``). ``invalid_pools`` names each
    invalid pool with its reason ("driver/pool (duplicate device name 'gpu-0')")."""

    def __init__(self, message: str, *, invalid_pools: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.invalid_pools = invalid_pools


class AllocationTimeout(AllocationError):
    """The search ran past its time limit (upstream: the filter's context deadline)."""
