"""Property-based tests of what the operator does with any claim a tenant can write.

Whatever the claim says (names, counts, selectors, constraints, subrequests, configs, each valid,
odd or broken), the model takes it or records it as invalid with a reason, the claim checks answer
in one line, and a placement within a small budget ends with an answer: nothing raises, nothing
hangs, no message spans two lines (a tenant's text cannot forge a log line or an Event's).
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from dra_api.model import DeviceClass, Node, ResourceClaim, ResourceSlice
from dra_operator.cel import WorkBudget
from dra_operator.claims.claimchecks import validate_claim
from dra_operator.model.cluster import ClusterModel, InvalidClaim
from dra_operator.planner import NotPlaced, OutOfBudget, PlanError, Planned, Planner

from . import helpers as h

_TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)


def _mostly(good: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` nine times in ten, ``odd`` the tenth: most claims get as far as the planner."""
    return st.integers(min_value=0, max_value=9).flatmap(lambda i: odd if i == 0 else good)


_NAMES = _mostly(st.sampled_from(["gpu", "a", "b", "r0", "r1"]), _TEXT)
_SELECTORS = st.one_of(
    st.sampled_from(
        [
            'device.driver == "gpu.nvidia.com"',
            'device.attributes["gpu.nvidia.com"].index >= 1',
            'device.attributes["gpu.nvidia.com"].missing == 1',
            'device.attributes["gpu.nvidia.com"].all(k, k != "x")',
            "lists.range(1000).all(i, lists.range(1000).all(j, true))",
            "1 / 0 == 1",
            "true &&",
            "",
        ]
    ),
    _TEXT,
)
_COUNTS = _mostly(
    st.one_of(st.integers(min_value=1, max_value=6), st.none()),
    st.one_of(st.integers(min_value=-3, max_value=40), st.just(2**40), _TEXT),
)


@st.composite
def _exact(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "deviceClassName": draw(_mostly(st.just(h.GPU), st.sampled_from(["missing", ""])))
    }
    mode = draw(_mostly(st.sampled_from([None, "ExactCount", "All"]), st.just("Bogus")))
    if mode is not None:
        body["allocationMode"] = mode
    count = draw(_COUNTS)
    if count is not None:
        body["count"] = count
    selectors = draw(st.lists(_SELECTORS, max_size=3))
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if draw(st.booleans()):
        body["tolerations"] = [
            {"key": draw(_TEXT), "operator": draw(st.sampled_from(["Exists", "Equal", "?"]))}
        ]
    if draw(st.integers(min_value=0, max_value=5)) == 0:
        body["capacity"] = {"requests": {"memory": draw(st.sampled_from(["1Gi", "-1", "x", "1e100"]))}}
    return body


@st.composite
def _claims(draw: st.DrawFn) -> dict[str, Any]:
    requests: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        name = draw(_NAMES)
        if draw(st.integers(min_value=0, max_value=3)) == 0:
            subs = [{"name": draw(_NAMES), **draw(_exact())} for _ in range(draw(st.integers(0, 3)))]
            requests.append({"name": name, "firstAvailable": subs})
        elif draw(st.integers(min_value=0, max_value=9)) == 0:
            requests.append({"name": name})  # neither exactly nor firstAvailable
        else:
            requests.append({"name": name, "exactly": draw(_exact())})
    constraints = [
        {
            "requests": draw(st.lists(_NAMES, max_size=3)),
            draw(_mostly(st.sampled_from(["matchAttribute", "distinctAttribute"]), st.just("bogus"))): draw(
                st.sampled_from(["gpu.nvidia.com/index", "gpu.nvidia.com/type", "x", ""])
            ),
        }
        for _ in range(draw(st.integers(min_value=0, max_value=2)))
    ]
    configs = [
        {
            "opaque": {
                "driver": draw(st.sampled_from([h.GPU, "fpga.example.com", ""])),
                "parameters": {"k": draw(_TEXT)},
            }
        }
        for _ in range(draw(st.integers(min_value=0, max_value=2)))
    ]
    obj = h.claim("c", namespace="ns")
    obj["spec"]["devices"] = {"requests": requests, "constraints": constraints, "config": configs}
    return obj


_VERSIONS = itertools.count(10)


def _model() -> ClusterModel:
    model = ClusterModel()
    model.upsert_class(h.gpu_class())
    model.upsert_node(h.node("n1"))
    model.upsert_slice(h.gpu_slice("n1", 4))
    return model


@settings(max_examples=300)
@given(obj=_claims())
def test_any_claim_is_taken_or_refused_with_one_line(obj: dict[str, Any]) -> None:
    model = _model()
    obj["metadata"]["resourceVersion"] = str(next(_VERSIONS))
    taken = model.upsert_claim(obj)
    if isinstance(taken, InvalidClaim):
        event("refused by the model")
        assert taken.message
        return
    event("taken by the model")
    assert isinstance(taken, ResourceClaim)
    refused = validate_claim(taken, known_drivers={h.GPU}, compiler=None)
    if refused is not None:
        assert "\n" not in refused.message
    planner = Planner(
        classes=[DeviceClass.from_json(h.gpu_class())],
        slices=[ResourceSlice.from_json(h.gpu_slice("n1", 4))],
        nodes=[Node.make("n1")],
    )
    outcome = planner.plan([taken], budget=WorkBudget(2.0))
    event(type(outcome).__name__)
    assert isinstance(outcome, Planned | NotPlaced | PlanError | OutOfBudget)
    if isinstance(outcome, NotPlaced | OutOfBudget):
        assert "\n" not in outcome.explanation.short
        assert len(outcome.explanation.short) <= 1024
    if isinstance(outcome, PlanError):
        assert outcome.message
