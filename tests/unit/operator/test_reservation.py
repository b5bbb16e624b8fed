"""Reserving a node for a claim that has waited too long while kube-scheduler's pods take every
device: which node, the DeviceTaintRule written, the claim placed there once a device frees, and
the rule deleted after the allocation.

The API is the stand-in of test_scheduler_wait with DeviceTaintRules added (no server): pods and
their claims are fed to the model as the watches would.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from dra_operator.allocator import SliceIndex
from dra_operator.base.settings import Settings
from dra_operator.claims.coordinator import ClaimReconciler
from dra_operator.claims.status import CONDITION_ANNOTATION
from dra_operator.claims.tell import RESERVED_REASON
from dra_operator.model.cluster import ClaimKey, ClusterModel
from dra_operator.model.metrics import Metrics
from dra_operator.planner import PlannerPlacer
from dra_operator.scheduler import reservation
from dra_operator.scheduler import waits as schedulerwait
from dra_operator.scheduler.reservation import RESERVED_FOR_LABEL, choose_target
from dra_operator.scheduler.waits import WAITING_REASON

from . import helpers as h
from .test_contention import model_with, pod, pod_claim
from .test_scheduler_wait import ClaimApi, _add_claim, _until, _worker

KEY = ClaimKey("ns", "c")


class TaintRuleApi(ClaimApi):
    taint_rule_version: str | None = "v1beta2"
    taint_rule_api_version = "resource.k8s.io/v1beta2"

    def __init__(self) -> None:
        super().__init__()
        self.rules: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []

    async def create_taint_rule(self, body: dict[str, Any]) -> None:
        self.rules[body["metadata"]["name"]] = copy.deepcopy(body)

    async def delete_taint_rule(self, name: str) -> bool:
        self.deleted.append(name)
        return self.rules.pop(name, None) is not None

    async def list_taint_rules(self, label: str) -> list[str]:
        return [n for n, r in self.rules.items() if label in r["metadata"]["labels"]]


def _held(model: ClusterModel, name: str, node: str, device: str, *, created: str) -> dict[str, Any]:
    """A pod's claim that kube-scheduler allocated ``device`` of ``node``."""
    obj = pod_claim(name, pod_name=f"pod-{name}")
    obj["metadata"]["creationTimestamp"] = created
    obj["status"] = {"allocation": h.allocation(node, device)}
    return obj


def test_the_node_whose_devices_were_held_longest_is_chosen_when_none_is_free() -> None:
    model = model_with(nodes={"n1": 2, "n2": 2, "small": 1})
    for node, created in (("n1", "2026-01-01T00:00:05Z"), ("n2", "2026-01-01T00:00:01Z")):
        for d in ("gpu-0", "gpu-1"):
            model.upsert_claim(_held(model, f"{node}-{d}", node, d, created=created))
    model.upsert_claim(_held(model, "small-0", "small", "gpu-0", created="2026-01-01T00:00:00Z"))
    claim = model.upsert_claim(h.claim("c", count=2))
    assert not isinstance(claim, type(None))
    index = SliceIndex(model.slices.values())
    in_use = model.devices_in_use()
    # "small" has the oldest holder but only one GPU: a two-GPU claim never fits there.
    target = choose_target(claim=claim, model=model, index=index, in_use=in_use)  # type: ignore[arg-type]
    assert target is not None
    assert (target.node, target.devices) == ("n2", ((h.GPU, "n2", "gpu-0"), (h.GPU, "n2", "gpu-1")))
    again = choose_target(claim=claim, model=model, index=index, in_use=in_use, excluded={"n2"})  # type: ignore[arg-type]
    assert again is not None
    assert again.node == "n1"


def test_free_devices_count_before_age_and_alternatives_get_no_reservation() -> None:
    model = model_with(nodes={"n1": 2, "n2": 2})
    model.upsert_claim(_held(model, "old", "n1", "gpu-0", created="2026-01-01T00:00:00Z"))
    model.upsert_claim(_held(model, "new", "n2", "gpu-0", created="2026-01-01T00:00:09Z"))
    model.upsert_claim(_held(model, "new2", "n2", "gpu-1", created="2026-01-01T00:00:09Z"))
    index = SliceIndex(model.slices.values())
    claim = model.upsert_claim(h.claim("c"))
    target = choose_target(claim=claim, model=model, index=index, in_use=model.devices_in_use())  # type: ignore[arg-type]
    assert target is not None
    # One GPU free on n1: it, and the one held longest there, in case a pod gets the free one now.
    assert target.devices == ((h.GPU, "n1", "gpu-1"), (h.GPU, "n1", "gpu-0"))
    alternatives = h.claim("alt")
    alternatives["spec"]["devices"]["requests"] = [
        {"name": "r", "firstAvailable": [{"name": "a", "deviceClassName": h.GPU}]}
    ]
    alt = model.upsert_claim(alternatives)
    assert choose_target(claim=alt, model=model, index=index, in_use=model.devices_in_use()) is None  # type: ignore[arg-type]


def _setup(api: ClaimApi) -> tuple[ClaimReconciler, ClusterModel, Metrics]:
    model = model_with(nodes={"n1": 2, "n2": 2})
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
    return reconciler, model, metrics


def _saturate(reconciler: ClaimReconciler, model: ClusterModel) -> None:
    """Every GPU held by a running pod's claim (n2's the longest), and two more pods waiting."""
    for node, created in (("n1", "2026-01-01T00:00:05Z"), ("n2", "2026-01-01T00:00:01Z")):
        for d in ("gpu-0", "gpu-1"):
            reconciler.on_claim_event(_held(model, f"{node}-{d}", node, d, created=created), deleted=False)
    for i in range(2):
        reconciler.on_claim_event(pod_claim(f"w{i}-gpu", pod_name=f"w{i}"), deleted=False)
        model.upsert_pod(pod(f"w{i}", claims=(f"w{i}-gpu",)))
    reconciler.on_pod_change()


def _free(reconciler: ClaimReconciler, model: ClusterModel, name: str) -> None:
    """The pod holding ``name`` ends: its claim is deallocated and deleted."""
    held = model.claims[ClaimKey("ns", name)]
    reconciler.on_claim_event(
        {
            "metadata": {
                "namespace": "ns",
                "name": name,
                "resourceVersion": str(int(held.metadata.resource_version) + 1),
            }
        },
        deleted=True,
    )


async def test_a_claim_starved_by_pods_gets_a_node_reserved_and_the_next_device_freed_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(schedulerwait, "RECHECK_DELAY_S", 0.01)
    monkeypatch.setattr(reservation, "RESERVATION_SETTLE_S", 0.2)
    api = TaintRuleApi()
    reconciler, model, metrics = _setup(api)
    _saturate(reconciler, model)
    _add_claim(reconciler, api, h.claim("c"))
    worker = await _worker(reconciler)
    try:
        # Created long ago (the helper's timestamp): past the 2 s default at once.
        await _until(lambda: api.rules)
        (rule,) = api.rules.values()
        assert rule["apiVersion"] == "resource.k8s.io/v1beta2"
        assert rule["metadata"]["labels"] == {RESERVED_FOR_LABEL: "uid-c"}
        assert rule["spec"]["deviceSelector"] == {"driver": h.GPU, "pool": "n2", "device": "gpu-0"}
        assert rule["spec"]["taint"]["effect"] == "NoSchedule"
        await reconciler.events.flush()
        assert [e["reason"] for e in api.events] == [RESERVED_REASON]
        assert "Node n2's gpu-0 are now reserved for this claim" in api.events[0]["message"]
        condition = json.loads(model.claims[KEY].metadata.annotations[CONDITION_ANNOTATION])
        assert condition["reason"] == WAITING_REASON
        assert KEY in reconciler.waiting()

        # A GPU frees on n1 and n2's other GPU: within the waiting pods' reach, the claim leaves
        # them.
        _free(reconciler, model, "n1-gpu-0")
        _free(reconciler, model, "n2-gpu-1")
        await asyncio.sleep(0.5)
        assert model.claims[KEY].status.allocation is None
        # kube-scheduler gives those two to the waiting pods; another pod comes and waits.
        for i, (node, device) in enumerate((("n1", "gpu-0"), ("n2", "gpu-1"))):
            placed = pod_claim(f"w{i}-gpu", pod_name=f"w{i}")
            placed["metadata"]["resourceVersion"] = "2"
            placed["status"] = {"allocation": h.allocation(node, device)}
            reconciler.on_claim_event(placed, deleted=False)
            model.upsert_pod(pod(f"w{i}", claims=(f"w{i}-gpu",), node=node))
        reconciler.on_claim_event(pod_claim("w2-gpu", pod_name="w2"), deleted=False)
        model.upsert_pod(pod("w2", claims=("w2-gpu",)))
        reconciler.on_pod_change()
        await asyncio.sleep(0.2)
        assert model.claims[KEY].status.allocation is None
        # The reserved GPU frees: the waiting pod could use it, but kube-scheduler no longer
        # allocates it, and the claim takes it.
        _free(reconciler, model, "n2-gpu-0")
        await _until(lambda: model.claims[KEY].status.allocation is not None)
        allocation = model.claims[KEY].status.allocation
        assert allocation is not None
        assert [(r.pool, r.device) for r in allocation.devices] == [("n2", "gpu-0")]
        # The rule goes once kube-scheduler has had time to see the allocation.
        assert api.rules
        await _until(lambda: not api.rules)
        assert reconciler.waiting() == frozenset()
        value = metrics.registry.get_sample_value(
            "dra_operator_allocation_wait_seconds_count", {"reason": "scheduler_busy"}
        )
        assert value == 1
        ended = metrics.registry.get_sample_value(
            "dra_operator_device_reservations_total", {"outcome": "allocated"}
        )
        assert ended == 1
    finally:
        worker.cancel()
        await reconciler.reservations.stop(grace=1.0)


async def test_without_devicetaintrules_the_claim_only_gives_way() -> None:
    api = TaintRuleApi()
    api.taint_rule_version = None
    reconciler, model, _ = _setup(api)
    _saturate(reconciler, model)
    _add_claim(reconciler, api, h.claim("c"))
    worker = await _worker(reconciler)
    try:
        await reconciler.drain()
        await asyncio.sleep(0.1)
        assert api.rules == {}
        assert model.claims[KEY].status.allocation is None
    finally:
        worker.cancel()


async def test_a_deleted_claim_gives_its_reservation_up_and_a_sweep_deletes_strays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(schedulerwait, "RECHECK_DELAY_S", 0.01)
    api = TaintRuleApi()
    api.rules["reserved-stray-0"] = {
        "metadata": {"name": "reserved-stray-0", "labels": {RESERVED_FOR_LABEL: "x"}}
    }
    reconciler, model, _ = _setup(api)
    assert await reconciler.reservations.sweep() == 1
    assert api.rules == {}
    _saturate(reconciler, model)
    _add_claim(reconciler, api, h.claim("c"))
    worker = await _worker(reconciler)
    try:
        await _until(lambda: api.rules)
        reconciler.on_claim_event(
            {"metadata": {"namespace": "ns", "name": "c", "resourceVersion": "9"}}, deleted=True
        )
        await _until(lambda: not api.rules)
        assert reconciler.reservations.by_claim == {}
    finally:
        worker.cancel()


async def test_the_reserved_device_not_taken_is_freed_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedulerwait, "RECHECK_DELAY_S", 0.01)
    monkeypatch.setattr(reservation, "RESERVATION_SETTLE_S", 0.5)
    api = TaintRuleApi()
    reconciler, model, _ = _setup(api)
    _saturate(reconciler, model)
    _free(reconciler, model, "n2-gpu-1")  # one free GPU, within the waiting pods' reach
    _add_claim(reconciler, api, h.claim("c"))
    worker = await _worker(reconciler)
    try:
        # Reserved: the free GPU, and the one held longest there in case a pod takes the free one.
        await _until(lambda: len(api.rules) == 2)
        selectors = sorted(r["spec"]["deviceSelector"]["device"] for r in api.rules.values())
        assert selectors == ["gpu-0", "gpu-1"]
        await _until(lambda: model.claims[KEY].status.allocation is not None)
        allocation = model.claims[KEY].status.allocation
        assert allocation is not None
        assert [(r.pool, r.device) for r in allocation.devices] == [("n2", "gpu-1")]
        # The spare goes at once; the taken one once kube-scheduler has had time to see the claim.
        await _until(lambda: len(api.rules) == 1, within=0.3)
        (left,) = api.rules.values()
        assert left["spec"]["deviceSelector"]["device"] == "gpu-1"
        await _until(lambda: not api.rules)
    finally:
        worker.cancel()


async def test_a_reserved_device_that_was_held_is_taken_once_freed_without_the_whole_settle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kube-scheduler cannot have been giving a held device to a pod when its rule was written:
    once the rule is seen (RULE_SEEN_S) and the pod lets it go, the claim takes it, while a device
    that was free waits the whole settle."""
    monkeypatch.setattr(schedulerwait, "RECHECK_DELAY_S", 0.01)
    monkeypatch.setattr(reservation, "RESERVATION_SETTLE_S", 20.0)
    monkeypatch.setattr(reservation, "RULE_SEEN_S", 0.05)
    api = TaintRuleApi()
    reconciler, model, _ = _setup(api)
    _saturate(reconciler, model)
    _add_claim(reconciler, api, h.claim("c"))
    worker = await _worker(reconciler)
    try:
        await _until(lambda: api.rules)
        (rule,) = api.rules.values()
        assert rule["spec"]["deviceSelector"]["device"] == "gpu-0"
        (held,) = reconciler.reservations.by_claim.values()
        assert [d[2] for d in held.held] == ["gpu-0"]
        await asyncio.sleep(0.1)
        _free(reconciler, model, "n2-gpu-0")
        await _until(lambda: model.claims[KEY].status.allocation is not None, within=2.0)
        allocation = model.claims[KEY].status.allocation
        assert allocation is not None
        assert [(r.pool, r.device) for r in allocation.devices] == [("n2", "gpu-0")]
    finally:
        worker.cancel()
