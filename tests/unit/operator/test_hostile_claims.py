"""Hostile claims in the claim worker: refused or bounded, told why, and nobody else held up.

The API is a stand-in object with the KubeApi methods allocation calls (no server): what is checked
here is the worker's order of work, which no real cluster shows on cue. The same claims against
the real control plane are in tests/integration/operator/test_hostile_claims.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from dra_operator.base.settings import Settings
from dra_operator.claims.coordinator import ClaimReconciler
from dra_operator.claims.status import CONDITION_ANNOTATION as CONDITION
from dra_operator.model.cluster import ClusterModel
from dra_operator.model.metrics import Metrics
from dra_operator.planner import PlannerPlacer

from . import helpers as h
from .planner.test_budget import split_counters_slice


class ClaimsApi:
    """Finalizer and condition patches, status writes and Events, kept in memory."""

    api_version = "resource.k8s.io/v1"

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.allocated: list[str] = []
        self.events: list[dict[str, Any]] = []

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(obj)

    async def patch_claim(self, *, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = self.objects[name]
        meta = body["metadata"]
        obj["metadata"]["finalizers"] = meta["finalizers"]
        obj["metadata"].setdefault("annotations", {}).update(meta.get("annotations") or {})
        return self._bump(obj)

    async def patch_claim_status(self, *, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = self.objects[name]
        obj["status"] = body["status"]
        self.allocated.append(name)
        return self._bump(obj)

    async def post_event(self, **event: Any) -> None:
        self.events.append(event)


def _setup(**settings: Any) -> tuple[ClaimReconciler, ClusterModel, ClaimsApi, Metrics]:
    api = ClaimsApi()
    model = ClusterModel()
    model.upsert_class(h.gpu_class())
    for n in ("n1", "n2"):
        model.upsert_node(h.node(n))
        model.upsert_slice(h.gpu_slice(n, 4))
    parts = split_counters_slice("n3")
    parts["metadata"]["resourceVersion"] = "1"
    parts["spec"]["driver"] = h.GPU
    for i, device in enumerate(parts["spec"]["devices"]):
        device["attributes"] = {"type": {"string": "part"}, "index": {"int": i}}
    model.upsert_node(h.node("n3"))
    model.upsert_slice(parts)
    metrics = Metrics()
    reconciler = ClaimReconciler(
        model=model,
        placer=PlannerPlacer(prefer_last_devices=True, slice_s=0.01, budget_s=0.3, threads=1),
        api=api,  # type: ignore[arg-type]  # the KubeApi methods allocation uses
        settings=Settings(gpu_class=h.GPU, allocation_search_budget_s=0.3, **settings),
        metrics=metrics,
    )
    reconciler.synced.set()
    return reconciler, model, api, metrics


def _add(reconciler: ClaimReconciler, api: ClaimsApi, obj: dict[str, Any]) -> None:
    api.objects[obj["metadata"]["name"]] = copy.deepcopy(obj)
    reconciler.on_claim_event(obj, deleted=False)


def _requests(obj: dict[str, Any], *requests: dict[str, Any]) -> dict[str, Any]:
    obj["spec"]["devices"]["requests"] = list(requests)
    return obj


def _exact(name: str, count: int, selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": h.GPU, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": exactly}


async def _run(reconciler: ClaimReconciler, until: Any, *, within: float = 20.0, flush: bool = True) -> None:
    worker = asyncio.create_task(reconciler.run())
    events = asyncio.create_task(reconciler.events.run(poll=0.01))
    try:
        async with asyncio.timeout(within):
            while not until():  # noqa: ASYNC110 (the stand-in API has no event to wait on)
                await asyncio.sleep(0.01)
        if flush:
            await reconciler.events.flush(within=5.0)
    finally:
        worker.cancel()
        events.cancel()


def _reasons(api: ClaimsApi, name: str) -> list[str]:
    return [e["reason"] for e in api.events if e["involved"]["name"] == name]


def _condition(api: ClaimsApi, name: str) -> dict[str, Any]:
    annotation = api.objects[name]["metadata"].get("annotations", {}).get(CONDITION)
    assert annotation, api.objects[name]["metadata"]
    found: dict[str, Any] = json.loads(annotation)
    return found


async def test_requests_that_want_the_same_devices_are_refused_at_once_and_told_which() -> None:
    reconciler, _, api, metrics = _setup()
    # 3 and 2 of the same 4 GPUs per node, through selectors that read differently.
    greedy = _requests(
        h.claim("greedy", namespace="evil"),
        _exact(
            "a",
            3,
            'device.attributes["gpu.nvidia.com"].index >= 0 && '
            'device.attributes["gpu.nvidia.com"].type == "gpu"',
        ),
        _exact("b", 2, 'device.attributes["gpu.nvidia.com"].type == "gpu"'),
    )
    _add(reconciler, api, greedy)
    _add(reconciler, api, h.claim("plain", namespace="good"))
    await _run(reconciler, lambda: "plain" in api.allocated and "NoFit" in _reasons(api, "greedy"))
    condition = _condition(api, "greedy")
    assert condition["reason"] == "NoFit"
    assert (
        "request a and request b together want 5 devices; 4 devices of the node can serve them"
        in (condition["message"])
    )
    assert "greedy" not in api.allocated
    # Answered by the counts before any search (perhaps in a thread, if compiling the selectors took
    # the loop's short slice in this test): once, although its own condition brought it back.
    assert metrics.searches_off_loop._value.get() <= 1


async def test_a_search_that_uses_its_budget_backs_off_and_the_others_go_on() -> None:
    reconciler, model, api, metrics = _setup(allocation_search_backoff_s=30.0)
    # 25 of n3's 48 parts, where at most 24 fit its counters: no polynomial check sees that.
    _add(reconciler, api, _requests(h.claim("hard", namespace="evil"), _exact("parts", 25)))
    for i in range(4):
        _add(reconciler, api, h.claim(f"plain-{i}", namespace="good"))
    await _run(
        reconciler,
        lambda: (
            all(f"plain-{i}" in api.allocated for i in range(4))
            and "SearchBudgetExhausted" in _reasons(api, "hard")
        ),
    )
    condition = _condition(api, "hard")
    assert condition["reason"] == "SearchBudgetExhausted"
    assert "the search used its budget" in condition["message"]
    assert "it searches again in 30 s" in condition["message"]
    assert metrics.searches_off_loop._value.get() == 1
    # Changes in the cluster do not bring it back before its back-off ends.
    model.upsert_slice(h.gpu_slice("n1", 5, rv="2"))
    reconciler.on_cluster_change()
    _add(reconciler, api, h.claim("plain-late", namespace="good"))
    await _run(reconciler, lambda: "plain-late" in api.allocated)
    assert metrics.searches_off_loop._value.get() == 1
    assert _reasons(api, "hard").count("SearchBudgetExhausted") == 1


async def test_a_flood_from_one_namespace_does_not_queue_another_behind_it() -> None:
    reconciler, _, api, _ = _setup()
    for i in range(40):
        _add(reconciler, api, h.claim(f"flood-{i}", namespace="evil", count=9))  # fits nowhere
    _add(reconciler, api, h.claim("mine", namespace="good"))
    order: list[str] = []
    real = reconciler.allocator.allocate

    async def noting(claim: Any) -> None:
        order.append(claim.name)
        await real(claim)

    reconciler.allocator.allocate = noting  # type: ignore[method-assign]
    await _run(reconciler, lambda: "mine" in api.allocated, flush=False)  # forty Events are paced
    assert order.index("mine") <= 1  # its namespace's first turn, not after the forty
