"""The claim worker writes several claims at once, and a failed write gives its devices back.

The API here is a stand-in object with the few KubeApi methods allocation calls (no server, no
HTTP): it is the way to hold writes open and count how many are in flight, which a real API server
answers too quickly to observe.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from dra_api.names import OPERATOR_FINALIZER
from dra_operator.base.settings import Settings
from dra_operator.claims.coordinator import ClaimReconciler
from dra_operator.model.cluster import ClaimKey, ClusterModel
from dra_operator.model.metrics import Metrics
from dra_operator.planner import PlannerPlacer

from . import helpers as h


class WriteApi:
    """Claim writes that wait until ``hold_until`` of them are in flight (or the test lets go)."""

    api_version = "resource.k8s.io/v1"

    def __init__(self, *, hold_until: int, fail_status_of: frozenset[str] = frozenset()) -> None:
        self.hold_until = hold_until
        self.fail_status_of = fail_status_of
        self.in_flight = 0
        self.most_in_flight = 0
        self.enough = asyncio.Event()
        self.objects: dict[str, dict[str, Any]] = {}
        self.status_writes: list[str] = []

    async def _write(self) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        if self.in_flight >= self.hold_until:
            self.enough.set()
        try:
            await self.enough.wait()
        finally:
            self.in_flight -= 1

    def _bump(self, name: str) -> dict[str, Any]:
        obj = self.objects[name]
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(obj)

    async def patch_claim(self, *, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        await self._write()
        self.objects[name]["metadata"]["finalizers"] = body["metadata"]["finalizers"]
        return self._bump(name)

    async def patch_claim_status(self, *, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        await self._write()
        if name in self.fail_status_of:
            raise RuntimeError(f"status write of {name} refused")
        self.status_writes.append(name)
        self.objects[name]["status"] = body["status"]
        return self._bump(name)

    async def post_event(self, **_: Any) -> None:
        return None

    async def get_claim(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(name))


def _setup(api: WriteApi, *, claims: int, nodes: int, writes: int) -> tuple[ClaimReconciler, ClusterModel]:
    model = ClusterModel()
    model.upsert_class(h.gpu_class())
    for i in range(nodes):
        model.upsert_node(h.node(f"n{i}"))
        model.upsert_slice(h.gpu_slice(f"n{i}", 2))
    settings = Settings(gpu_class=h.GPU, max_concurrent_writes=writes)
    reconciler = ClaimReconciler(
        model=model,
        placer=PlannerPlacer(policy="first-fit", prefer_last_devices=True),
        api=api,  # type: ignore[arg-type]  # the KubeApi methods allocation uses
        settings=settings,
        metrics=Metrics(),
    )
    for i in range(claims):
        obj = h.claim(f"c{i}")
        api.objects[obj["metadata"]["name"]] = copy.deepcopy(obj)
        reconciler.on_claim_event(obj, deleted=False)
    reconciler.synced.set()
    return reconciler, model


async def _run_until_drained(reconciler: ClaimReconciler) -> None:
    worker = asyncio.create_task(reconciler.run())
    try:
        await reconciler.drain(within=20.0)
    finally:
        worker.cancel()


async def test_writes_of_different_claims_overlap_up_to_the_limit() -> None:
    # Every write waits until four are in flight: this only finishes if four claims are written at
    # once, and the limit says no more than four ever are.
    api = WriteApi(hold_until=4)
    reconciler, model = _setup(api, claims=8, nodes=4, writes=4)
    await _run_until_drained(reconciler)
    assert api.most_in_flight == 4
    assert sorted(api.status_writes) == [f"c{i}" for i in range(8)]
    devices = [
        r.device_id for c in model.claims.values() if c.status.allocation for r in c.status.allocation.devices
    ]
    assert len(devices) == 8
    assert len(set(devices)) == 8  # written together, yet never the same device twice
    assert all(OPERATOR_FINALIZER in c.metadata.finalizers for c in model.claims.values())


async def test_a_failed_write_releases_its_devices_while_others_complete() -> None:
    api = WriteApi(hold_until=3, fail_status_of=frozenset({"c1"}))
    reconciler, model = _setup(api, claims=3, nodes=2, writes=3)
    await _run_until_drained(reconciler)
    failed = ClaimKey("ns", "c1")
    assert sorted(api.status_writes) == ["c0", "c2"]
    assert model.assumed(failed) is None
    assert model.claims[failed].status.allocation is None
    held = {
        r.device_id for c in model.claims.values() if c.status.allocation for r in c.status.allocation.devices
    }
    assert len(held) == 2
    # Only the two written claims hold devices: the failed one's device is free for the next try.
    assert model.devices_in_use() == frozenset(held)
