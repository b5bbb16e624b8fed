"""Allocation errors: fatal ones, and the node-local one that only rules out this node."""

from __future__ import annotations


class AllocationError(Exception):
    """Allocation failed with an error (bad input, CEL error, feature disabled, ...): upstream
    aborts the scheduling attempt for the pod."""


class SelectorFailed(AllocationError):
    """A selector's evaluation failed on a device (a CEL runtime error, an unusable attribute). For
    a class's selector ``class_name`` names the class, so that the class can be told too; ``index``
    is the selector's, ``detail`` the error after the device's name."""

    def __init__(self, message: str, *, class_name: str | None, index: int, detail: str) -> None:
        super().__init__(message)
        self.class_name = class_name
        self.index = index
        self.detail = detail


class FailedAllocationOnNode(AllocationError):
    """Nothing fits on this node and the reason is node-specific (invalid resource pools); other
    nodes may still succeed (upstream ``ErrFailedAllocationOnNode``). ``invalid_pools`` names each
    invalid pool with its reason ("driver/pool (duplicate device name 'gpu-0')")."""

    def __init__(self, message: str, *, invalid_pools: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.invalid_pools = invalid_pools


class AllocationTimeout(AllocationError):
    """The search ran past its time limit (upstream: the filter's context deadline)."""
