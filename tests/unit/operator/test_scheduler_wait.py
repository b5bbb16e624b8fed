"""The claim reconciler beside kube-scheduler: it allocates devices the waiting pods cannot reach,
and when there are none it waits, says so once (a condition and one Event), and allocates as soon
as the pods are placed; the allocation's wait is measured by reason.

The API here is a stand-in object with the few KubeApi methods allocation calls (no server): pods
and their claims are fed to the model as the watches would.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from dra_operator.base.settings import Settings
from dra_operator.claims.coordinator import ClaimReconciler
from dra_operator.claims.status import CONDITION_ANNOTATION
from dra_operator.model.cluster import ClaimKey, ClusterModel
from dra_operator.model.metrics import Metrics
from dra_operator.planner import PlannerPlacer
from dra_operator.scheduler import waits as schedulerwait
from dra_operator.scheduler.waits import WAITING_REASON

from . import helpers as h
from .test_contention import pod, pod_claim

KEY = ClaimKey("ns", "c")


class ClaimApi:
    api_version = "resource.k8s.io/v1"
    taint_rule_version: str | None = None  # no DeviceTaintRules: claims only give way

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.meta_patches = 0

    def _bump(self, name: str) -> dict[str, Any]:
        obj = self.objects[name]
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(obj)

    async def patch_claim(self, *, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.meta_patches += 1
        meta = self.objects[name]["metadata"]
        meta["finalizers"] = body["metadata"]["finalizers"]
        for k, v in (body["metadata"].get("annotations") or {}).items():
            annotations = meta.setdefault("annotations", {})
            if v is None:
                annotations.pop(k, None)
            else:
                annotations[k] = v
        return self._bump(name)

    async def patch_claim_status(self, *, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.objects[name]["status"] = body["status"]
        return self._bump(name)

    async def post_event(self, **event: Any) -> None:
        self.events.append(event)

    async def get_claim(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(name))


def _setup(nodes: dict[str, int]) -> tuple[ClaimReconciler, ClusterModel, ClaimApi, Metrics]:
    api = ClaimApi()
    model = ClusterModel()
    model.upsert_class(h.gpu_class())
    for name, gpus in nodes.items():
        model.upsert_node(h.node(name))
        model.upsert_slice(h.gpu_slice(name, gpus))
    metrics = Metrics()
    reconciler = ClaimReconciler(
        model=model,
        placer=PlannerPlacer(policy="first-fit", prefer_last_devices=True),
        api=api,  # type: ignore[arg-type]  # the KubeApi methods allocation uses
        settings=Settings(gpu_class=h.GPU),
        metrics=metrics,
    )
    metrics.attach_model(model, reconciler.failing, reconciler.waiting)
    reconciler.synced.set()
    return reconciler, model, api, metrics


def _add_claim(reconciler: ClaimReconciler, api: ClaimApi, obj: dict[str, Any]) -> None:
    api.objects[obj["metadata"]["name"]] = copy.deepcopy(obj)
    reconciler.on_claim_event(obj, deleted=False)


def _waiting_pods(reconciler: ClaimReconciler, model: ClusterModel, count: int) -> None:
    for i in range(count):
        reconciler.on_claim_event(pod_claim(f"p{i}-gpu", pod_name=f"p{i}"), deleted=False)
        model.upsert_pod(pod(f"p{i}", claims=(f"p{i}-gpu",)))
    reconciler.on_pod_change()


def _devices(model: ClusterModel, key: ClaimKey) -> list[str]:
    allocation = model.claims[key].status.allocation
    return [f"{r.pool}/{r.device}" for r in allocation.devices] if allocation else []


def _wait_count(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "dra_operator_allocation_wait_seconds_count", {"reason": reason}
    )
    return value or 0.0


async def _worker(reconciler: ClaimReconciler) -> asyncio.Future[Any]:
    """The claim worker and the Event poster; cancel the result to stop both."""
    return asyncio.gather(reconciler.run(), reconciler.events.run())


async def _until(predicate: Any, *, within: float = 5.0) -> None:
    for _ in range(int(within / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_with_pods_waiting_it_takes_a_device_they_cannot_reach_at_once() -> None:
    # n1 has 3 GPUs, n2 has 8: first-fit would take n1/gpu-2 with 2 free ahead, short of one pod
    # plus the headroom (3); the spread placement's n2/gpu-7 has 7 ahead.
    reconciler, model, api, metrics = _setup({"n1": 3, "n2": 8})
    _waiting_pods(reconciler, model, 1)
    _add_claim(reconciler, api, h.claim("c"))
    worker = await _worker(reconciler)
    try:
        await reconciler.drain()
    finally:
        worker.cancel()
    assert _devices(model, KEY) == ["n2/gpu-7"]
    # Nothing said about waiting: it did not wait (its Allocated Event may be posted already).
    assert [e["reason"] for e in api.events if e["reason"] != "Allocated"] == []
    assert reconciler.waiting() == frozenset()
    assert _wait_count(metrics, "none") == 1
    assert _wait_count(metrics, "scheduler_busy") == 0


async def test_without_pods_waiting_it_keeps_its_own_placement() -> None:
    reconciler, model, api, _ = _setup({"n1": 3, "n2": 8})
    _add_claim(reconciler, api, h.claim("c"))
    worker = await _worker(reconciler)
    try:
        await reconciler.drain()
    finally:
        worker.cancel()
    assert _devices(model, KEY) == ["n1/gpu-2"]


async def test_while_pods_keep_coming_it_leaves_room_for_one_it_has_not_seen_yet() -> None:
    # A pod was waiting a moment ago and is placed now: none waits, but the next may already be
    # at kube-scheduler before the operator hears of it. n1/gpu-2 has 2 free ahead, short of that
    # pod plus the headroom (3); n2/gpu-7 has 7.
    reconciler, model, api, _ = _setup({"n1": 3, "n2": 8})
    model.upsert_pod(pod("p0", templates=1))
    reconciler.on_pod_change()
    model.upsert_pod(pod("p0", node="n9"))
    reconciler.on_pod_change()
    assert not model.unscheduled
    _add_claim(reconciler, api, h.claim("c"))
    worker = await _worker(reconciler)
    try:
        await reconciler.drain()
    finally:
        worker.cancel()
    assert _devices(model, KEY) == ["n2/gpu-7"]


async def test_a_crowded_claim_waits_says_so_once_and_goes_when_the_pods_are_placed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(schedulerwait, "RECHECK_DELAY_S", 0.01)
    reconciler, model, api, metrics = _setup({"n1": 4, "n2": 4})
    _waiting_pods(reconciler, model, 2)  # 2 pods + headroom 2 = 4 ahead needed: no device has that
    _add_claim(reconciler, api, h.claim("c"))
    worker = await _worker(reconciler)
    try:
        await _until(lambda: KEY in reconciler.waiting() and api.events)
        await reconciler.events.flush()
        (event,) = api.events
        assert (event["type_"], event["reason"]) == ("Normal", WAITING_REASON)
        assert "kube-scheduler is placing 2 pods" in event["message"]
        assert "tries again whenever those pods, their claims or the devices change" in event["message"]
        condition = json.loads(model.claims[KEY].metadata.annotations[CONDITION_ANNOTATION])
        assert (condition["status"], condition["reason"]) == ("False", WAITING_REASON)
        assert condition["message"] == event["message"]
        assert model.claims[KEY].status.allocation is None
        assert (
            metrics.registry.get_sample_value("dra_operator_claims", {"state": "waiting_for_scheduler"}) == 1
        )
        assert metrics.registry.get_sample_value("dra_operator_claims", {"state": "unallocatable"}) == 0
        assert reconciler.longest_wait() > 0

        # Pods change but still crowd it: placed again, nothing said again.
        patches = api.meta_patches
        model.upsert_pod(pod("p1", claims=("p1-gpu",)))
        reconciler.on_pod_change()
        await asyncio.sleep(0.1)
        assert KEY in reconciler.waiting()
        assert api.meta_patches == patches
        assert len(api.events) == 1

        # kube-scheduler places one pod: 1 pod + headroom 2 = 3 ahead, which the last GPUs have.
        placed = pod_claim("p0-gpu", pod_name="p0")
        placed["metadata"]["resourceVersion"] = "2"
        placed["status"] = {"allocation": h.allocation("n1", "gpu-0")}
        reconciler.on_claim_event(placed, deleted=False)
        model.upsert_pod(pod("p0", claims=("p0-gpu",), node="n1"))
        reconciler.on_pod_change()
        await _until(lambda: model.claims[KEY].status.allocation is not None)
        await reconciler.drain()
    finally:
        worker.cancel()
    assert _devices(model, KEY) == ["n2/gpu-3"]
    # The condition is gone with the allocation, and the wait was counted as kube-scheduler's.
    assert CONDITION_ANNOTATION not in model.claims[KEY].metadata.annotations
    assert reconciler.waiting() == frozenset()
    assert reconciler.longest_wait() == 0
    assert _wait_count(metrics, "scheduler_busy") == 1
    assert _wait_count(metrics, "none") == 0


async def test_parked_pods_count_only_for_a_while_after_devices_are_freed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(schedulerwait, "RECHECK_DELAY_S", 0.01)
    monkeypatch.setattr(schedulerwait, "PARKED_RETRY_WINDOW_S", 0.5)
    reconciler, model, api, _ = _setup({"n1": 4})
    # Two parked pods: kube-scheduler tried them and found them unschedulable.
    for i in range(2):
        reconciler.on_claim_event(pod_claim(f"p{i}-gpu", pod_name=f"p{i}"), deleted=False)
        model.upsert_pod(pod(f"p{i}", claims=(f"p{i}-gpu",), parked=True))
    worker = await _worker(reconciler)
    try:
        # Nothing freed lately: they stay parked, and the claim goes at once.
        _add_claim(reconciler, api, h.claim("first"))
        await _until(lambda: model.claims[ClaimKey("ns", "first")].status.allocation is not None)
        # A claim holding a device goes away: the parked pods get another try, and the next claim
        # waits for them until the window after that change has passed.
        held = h.claim("held", allocation=h.allocation("n1", "gpu-0"))
        reconciler.on_claim_event(held, deleted=False)
        reconciler.on_claim_event(held, deleted=True)
        _add_claim(reconciler, api, h.claim("c"))
        await _until(lambda: KEY in reconciler.waiting())
        assert model.claims[KEY].status.allocation is None
        await _until(lambda: model.claims[KEY].status.allocation is not None, within=5.0)
    finally:
        worker.cancel()
    assert _devices(model, KEY) == ["n1/gpu-2"]


async def test_a_waiting_claim_allocated_by_someone_else_stops_waiting() -> None:
    reconciler, model, api, metrics = _setup({"n1": 4})
    _waiting_pods(reconciler, model, 2)
    _add_claim(reconciler, api, h.claim("c"))
    worker = await _worker(reconciler)
    try:
        await _until(lambda: KEY in reconciler.waiting())
        # A user (or another allocator) writes an allocation: the claim no longer waits, and the
        # gauge of the longest wait, which an alert watches, does not keep growing.
        other = copy.deepcopy(api.objects["c"])
        other["metadata"]["resourceVersion"] = str(int(other["metadata"]["resourceVersion"]) + 1)
        other["status"] = {"allocation": h.allocation("n1", "gpu-3")}
        reconciler.on_claim_event(other, deleted=False)
        assert reconciler.waiting() == frozenset()
        assert reconciler.longest_wait() == 0
        assert (
            metrics.registry.get_sample_value("dra_operator_claims", {"state": "waiting_for_scheduler"}) == 0
        )
    finally:
        worker.cancel()
