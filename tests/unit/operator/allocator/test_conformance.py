"""The upstream allocator's test table (neutral YAML in tests/fixtures/conformance).

Every case runs, unless it needs a feature gate on that the allocator does not model
(:data:`NOT_MODELLED`, empty since every allocation gate up to 1.38 is modelled); such cases would
stay in the file as data and be counted here, by name, so that a new case or a newly modelled gate
shows up as a failing test rather than silently. ``test_conformance_upstream.py`` runs the same
file through upstream's allocator.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_operator.allocator import GATE_FIELDS, AllocationError, Allocator, FailedAllocationOnNode
from dra_operator.allocator import gates as allocator_gates

from . import conformance_loader as cl

CASES = cl.load_cases()
PROJECT_CASES = cl.load_cases(cl.PROJECT_CASES_FILE)

# Gates some upstream cases switch on and the allocator does not implement, gate name -> why (the
# cases needing them would be left out of the run, by name, in LEFT_OUT). Every gate is modelled now.
NOT_MODELLED: dict[str, str] = {}

# The cases left out because of NOT_MODELLED: change this set (and NOT_MODELLED) on purpose only.
LEFT_OUT: frozenset[str] = frozenset()


def _gates(case: dict[str, Any]) -> set[str]:
    return {part for item in case.get("features") or [] for part in item.split("+") if part}


def _modelled(case: dict[str, Any]) -> bool:
    return not _gates(case) & NOT_MODELLED.keys()


RUN = [c for c in CASES if _modelled(c)]


def test_case_file_is_complete() -> None:
    assert len(CASES) == 144
    assert len({c["name"] for c in CASES}) == len(CASES)


def test_left_out_cases_are_exactly_those_needing_unmodelled_gates() -> None:
    left_out = [c for c in CASES if not _modelled(c)]
    assert {c["name"] for c in left_out} == LEFT_OUT
    assert len(RUN) == len(CASES) - len(LEFT_OUT)
    for c in left_out:
        assert _gates(c) & NOT_MODELLED.keys(), c["name"]


def test_every_gate_named_by_a_case_is_modelled_or_left_out_on_purpose() -> None:
    named = {gate for c in CASES for gate in _gates(c)}
    assert named <= GATE_FIELDS.keys() | NOT_MODELLED.keys()
    assert not NOT_MODELLED.keys() & GATE_FIELDS.keys()
    assert NOT_MODELLED.keys() == allocator_gates.NOT_MODELLED.keys()  # FeatureGates refuses them on
    assert NOT_MODELLED.keys() <= named  # a gate no case needs is not left out of anything
    assert len(RUN) == 144  # 144 of 144


def test_project_cases_are_named_once_and_not_upstreams() -> None:
    names = [c["name"] for c in PROJECT_CASES]
    assert len(set(names)) == len(names)
    assert not set(names) & {c["name"] for c in CASES}
    assert all(c.get("why") for c in PROJECT_CASES)


ALL_RUN = RUN + PROJECT_CASES


@pytest.mark.parametrize("feasibility", [True, False], ids=["checked", "search-only"])
@pytest.mark.parametrize(
    "case", ALL_RUN, ids=[c["name"] for c in RUN] + [f"project/{c['name']}" for c in PROJECT_CASES]
)
def test_conformance(case: dict[str, Any], feasibility: bool) -> None:
    """Every case with the feasibility check before the search (the operator's way) and without it
    (the search alone, as upstream runs): the same outcome both ways; the search's effort is
    compared with upstream's where the check does not answer first."""
    allocator = Allocator(
        classes=[cl.device_class(c) for c in case.get("classes") or []],
        slices=[cl.resource_slice(s) for s in case.get("slices") or []],
        allocated=cl.allocated_state(case),
        gates=cl.gates(case),
        feasibility=feasibility,
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
    if invocations is not None and allocator.last_shortfall is None:
        assert allocator.last_invocations == invocations
