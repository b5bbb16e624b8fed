"""The upstream allocator's test table (neutral YAML in the shared folder): every case must pass."""

from __future__ import annotations

from typing import Any

import pytest

from dra_operator.allocator import AllocationError, Allocator, FailedAllocationOnNode

from . import conformance_loader as cl

CASES = cl.load_cases()


def test_case_file_is_complete() -> None:
    assert len(CASES) == 92
    assert len({c["name"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_conformance(case: dict[str, Any]) -> None:
    allocator = Allocator(
        classes=[cl.device_class(c) for c in case.get("classes") or []],
        slices=[cl.resource_slice(s) for s in case.get("slices") or []],
        allocated=cl.allocated_state(case),
        gates=cl.gates(case),
    )
    claims = [cl.resource_claim(c) for c in case.get("claims") or []]
    expect = case["expect"]
    outcome = expect["outcome"]
    if outcome == "error":
        with pytest.raises(AllocationError) as info:
            allocator.allocate(node=cl.node(case.get("node")), claims=claims)
        assert expect["errorContains"] in str(info.value)
        node_local = expect["errorKind"].startswith("node-local")
        assert isinstance(info.value, FailedAllocationOnNode) == node_local
        return
    results = allocator.allocate(node=cl.node(case.get("node")), claims=claims)
    if outcome == "unallocatable":
        assert results is None
    else:
        assert outcome == "allocated"
        assert results is not None, "expected an allocation, got none"
        assert len(results) == len(expect["results"])
        for want, got in zip(expect["results"], results, strict=True):
            cl.compare_result(want, got)
    invocations = (case.get("allocateOneInvocations") or {}).get("default")
    if invocations is not None:
        assert allocator.last_invocations == invocations
