"""The feasibility check before the search: what it refuses, how it says so, and that it never
refuses a claim the search would place (a property test against the search alone)."""

from __future__ import annotations

from typing import Any

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


@st.composite
def _devices(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(min_value=0, max_value=7))):
        attributes: dict[str, Any] = {"index": {"int": i}}
        if draw(st.booleans()):
            attributes["root"] = {"string": draw(_VALUES)}
        attributes["numa"] = {"string": draw(_VALUES)}
        device: dict[str, Any] = {"name": f"gpu-{i}", "attributes": attributes}
        if draw(st.integers(min_value=0, max_value=5)) == 0:
            device["taints"] = [{"key": "bad", "effect": "NoSchedule"}]
        if draw(st.integers(min_value=0, max_value=4)) == 0:  # shared by several claims
            device["allowMultipleAllocations"] = True
            device["capacity"] = {"memory": {"value": str(draw(st.integers(min_value=1, max_value=4)))}}
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
            body["capacity"] = {"requests": {"memory": str(draw(st.integers(min_value=1, max_value=3)))}}
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


@settings(max_examples=int(__import__("os").environ.get("FEAS_EXAMPLES", "200")))
@given(devices=_devices(), claim=_claims(), held=st.sets(st.integers(min_value=0, max_value=7)))
def test_the_check_never_changes_what_the_search_answers(
    devices: list[dict[str, Any]], claim: ResourceClaim, held: set[int]
) -> None:
    index = SliceIndex([_slice(devices)])
    gates = FeatureGates.from_mapping({"DRADeviceTaints": True})

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
