"""The feasibility check before the search: what it refuses, how it says so, and that it never
refuses a claim the search would place (a property test against the search alone)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_api.model import DeviceClass, Node, ResourceClaim, ResourceSlice
from dra_operator.allocator import AllocatedState, AllocationError, Allocator, FeatureGates, SliceIndex
from dra_operator.allocator.feasibility import DistinctValues, Need, SameValue, Shortfall, shortfall

V1 = "resource.k8s.io/v1"
DRIVER = "gpu.example.com"
CLASS = DeviceClass.from_json(
    {
        "apiVersion": V1,
        "kind": "DeviceClass",
        "metadata": {"name": "gpu"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
)
NODE = Node.make("node-1")


# ---- the matchings alone --------------------------------------------------------------------------


def test_two_requests_that_can_use_only_the_same_devices() -> None:
    # The issue's claim: 12 and 13 devices, both from the same 24.
    needs = [Need("request a", 12, tuple(range(24))), Need("request b", 13, tuple(range(24)))]
    found = shortfall(needs=needs)
    assert found == Shortfall(requests=("request a", "request b"), wanted=25, offered=24)
    assert (
        str(found)
        == "request a and request b together want 25 devices; 24 devices of the node can serve them"
    )


def test_requests_with_devices_of_their_own_fit() -> None:
    needs = [Need("request a", 12, tuple(range(12))), Need("request b", 12, tuple(range(12, 24)))]
    assert shortfall(needs=needs) is None


def test_the_shortfall_names_only_the_requests_that_compete() -> None:
    # a and b fight over two devices; c has devices enough of its own.
    needs = [Need("a", 2, (0, 1)), Need("c", 1, tuple(range(2, 9))), Need("b", 2, (0, 1))]
    found = shortfall(needs=needs)
    assert found is not None
    assert (found.requests, found.wanted, found.offered) == (("a", "b"), 4, 2)


def test_a_matching_that_needs_rerouting_is_found() -> None:
    # a can use 0 or 1, b only 0: a must give 0 up to b.
    assert shortfall(needs=[Need("a", 1, (0, 1)), Need("b", 1, (0,))]) is None


def test_match_attribute_needs_one_value_with_room_for_all() -> None:
    values = {d: frozenset({"r0" if d < 2 else "r1"}) for d in range(4)}
    needs = [Need("gpu", 2, (0, 1, 2, 3)), Need("nic", 1, (0, 1, 2, 3))]
    same = [SameValue("constraint (matchAttribute root on gpu, nic)", (0, 1), values)]
    found = shortfall(needs=needs, same=same)
    assert found is not None
    assert found.constraint == "constraint (matchAttribute root on gpu, nic)"
    assert (found.wanted, found.offered) == (3, 2)
    assert "no value has that many that can serve them together (the most sharing one value: 2)" in str(found)
    # Three devices under one root: the pair fits.
    values[2] = frozenset({"r0"})
    assert shortfall(needs=needs, same=same) is None


def test_distinct_attribute_needs_a_value_per_device() -> None:
    values = {d: frozenset({d % 2}) for d in range(6)}
    needs = [Need("gpu", 3, tuple(range(6)))]
    found = shortfall(
        needs=needs, distinct=[DistinctValues("constraint (distinctAttribute numa)", (0,), values)]
    )
    assert found is not None
    assert str(found) == (
        "gpu wants 3 devices with different values under constraint (distinctAttribute numa); "
        "the devices that can serve it have 2 values"
    )


def test_the_budget_is_checked_between_matchings() -> None:
    calls = []
    values = {d: frozenset({d}) for d in range(4)}
    needs = [Need("a", 1, (0, 1, 2, 3)), Need("b", 1, (0, 1, 2, 3))]
    shortfall(needs=needs, same=[SameValue("c", (0, 1), values)], check=lambda: calls.append(1))
    assert calls  # every matching under a value starts with a check


# ---- in the allocator -----------------------------------------------------------------------------


def _slice(devices: list[dict[str, Any]]) -> ResourceSlice:
    return ResourceSlice.from_json(
        {
            "apiVersion": V1,
            "kind": "ResourceSlice",
            "metadata": {"name": "node-1"},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
                "nodeName": "node-1",
                "devices": devices,
            },
        }
    )


def _gpus(n: int) -> ResourceSlice:
    return _slice([{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(n)])


def _claim(requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None) -> ResourceClaim:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return ResourceClaim.from_json(
        {
            "apiVersion": V1,
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": devices},
        }
    )


def _exact(name: str, count: int, selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu", "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": exactly}


def test_the_issue_claim_is_refused_before_any_search() -> None:
    claim = _claim(
        [
            _exact("a", 12, f'device.attributes["{DRIVER}"].index >= 0'),
            _exact("b", 13, f'device.attributes["{DRIVER}"].index < 100'),
        ]
    )
    allocator = Allocator(classes=[CLASS], slices=[_gpus(24)])
    assert allocator.allocate(node=NODE, claims=[claim]) is None
    assert allocator.last_invocations == 1  # two requests: checked at the search's first step (2^24 without)
    assert str(allocator.last_shortfall) == (
        "request a and request b together want 25 devices; 24 devices of the node can serve them"
    )


def test_devices_held_by_other_claims_do_not_count() -> None:
    held = AllocatedState(devices={(DRIVER, "node-1", f"gpu-{i}") for i in range(4)})
    allocator = Allocator(classes=[CLASS], slices=[_gpus(16)], allocated=held)
    assert allocator.allocate(node=NODE, claims=[_claim([_exact("a", 13)])]) is None
    assert str(allocator.last_shortfall) == "request a wants 13 devices; 12 devices of the node can serve it"


def test_an_easy_search_is_not_checked() -> None:
    # Two of one device: the search gives up within its easy start, before the check would run.
    allocator = Allocator(classes=[CLASS], slices=[_gpus(1)])
    assert allocator.allocate(node=NODE, claims=[_claim([_exact("a", 2)])]) is None
    assert allocator.last_shortfall is None
    assert allocator.last_invocations < 2 * 2 + 8
    # One that succeeds: placed straight away.
    assert allocator.allocate(node=NODE, claims=[_claim([_exact("a", 1)])]) is not None


# ---- never refuses what the search places -----------------------------------------------------------

_VALUES = st.sampled_from(["x", "y", "z"])
_SELECTORS = st.sampled_from(
    [
        None,
        f'device.attributes["{DRIVER}"].root == "x"',
        f'device.attributes["{DRIVER}"].numa != "z"',
        f'device.attributes["{DRIVER}"].index % 2 == 0',
        f'device.attributes["{DRIVER}"].index >= 2',
    ]
)


_MEMORY = st.sampled_from(["1", "2", "3", "300m", "750m", "1100m"])
# Derived in place of the devices' own numa: a constant, from the index, from root (which a device
# may lack: an evaluation error), a list.
_DERIVED = st.sampled_from(
    [
        '"x"',
        f'device.attributes["{DRIVER}"].index % 2 == 0 ? "x" : "y"',
        f'device.attributes["{DRIVER}"].root',
        '["x", "y"]',
    ]
)


@st.composite
def _devices(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(min_value=0, max_value=7))):
        attributes: dict[str, Any] = {"index": {"int": i}}
        if draw(st.booleans()):
            attributes["root"] = {"string": draw(_VALUES)}
        if draw(st.integers(min_value=0, max_value=4)) == 0:  # a list (DRAListTypeAttributes)
            attributes["numa"] = {"strings": draw(st.lists(_VALUES, min_size=1, max_size=2, unique=True))}
        else:
            attributes["numa"] = {"string": draw(_VALUES)}
        device: dict[str, Any] = {"name": f"gpu-{i}", "attributes": attributes}
        if draw(st.integers(min_value=0, max_value=5)) == 0:
            device["taints"] = [{"key": "bad", "effect": "NoSchedule"}]
        if draw(st.integers(min_value=0, max_value=4)) == 0:  # shared by several claims
            device["allowMultipleAllocations"] = True
            memory: dict[str, Any] = {"value": str(draw(st.integers(min_value=1, max_value=4)))}
            if draw(st.booleans()):  # a stepped range: milli-units with DRAFractionalCapacityRange
                memory["requestPolicy"] = {
                    "default": "500m",
                    "validRange": {"min": "250m", "max": memory["value"], "step": "250m"},
                }
            device["capacity"] = {"memory": memory}
        out.append(device)
    return out


@st.composite
def _request(draw: st.DrawFn, name: str) -> dict[str, Any]:
    def spec() -> dict[str, Any]:
        body: dict[str, Any] = {"deviceClassName": "gpu"}
        if draw(st.integers(min_value=0, max_value=7)) == 0:
            body["allocationMode"] = "All"
        else:
            body["count"] = draw(st.integers(min_value=1, max_value=4))
        selector = draw(_SELECTORS)
        if selector:
            body["selectors"] = [{"cel": {"expression": selector}}]
        if draw(st.integers(min_value=0, max_value=5)) == 0:
            body["tolerations"] = [{"key": "bad", "operator": "Exists", "effect": "NoSchedule"}]
        if draw(st.integers(min_value=0, max_value=4)) == 0:
            body["capacity"] = {"requests": {"memory": draw(_MEMORY)}}
        if draw(st.integers(min_value=0, max_value=3)) == 0:  # DRADerivedAttributes
            body["derivedAttributes"] = [{"name": f"{DRIVER}/numa", "expression": draw(_DERIVED)}]
        return body

    if draw(st.integers(min_value=0, max_value=3)) == 0:
        subs = [{"name": f"s{i}", **spec()} for i in range(draw(st.integers(min_value=1, max_value=3)))]
        return {"name": name, "firstAvailable": subs}
    return {"name": name, "exactly": spec()}


@st.composite
def _claims(draw: st.DrawFn) -> ResourceClaim:
    names = [f"r{i}" for i in range(draw(st.integers(min_value=1, max_value=3)))]
    requests = [draw(_request(n)) for n in names]
    constraints = []
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        covered = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
        kind = draw(st.sampled_from(["matchAttribute", "distinctAttribute"]))
        attribute = draw(st.sampled_from(["root", "numa", "index"]))
        constraints.append({"requests": covered, kind: f"{DRIVER}/{attribute}"})
    return _claim(requests, constraints)


def checked_steps(claim: ResourceClaim) -> int:
    """The search step at which the check runs: the first for several requests or constraints, else
    2 x the devices the claim's requests want, + 8."""
    if len(claim.spec.requests) > 1 or claim.spec.constraints:
        return 1
    wanted = sum(
        (s.effective_count if s.mode != "All" else 8)
        for r in claim.spec.requests
        for s in ([r.exactly] if r.exactly else [sub.spec for sub in r.first_available])
    )
    return 2 * wanted + 8


def _outcome(allocator: Allocator, claim: ResourceClaim) -> object:
    try:
        results = allocator.allocate(node=NODE, claims=[claim])
    except AllocationError as exc:
        return ("error", str(exc))
    return None if results is None else [sorted(d.device_id for d in r.devices) for r in results]


_GATES = st.fixed_dictionaries(
    {
        "DRADeviceTaints": st.just(True),
        "DRAListTypeAttributes": st.booleans(),
        "DRADerivedAttributes": st.booleans(),
        "DRAFractionalCapacityRange": st.booleans(),
    }
)


@settings(max_examples=int(__import__("os").environ.get("FEAS_EXAMPLES", "200")))
@given(
    devices=_devices(),
    claim=_claims(),
    held=st.sets(st.integers(min_value=0, max_value=7)),
    switched=_GATES,
)
def test_the_check_never_changes_what_the_search_answers(
    devices: list[dict[str, Any]], claim: ResourceClaim, held: set[int], switched: dict[str, bool]
) -> None:
    index = SliceIndex([_slice(devices)])
    gates = FeatureGates.from_mapping(switched)

    def allocator(*, feasibility: bool) -> Allocator:
        state = AllocatedState(devices={(DRIVER, "node-1", f"gpu-{i}") for i in held})
        return Allocator(classes=[CLASS], slices=index, allocated=state, gates=gates, feasibility=feasibility)

    checked = allocator(feasibility=True)
    assert _outcome(checked, claim) == _outcome(allocator(feasibility=False), claim)
    if checked.last_shortfall is not None:
        assert checked.last_invocations <= checked_steps(claim)


def test_distinct_values_are_counted_within_the_matched_value() -> None:
    # Two roots of 4 devices, each root with 2 NUMA values: 3 devices under one root with 3
    # different NUMA values cannot be had, though 4 NUMA values exist in all.
    root = {d: frozenset({"r0" if d < 4 else "r1"}) for d in range(8)}
    numa = {d: frozenset({d // 2}) for d in range(8)}
    needs = [Need("gpu", 3, tuple(range(8)))]
    same = [SameValue("constraint (matchAttribute root)", (0,), root)]
    apart = [DistinctValues("constraint (distinctAttribute numa)", (0,), numa)]
    assert shortfall(needs=needs, same=same) is None
    assert shortfall(needs=needs, distinct=apart) is None
    found = shortfall(needs=needs, same=same, distinct=apart)
    assert found is not None
    assert found.constraint == "constraint (matchAttribute root)"


# ---- the 1.37 gates ----------------------------------------------------------------------------------

_DERIVED_ON = FeatureGates.from_mapping({"DRADerivedAttributes": True})


def _numa_devices(values: str) -> ResourceSlice:
    return _slice(
        [
            {"name": f"gpu-{i}", "attributes": {"index": {"int": i}, "numa": {"string": v}}}
            for i, v in enumerate(values)
        ]
    )


def _derived_numa(count: int, expression: str) -> ResourceClaim:
    request = _exact("a", count)
    request["exactly"]["derivedAttributes"] = [{"name": f"{DRIVER}/numa", "expression": expression}]
    return _claim([request], [{"matchAttribute": f"{DRIVER}/numa"}])


def test_a_derived_attribute_gives_the_check_no_bound() -> None:
    # The devices' own numa values differ; the request derives one value for all: it fits.
    claim = _derived_numa(2, '"x"')
    for feasibility in (True, False):
        allocator = Allocator(
            classes=[CLASS], slices=[_numa_devices("xyz")], gates=_DERIVED_ON, feasibility=feasibility
        )
        assert allocator.allocate(node=NODE, claims=[claim]) is not None
        assert allocator.last_shortfall is None


def test_an_error_deriving_an_attribute_is_left_to_the_search() -> None:
    # Three devices for four: the check would refuse, but the search meets the evaluation error
    # first (the devices have no "root"), and reports it, as upstream.
    claim = _derived_numa(4, f'device.attributes["{DRIVER}"].root')
    for feasibility in (True, False):
        allocator = Allocator(
            classes=[CLASS], slices=[_numa_devices("xyz")], gates=_DERIVED_ON, feasibility=feasibility
        )
        with pytest.raises(
            AllocationError, match=re.escape("evaluate derived attribute gpu.example.com/numa on device")
        ):
            allocator.allocate(node=NODE, claims=[claim])


def test_scalar_distinct_values_give_a_list_valued_device_no_bound() -> None:
    # List-type attributes off: a list-valued device may come first under distinctAttribute and
    # then clashes with no scalar, so the check must not count it out.
    devices = _slice(
        [
            {"name": "gpu-0", "attributes": {"numa": {"strings": ["x", "y"]}}},
            {"name": "gpu-1", "attributes": {"numa": {"string": "x"}}},
        ]
    )
    claim = _claim([_exact("a", 2)], [{"distinctAttribute": f"{DRIVER}/numa"}])
    for feasibility in (True, False):
        allocator = Allocator(classes=[CLASS], slices=[devices], feasibility=feasibility)
        results = allocator.allocate(node=NODE, claims=[claim])
        assert results is not None
        assert allocator.last_shortfall is None
