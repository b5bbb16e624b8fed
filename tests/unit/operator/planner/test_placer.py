"""PlannerPlacer: the operator's Placer protocol over a ClusterModel, kept in step with it."""

from __future__ import annotations

from dra_api.model import ResourceClaim
from dra_operator.model.cluster import ClaimKey, ClusterModel
from dra_operator.planner import EVENT_MESSAGE_LIMIT, PlannerPlacer
from dra_operator.planner.placement import Placement, Placer, Unallocatable
from tests.unit.operator.planner.builders import (
    allocation,
    claim,
    device_class,
    gpus,
    node,
    node_slice,
    request,
)


def _model() -> ClusterModel:
    model = ClusterModel()
    model.upsert_class(device_class())
    for name, count in (("n1", 2), ("n2", 4)):
        model.upsert_node(node(name))
        model.upsert_slice(node_slice(name, gpus(name, count)))
    return model


def _claim(name: str, count: int = 1) -> ResourceClaim:
    return ResourceClaim.from_json(claim(name, request(count=count)))


def test_is_a_placer_and_follows_assumed_written_and_removed_allocations() -> None:
    model = _model()
    for name in ("a", "b"):  # the reconciler places claims the model already holds
        model.upsert_claim(claim(name, request(count=2)))
    placer: Placer = PlannerPlacer(policy="bin-pack")
    first = placer.place(claims=[_claim("a", 2)], model=model)
    assert isinstance(first, Placement)
    assert first.node == "n1"  # bin-pack: the node with 2 free is the tightest fit
    model.assume(ClaimKey("default", "a"), first.allocations[0])
    second = placer.place(claims=[_claim("b", 2)], model=model)
    assert isinstance(second, Placement)
    assert second.node == "n2"
    # b is written back by the server: the model holds it as an allocated claim
    written = claim("b", request(count=2), allocation=allocation("n2", "gpu-0", "gpu-1"))
    written["metadata"]["resourceVersion"] = "5"
    model.upsert_claim(written)
    third = placer.place(claims=[_claim("c", 3)], model=model)
    assert isinstance(third, Unallocatable)
    assert third.reason == "NoFit"
    assert len(third.message) <= EVENT_MESSAGE_LIMIT
    assert "needs 3" in third.message
    model.forget_assumed(ClaimKey("default", "a"))
    model.remove_claim(ClaimKey("default", "b"))
    fourth = placer.place(claims=[_claim("c", 3)], model=model)
    assert isinstance(fourth, Placement)
    assert fourth.node == "n2"


def test_new_slices_are_seen_after_a_model_change() -> None:
    model = _model()
    placer = PlannerPlacer()
    assert isinstance(placer.place(claims=[_claim("a", 6)], model=model), Unallocatable)
    model.upsert_node(node("n3"))
    model.upsert_slice(node_slice("n3", gpus("n3", 8)))
    outcome = placer.place(claims=[_claim("a", 6)], model=model)
    assert isinstance(outcome, Placement)
    assert outcome.node == "n3"


def test_errors_keep_their_reason() -> None:
    outcome = PlannerPlacer().place(
        claims=[ResourceClaim.from_json(claim("x", request(cls="missing")))], model=_model()
    )
    assert isinstance(outcome, Unallocatable)
    assert outcome.reason == "DeviceClassNotFound"


def test_a_device_two_claims_hold_stays_taken_until_both_release_it() -> None:
    # Two allocators racing (kube-scheduler and the operator), or a holder whose deletion the model
    # has not seen yet, leave one device in two claims. Releasing one of them (the operator gives
    # up its copy) must not make the device free while the other still holds it: a placer that
    # offered it again would be told "taken" forever (the livelock of issue 18).
    model = _model()
    placer = PlannerPlacer(policy="first-fit")
    for name, rv, devices in (("a", "5", ("gpu-0",)), ("c", "6", ("gpu-0",)), ("b", "7", ("gpu-1",))):
        written = claim(name, request(), allocation=allocation("n1", *devices))
        written["metadata"]["resourceVersion"] = rv
        model.upsert_claim(written)
    assert placer.disagreements(model) == []
    released = claim("c", request())
    released["metadata"]["resourceVersion"] = "8"
    model.upsert_claim(released)
    assert placer.disagreements(model) == []
    outcome = placer.place(claims=[ResourceClaim.from_json(released)], model=model)
    assert isinstance(outcome, Placement)
    chosen = [r.device_id for r in outcome.allocations[0].devices]
    assert chosen[0][1] == "n2"  # n1's two GPUs are both held (gpu-0 by a, gpu-1 by b)
    assert model.taken_by_others(ClaimKey("default", "c"), outcome.allocations[0]) == {}
    # The other holder goes too: now gpu-0 is free.
    model.remove_claim(ClaimKey("default", "a"))
    assert placer.disagreements(model) == []
    assert placer.planner_for(model).index.holder_counts() == {("gpu.nvidia.com", "n1", "gpu-1"): 1}


def test_disagreements_name_the_device_and_a_rebuild_repairs_them() -> None:
    model = _model()
    written = claim("a", request(), allocation=allocation("n1", "gpu-0"))
    written["metadata"]["resourceVersion"] = "5"
    model.upsert_claim(written)
    placer = PlannerPlacer()
    planner = placer.planner_for(model)
    planner.note_released(model.holding_allocations()[ClaimKey("default", "a")])  # a bug, simulated
    problems = placer.disagreements(model)
    assert any("gpu.nvidia.com/n1/gpu-0" in p and "default/a" in p for p in problems), problems
    placer.rebuild()
    assert placer.disagreements(model) == []


def test_a_node_with_an_invalid_pool_is_reported_as_invalid_slices_while_others_still_serve() -> None:
    model = _model()
    model.upsert_node(node("n3"))
    broken = node_slice("n3", [*gpus("n3", 8), gpus("n3", 1)[0]])  # gpu-0 twice
    model.upsert_slice(broken)
    placer = PlannerPlacer()
    # Another node still fits a small claim: upstream only rules the invalid node out.
    assert isinstance(placer.place(claims=[_claim("small", 2)], model=model), Placement)
    # Only n3 could have held 6: the reason points at the slices, the message names pool and cause.
    big = placer.place(claims=[_claim("big", 6)], model=model)
    assert isinstance(big, Unallocatable)
    assert big.reason == "InvalidResourceSlices"
    assert "gpu.nvidia.com/n3 (duplicate device name 'gpu-0')" in big.message, big.message
