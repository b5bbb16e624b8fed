"""What kube-scheduler's waiting pods could take, and whether a device the operator picked lies
beyond their reach (front-of-slice for kube-scheduler, back for the operator)."""

from __future__ import annotations

from typing import Any

from dra_api.model import AllocationResult
from dra_operator.base.settings import Ownership
from dra_operator.model.cluster import ClusterModel
from dra_operator.scheduler.contention import NO_DEMAND, Clearance, scheduler_demand

from . import helpers as h

CLASSES = (h.GPU,)


def pod(
    name: str,
    *,
    claims: tuple[str, ...] = (),
    templates: int = 0,
    node: str = "",
    parked: bool = False,
) -> dict[str, Any]:
    """A pod using ``claims`` (generated from templates, named in its status) and ``templates``
    more template entries whose claims are not made yet."""
    refs = [{"name": f"c{i}", "resourceClaimTemplateName": "t"} for i in range(len(claims) + templates)]
    status: dict[str, Any] = {
        "phase": "Pending",
        "resourceClaimStatuses": [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)],
    }
    if parked:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"nodeName": node, "resourceClaims": refs},
        "status": status,
    }


def pod_claim(
    name: str, *, count: int = 1, pod_name: str = "p", selector: str | None = None
) -> dict[str, Any]:
    obj = h.claim(name, count=count, owner_pod=True, selector=selector)
    obj["metadata"]["ownerReferences"][0]["name"] = pod_name
    return obj


def model_with(*, nodes: dict[str, int]) -> ClusterModel:
    model = ClusterModel()
    model.upsert_class(h.gpu_class())
    for name, gpus in nodes.items():
        model.upsert_node(h.node(name))
        model.upsert_slice(h.gpu_slice(name, gpus))
    return model


def allocation(node: str, *devices: str) -> AllocationResult:
    return AllocationResult.from_json(h.allocation(node, *devices))


def demand_of(model: ClusterModel, *, parked: bool = True) -> Any:
    return scheduler_demand(model, ownership=Ownership.STANDALONE, classes=CLASSES, parked=parked)


def test_demand_counts_claims_of_pods_kube_scheduler_has_yet_to_place() -> None:
    model = model_with(nodes={"n1": 8})
    model.upsert_claim(pod_claim("p-a", count=2, pod_name="a"))
    model.upsert_pod(pod("a", claims=("p-a",)))
    model.upsert_claim(pod_claim("p-b", pod_name="b", selector="device.attributes['type'].string == 'gpu'"))
    model.upsert_pod(pod("b", claims=("p-b",)))
    # Not counted: a bound pod, a standalone claim (the operator's own) a pod names, an allocated one.
    model.upsert_claim(pod_claim("p-c", pod_name="c"))
    model.upsert_pod(pod("c", claims=("p-c",), node="n1"))
    model.upsert_claim(h.claim("mine"))
    model.upsert_pod(pod("d", claims=("mine",)))
    allocated = pod_claim("p-e", pod_name="e")
    allocated["status"] = {"allocation": h.allocation("n1", "gpu-0")}
    model.upsert_claim(allocated)
    model.upsert_pod(pod("e", claims=("p-e",)))
    demand = demand_of(model)
    assert demand.pods == 2
    assert sorted((count, n) for (_, count, _), n in demand.requests.items()) == [(1, 1), (2, 1)]
    assert demand.unknown == 0


def test_demand_counts_what_the_operator_has_not_seen_yet() -> None:
    model = model_with(nodes={"n1": 8})
    # A pod whose template claim is not made yet, and one naming a claim the model lacks.
    model.upsert_pod(pod("a", templates=1))
    model.upsert_pod(pod("b", claims=("not-seen",)))
    # A claim made for a pod the pod watch has not brought yet.
    model.upsert_claim(pod_claim("p-c", pod_name="c"))
    demand = demand_of(model)
    assert (demand.pods, demand.unknown) == (3, 2)
    assert sum(demand.requests.values()) == 1


def test_claims_still_missing_long_after_the_pod_was_made_do_not_count() -> None:
    # A pod naming a template that does not exist never gets its claim: kube-scheduler cannot place
    # it either, so after a while it stops counting.
    model = model_with(nodes={"n1": 8})
    old = pod("a", templates=1)
    old["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    model.upsert_pod(old)
    made = 1767225600.0  # 2026-01-01T00:00:00Z
    young = scheduler_demand(model, ownership=Ownership.STANDALONE, classes=CLASSES, now=made + 5)
    assert (young.pods, young.unknown) == (1, 1)
    later = scheduler_demand(model, ownership=Ownership.STANDALONE, classes=CLASSES, now=made + 60)
    assert later.empty


def test_parked_pods_count_only_when_asked() -> None:
    model = model_with(nodes={"n1": 8})
    model.upsert_claim(pod_claim("p-a", pod_name="a"))
    model.upsert_pod(pod("a", claims=("p-a",), parked=True))
    assert demand_of(model, parked=True).pods == 1
    assert demand_of(model, parked=False).empty
    model.remove_pod(namespace="ns", name="a")
    assert model.unscheduled == {}


def test_the_last_device_of_a_roomy_slice_is_clear_the_first_ones_are_not() -> None:
    model = model_with(nodes={"n1": 8})
    model.upsert_claim(pod_claim("p-a", pod_name="a"))
    model.upsert_pod(pod("a", claims=("p-a",)))
    demand = demand_of(model)
    clearance = Clearance()
    # One pod could take one device; with a headroom of 2, three free devices must be ahead.
    assert (
        clearance.crowded(model=model, allocation=allocation("n1", "gpu-7"), demand=demand, headroom=2)
        is None
    )
    assert (
        clearance.crowded(model=model, allocation=allocation("n1", "gpu-3"), demand=demand, headroom=2)
        is None
    )
    crowded = clearance.crowded(model=model, allocation=allocation("n1", "gpu-2"), demand=demand, headroom=2)
    assert crowded is not None
    assert (crowded.device, crowded.ahead, crowded.needed, crowded.pods) == (
        ("gpu.nvidia.com", "n1", "gpu-2"),
        2,
        3,
        1,
    )
    # Devices ahead that are held do not shield it.
    model.upsert_claim(h.claim("held", allocation=h.allocation("n1", "gpu-0", "gpu-1")))
    crowded = clearance.crowded(model=model, allocation=allocation("n1", "gpu-3"), demand=demand, headroom=2)
    assert crowded is not None
    assert crowded.ahead == 1
    # Nobody waiting: anything goes.
    assert (
        clearance.crowded(model=model, allocation=allocation("n1", "gpu-2"), demand=NO_DEMAND, headroom=2)
        is None
    )


def test_a_request_that_cannot_fit_on_the_node_does_not_count() -> None:
    model = model_with(nodes={"n1": 8, "n2": 8})
    model.upsert_claim(h.claim("held", allocation=h.allocation("n1", "gpu-0", "gpu-1")))
    # Six GPUs free on n1: a pod wanting seven cannot go there (with a headroom of 0), but can go to n2.
    model.upsert_claim(pod_claim("p-big", count=7, pod_name="big"))
    model.upsert_pod(pod("big", claims=("p-big",)))
    demand = demand_of(model)
    clearance = Clearance()
    assert (
        clearance.crowded(model=model, allocation=allocation("n1", "gpu-3"), demand=demand, headroom=0)
        is None
    )
    # On n2 it would take gpu-0 to gpu-6: gpu-7 is clear, gpu-6 is not.
    assert (
        clearance.crowded(model=model, allocation=allocation("n2", "gpu-7"), demand=demand, headroom=0)
        is None
    )
    crowded = clearance.crowded(model=model, allocation=allocation("n2", "gpu-6"), demand=demand, headroom=0)
    assert crowded is not None
    assert (crowded.ahead, crowded.needed) == (6, 7)
    # With a headroom of 1 kube-scheduler may see one more free on n1: then it could fit there.
    assert (
        clearance.crowded(model=model, allocation=allocation("n1", "gpu-7"), demand=demand, headroom=1)
        is not None
    )


def test_requests_that_cannot_use_the_device_do_not_count() -> None:
    model = model_with(nodes={"n1": 4})
    model.upsert_claim(pod_claim("p-a", pod_name="a", selector="device.attributes['index'].int < 2"))
    model.upsert_pod(pod("a", claims=("p-a",)))
    demand = demand_of(model)
    clearance = Clearance()
    # gpu-2 and gpu-3 are not among what the pod's selector allows: only the headroom must be ahead.
    assert (
        clearance.crowded(model=model, allocation=allocation("n1", "gpu-2"), demand=demand, headroom=1)
        is None
    )
    # gpu-1 is: of the devices ahead only those the pod could take count (gpu-0), one short.
    crowded = clearance.crowded(model=model, allocation=allocation("n1", "gpu-1"), demand=demand, headroom=1)
    assert crowded is not None
    assert (crowded.ahead, crowded.needed) == (1, 2)


def test_a_pod_taking_all_matching_devices_rules_out_its_node() -> None:
    model = model_with(nodes={"n1": 4})
    claim = pod_claim("p-all", pod_name="a")
    claim["spec"]["devices"]["requests"][0]["exactly"] = {"deviceClassName": h.GPU, "allocationMode": "All"}
    model.upsert_claim(claim)
    model.upsert_pod(pod("a", claims=("p-all",)))
    crowded = Clearance().crowded(
        model=model, allocation=allocation("n1", "gpu-3"), demand=demand_of(model), headroom=0
    )
    assert crowded is not None


def shared_slice(node: str, memories: list[int]) -> dict[str, Any]:
    """GPUs published as shares (``--consumable-shares=memory``), with ``memories`` GiB each."""
    obj = h.gpu_slice(node, len(memories))
    for device, gib in zip(obj["spec"]["devices"], memories, strict=True):
        device["allowMultipleAllocations"] = True
        device["capacity"] = {
            "memory": {
                "value": f"{gib}Gi",
                "requestPolicy": {
                    "default": f"{gib}Gi",
                    "validRange": {"min": "1Mi", "max": f"{gib}Gi", "step": "1Mi"},
                },
            }
        }
    return obj


def share(
    node: str, device: str, memory: str, *, share_id: str = "0b8e0c52-5d7d-4c6e-9a51-3c2f1e0d9a01"
) -> Any:
    raw = h.allocation(node, device)
    raw["devices"]["results"][0]["shareID"] = share_id
    raw["devices"]["results"][0]["consumedCapacity"] = {"memory": memory}
    return raw


def test_a_share_gives_way_like_a_device_and_only_unheld_roomy_devices_ahead_shield_it() -> None:
    model = ClusterModel()
    model.upsert_class(h.gpu_class())
    model.upsert_node(h.node("n1"))
    model.upsert_slice(shared_slice("n1", [80, 80, 80, 80]))
    model.upsert_claim(pod_claim("p-a", pod_name="a"))
    model.upsert_pod(pod("a", claims=("p-a",)))
    demand = demand_of(model)
    clearance = Clearance()
    mine = AllocationResult.from_json(share("n1", "gpu-3", "10Gi"))
    # One pod, a headroom of 2: three unheld devices ahead of gpu-3 shield the share.
    assert clearance.crowded(model=model, allocation=mine, demand=demand, headroom=2) is None
    on_two = AllocationResult.from_json(share("n1", "gpu-2", "10Gi"))
    crowded = clearance.crowded(model=model, allocation=on_two, demand=demand, headroom=2)
    assert crowded is not None
    assert (crowded.ahead, crowded.needed) == (2, 3)
    # A device ahead holding a share (room left or not) no longer shields it: kube-scheduler may
    # give a share of it or pass on to gpu-3.
    other = h.claim(
        "held", allocation=share("n1", "gpu-0", "70Gi", share_id="6f1c3b2a-0e4d-4b5a-8c7d-9e0f1a2b3c4d")
    )
    model.upsert_claim(other)
    crowded = clearance.crowded(model=model, allocation=mine, demand=demand, headroom=2)
    assert crowded is not None
    assert crowded.ahead == 2


def test_a_share_counts_requests_that_look_too_big_for_the_node_and_smaller_devices_do_not_shield_it() -> (
    None
):
    model = ClusterModel()
    model.upsert_class(h.gpu_class())
    model.upsert_node(h.node("n1"))
    # Three 40 GiB GPUs ahead of an 80 GiB one: a share that fits the last may not fit them.
    model.upsert_slice(shared_slice("n1", [40, 40, 40, 80]))
    model.upsert_claim(pod_claim("p-big", count=7, pod_name="big"))
    model.upsert_pod(pod("big", claims=("p-big",)))
    mine = AllocationResult.from_json(share("n1", "gpu-3", "10Gi"))
    crowded = Clearance().crowded(model=model, allocation=mine, demand=demand_of(model), headroom=0)
    assert crowded is not None
    assert (crowded.ahead, crowded.needed) == (0, 7)
