"""Whatever makes the placer offer a device another claim holds, the reconciler does not spin:
the claim goes through its back-off, the placer's index is rebuilt from the model, the repair is
counted and a Warning Event says so once per device.

The API here is a stand-in object with the few KubeApi methods allocation calls (no server): the
index is broken on purpose, which no real cluster can be made to do on cue.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from dra_api.model import AllocationResult
from dra_operator.base.logthrottle import LogThrottle, held_back
from dra_operator.base.settings import Settings
from dra_operator.claims.coordinator import ClaimReconciler
from dra_operator.model.cluster import ClaimKey, ClusterModel
from dra_operator.model.metrics import Metrics
from dra_operator.planner import PlannerPlacer

from . import helpers as h

OURS = "dra.accel.dev/allocation"


class StatusApi:
    api_version = "resource.k8s.io/v1"

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.status_writes: list[tuple[str, list[str]]] = []
        self.events: list[dict[str, Any]] = []

    async def patch_claim_status(self, *, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = self.objects[name]
        obj["status"] = body["status"]
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        results = body["status"]["allocation"]["devices"]["results"]
        self.status_writes.append((name, [r["device"] for r in results]))
        return copy.deepcopy(obj)

    async def post_event(self, **event: Any) -> None:
        self.events.append(event)


class CountingPlacer(PlannerPlacer):
    placements = 0

    def place(self, **kwargs: Any) -> Any:
        self.placements += 1
        return super().place(**kwargs)


def _setup() -> tuple[ClaimReconciler, ClusterModel, StatusApi, CountingPlacer, Metrics]:
    api = StatusApi()
    model = ClusterModel()
    model.upsert_class(h.gpu_class())
    model.upsert_node(h.node("n1"))
    model.upsert_slice(h.gpu_slice("n1", 3))
    placer = CountingPlacer(policy="first-fit")
    metrics = Metrics()
    reconciler = ClaimReconciler(
        model=model,
        placer=placer,
        api=api,  # type: ignore[arg-type]  # the KubeApi methods allocation uses
        settings=Settings(gpu_class=h.GPU),
        metrics=metrics,
    )
    reconciler.backoff.base = 0.05  # the back-off is taken, just shorter than in production
    reconciler.on_claim_event(h.claim("a", rv="5", allocation=h.allocation("n1", "gpu-0")), deleted=False)
    reconciler.synced.set()
    return reconciler, model, api, placer, metrics


def _add_pending(reconciler: ClaimReconciler, api: StatusApi, name: str) -> None:
    # The finalizer is there already (the claim finalizer policy): no await between placement and
    # the check that the placed devices are still free.
    obj = h.claim(name, rv="10", finalizers=[OURS])
    api.objects[name] = copy.deepcopy(obj)
    reconciler.on_claim_event(obj, deleted=False)


def _break_index(placer: PlannerPlacer, model: ClusterModel, holder: str) -> AllocationResult:
    """Make the index count ``holder``'s device free while the model says it is held: the state the
    livelock started from, whatever led there."""
    allocation = model.holding_allocations()[ClaimKey("ns", holder)]
    placer.planner_for(model).note_released(allocation)
    return allocation


async def _run_until_written(reconciler: ClaimReconciler, api: StatusApi, writes: int) -> None:
    """Run the worker until ``writes`` status writes were made (a claim waiting out its back-off
    is in no queue, so an empty queue does not mean done)."""
    worker = asyncio.create_task(reconciler.run())
    events = asyncio.create_task(reconciler.events.run(poll=0.01))
    try:
        async with asyncio.timeout(10.0):
            while len(api.status_writes) < writes:  # noqa: ASYNC110 (the stand-in API has no event)
                await asyncio.sleep(0.01)
        await reconciler.drain(within=10.0)
        await reconciler.events.flush(within=5.0)
    finally:
        worker.cancel()
        events.cancel()


async def test_a_placement_on_a_held_device_repairs_the_index_and_backs_off() -> None:
    reconciler, model, api, placer, metrics = _setup()
    _add_pending(reconciler, api, "c")
    _break_index(placer, model, "a")  # after the last event: each event checks the index
    await _run_until_written(reconciler, api, 1)

    # First try: gpu-0 (counted free, held by a), refused before any write; after the back-off
    # the rebuilt index gives gpu-1. Two placements, not thousands.
    assert api.status_writes == [("c", ["gpu-1"])]
    assert placer.placements == 2
    assert metrics.index_repairs.labels("placement")._value.get() == 1
    warnings = [e for e in api.events if e["reason"] == "PlacementIndexRepaired"]
    assert len(warnings) == 1
    assert "gpu.nvidia.com/n1/gpu-0 (held by ns/a)" in warnings[0]["message"]
    assert warnings[0]["type_"] == "Warning"
    assert placer.disagreements(model) == []


async def test_the_same_device_is_reported_once_and_counted_each_time() -> None:
    reconciler, model, api, placer, metrics = _setup()
    _add_pending(reconciler, api, "c")
    _break_index(placer, model, "a")
    await _run_until_written(reconciler, api, 1)
    _add_pending(reconciler, api, "d")
    _break_index(placer, model, "a")
    await _run_until_written(reconciler, api, 2)
    assert [w for _, w in api.status_writes] == [["gpu-1"], ["gpu-2"]]
    assert metrics.index_repairs.labels("placement")._value.get() == 2
    assert len([e for e in api.events if e["reason"] == "PlacementIndexRepaired"]) == 1


def test_taken_by_others_follows_the_allocators_rules() -> None:
    model = ClusterModel()
    exclusive = h.allocation("n1", "gpu-0")
    admin = copy.deepcopy(exclusive)
    admin["devices"]["results"][0]["adminAccess"] = True
    shared = copy.deepcopy(exclusive)
    shared["devices"]["results"][0]["shareID"] = "11111111-1111-1111-1111-111111111111"
    mine = AllocationResult.from_json(exclusive)
    mine_shared = AllocationResult.from_json(
        {**shared, "devices": {"results": [{**shared["devices"]["results"][0], "shareID": "2" * 8}]}}
    )
    model.upsert_claim(h.claim("admin", rv="2", allocation=admin))
    assert model.taken_by_others(ClaimKey("ns", "me"), mine) == {}  # admin access excludes nothing
    model.upsert_claim(h.claim("share", rv="3", allocation=shared))
    assert model.taken_by_others(ClaimKey("ns", "me"), mine_shared) == {}  # shares coexist
    assert model.taken_by_others(ClaimKey("ns", "me"), mine) == {
        ("gpu.nvidia.com", "n1", "gpu-0"): ClaimKey("ns", "share")
    }
    assert model.taken_by_others(ClaimKey("ns", "share"), mine) == {}  # not taken from itself
    model.assume(ClaimKey("ns", "writing"), mine)  # being written counts too
    assert model.taken_by_others(ClaimKey("ns", "me"), mine_shared) == {
        ("gpu.nvidia.com", "n1", "gpu-0"): ClaimKey("ns", "writing")
    }


def test_log_throttle_lets_one_line_through_per_interval_and_counts_the_rest() -> None:
    now = [0.0]
    throttle = LogThrottle(interval=30.0, clock=lambda: now[0])
    assert throttle.allow("k") == 0
    assert [throttle.allow("k") for _ in range(5)] == [None] * 5
    assert throttle.allow("other") == 0
    now[0] = 31.0
    assert throttle.allow("k") == 5
    assert held_back(5) == " (5 more like this not logged)"
    assert held_back(0) == ""
