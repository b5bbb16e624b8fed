from __future__ import annotations

from dra_api.model import ResourceClaim
from dra_operator.base.settings import Settings
from dra_operator.cel import compile_selector
from dra_operator.claims.claimchecks import validate_claim
from dra_operator.claims.coordinator import ClaimReconciler
from dra_operator.model.cluster import ClaimKey, ClusterModel
from dra_operator.model.metrics import Metrics
from dra_operator.planner import PlannerPlacer
from dra_operator.planner.placement import Placement, Unallocatable
from tests.unit.operator.helpers import allocation, claim, gpu_class, gpu_slice, node


def _model(*nodes: tuple[str, int]) -> ClusterModel:
    model = ClusterModel()
    model.upsert_class(gpu_class())
    for name, count in nodes:
        model.upsert_node(node(name))
        model.upsert_slice(gpu_slice(name, count))
    return model


def test_places_on_a_node_with_enough_free_devices() -> None:
    model = _model(("n1", 2), ("n2", 4))
    model.upsert_claim(claim("busy", allocation=allocation("n2", "gpu-0")))
    result = PlannerPlacer(prefer_last_devices=True).place(
        claims=[ResourceClaim.from_json(claim("a", count=3))], model=model
    )
    assert isinstance(result, Placement)
    assert result.node == "n2"
    devices = {r.device for r in result.allocations[0].devices}
    assert len(devices) == 3
    assert "gpu-0" not in devices


def test_count_larger_than_any_node_is_explained() -> None:
    model = _model(("n1", 2), ("n2", 4))
    result = PlannerPlacer(prefer_last_devices=True).place(
        claims=[ResourceClaim.from_json(claim("a", count=5))], model=model
    )
    assert isinstance(result, Unallocatable)
    assert result.reason == "NoFit"
    assert "wants 5 of class gpu.nvidia.com" in result.message
    assert "most free on one node: 4" in result.message


def test_unknown_class_is_named() -> None:
    model = _model(("n1", 2))
    result = PlannerPlacer(prefer_last_devices=True).place(
        claims=[ResourceClaim.from_json(claim("a", cls="nope"))], model=model
    )
    assert isinstance(result, Unallocatable)
    assert result.reason == "DeviceClassNotFound"
    assert "device class nope not found" in result.message


def test_invalid_request_selector_is_named_with_its_field_and_error() -> None:
    model = _model(("n1", 2))
    bad = ResourceClaim.from_json(claim("a", selector="device.driver ==="))
    # The allocator refuses it too; validation names the field and the expression.
    assert isinstance(PlannerPlacer(prefer_last_devices=True).place(claims=[bad], model=model), Unallocatable)
    why = validate_claim(bad, known_drivers={"gpu.nvidia.com"}, compiler=compile_selector)
    assert why is not None
    assert why.reason == "InvalidSelector"
    assert "spec.devices.requests[0].exactly.selectors[0].cel.expression 'device.driver ==='" in why.message


def test_opaque_config_for_unknown_driver_is_refused() -> None:
    bad = ResourceClaim.from_json(claim("a", config_driver="fpga.example.com"))
    why = validate_claim(bad, known_drivers={"gpu.nvidia.com"})
    assert why is not None
    assert why.reason == "UnknownConfigDriver"
    assert "spec.devices.config[0].opaque.driver 'fpga.example.com'" in why.message
    assert (
        validate_claim(
            ResourceClaim.from_json(claim("b", config_driver="gpu.nvidia.com")),
            known_drivers={"gpu.nvidia.com"},
        )
        is None
    )


def test_no_fit_explains_where_devices_drop_out() -> None:
    model = _model(("n1", 2))
    other_driver = ResourceClaim.from_json(claim("a", selector='device.driver == "tpu.google.com"'))
    result = PlannerPlacer(prefer_last_devices=True).place(claims=[other_driver], model=model)
    assert isinstance(result, Unallocatable)
    assert "2 match the class, 0 match the selectors" in result.message


def test_selector_error_is_reported_even_when_no_device_is_free() -> None:
    model = _model(("n1", 1))
    model.upsert_claim(claim("busy", allocation=allocation("n1", "gpu-0")))
    broken = ResourceClaim.from_json(claim("a", selector='device.attributes["gpu.nvidia.com"].nope == "x"'))
    result = PlannerPlacer(prefer_last_devices=True).place(claims=[broken], model=model)
    assert isinstance(result, Unallocatable)
    assert result.reason == "AllocationError"
    assert "nope" in result.message


def test_drivers_known_to_the_claim_checks_follow_the_slices() -> None:
    """The known drivers are kept per model generation: a driver whose slices appear later is
    known from then on, and one whose slices all go is unknown again."""
    from dra_operator.base.settings import Settings
    from dra_operator.claims.coordinator import ClaimReconciler
    from dra_operator.model.metrics import Metrics

    model = _model(("n1", 2))
    reconciler = ClaimReconciler(
        model=model,
        placer=PlannerPlacer(prefer_last_devices=True),
        api=None,  # type: ignore[arg-type]  # assessing a claim makes no call
        settings=Settings(),
        metrics=Metrics(),
    )
    fpga = ResourceClaim.from_json(claim("a", config_driver="fpga.example.com"))
    refused = reconciler.assess(fpga)
    assert isinstance(refused, Unallocatable)
    assert refused.reason == "UnknownConfigDriver"
    fpga_slice = gpu_slice("n1", 1)
    fpga_slice["metadata"]["name"] = "n1-fpga"
    fpga_slice["spec"]["driver"] = "fpga.example.com"
    model.upsert_slice(fpga_slice)
    assert isinstance(reconciler.assess(fpga), Placement)
    model.remove_slice("n1-fpga")
    refused = reconciler.assess(fpga)
    assert isinstance(refused, Unallocatable)
    assert refused.reason == "UnknownConfigDriver"


def test_after_a_takeover_claims_waiting_for_devices_are_taken_before_those_that_hold_theirs() -> None:
    model = _model(("n1", 4))
    model.upsert_claim(claim("old-held", allocation=allocation("n1", "gpu-0")))
    model.upsert_claim(claim("new-pending"))
    deleting = claim("deleting", allocation=allocation("n1", "gpu-1"))
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:05Z"
    model.upsert_claim(deleting)
    model.upsert_claim(claim("older-pending"))
    for name, stamp in (
        ("old-held", "00"),
        ("new-pending", "09"),
        ("deleting", "05"),
        ("older-pending", "01"),
    ):
        model.claim_created[ClaimKey("ns", name)] = f"2026-01-01T00:00:{stamp}Z"
    reconciler = ClaimReconciler(
        model=model,
        placer=PlannerPlacer(prefer_last_devices=True),
        api=None,  # type: ignore[arg-type]  # nothing is written here
        settings=Settings(gpu_class="gpu.nvidia.com"),
        metrics=Metrics(),
    )
    reconciler.queue.mark_all(
        ClaimKey("ns", n) for n in ("old-held", "new-pending", "deleting", "older-pending")
    )
    taken = reconciler.queue.take(order=reconciler._urgency)
    assert [k.name for k in taken] == ["older-pending", "deleting", "new-pending", "old-held"]
