"""After a watch gap the model is re-listed: what was deleted meanwhile leaves it, what was created
after the listing stays (resourceVersions decide)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dra_operator.clustermodel import ClaimKey, ClusterModel
from dra_operator.kubeapi import Listing
from dra_operator.metrics import Metrics
from dra_operator.planner import PlannerPlacer
from dra_operator.reconcile.claims import ClaimReconciler
from dra_operator.settings import Settings

from . import helpers as h


class ListApi:
    api_version = "resource.k8s.io/v1"

    def __init__(self, listings: dict[str, Listing]) -> None:
        self.listings = listings

    async def list_snapshot(self, plural: str) -> Listing:
        return self.listings[plural]

    async def list_core(self, plural: str) -> Listing:
        return self.listings[plural]

    async def post_event(self, **_: Any) -> None:
        return None


def _reconciler(api: ListApi) -> tuple[ClaimReconciler, ClusterModel]:
    model = ClusterModel()
    reconciler = ClaimReconciler(
        model=model,
        placer=PlannerPlacer(policy="first-fit", prefer_last_devices=True),
        api=api,  # type: ignore[arg-type]  # the KubeApi listing methods
        settings=Settings(gpu_class=h.GPU),
        metrics=Metrics(),
    )
    return reconciler, model


async def test_objects_deleted_during_the_gap_leave_the_model() -> None:
    api = ListApi({})
    reconciler, model = _reconciler(api)
    model.upsert_class(h.gpu_class(rv="1"))
    model.upsert_node(h.node("n1") | {"metadata": {"name": "n1", "resourceVersion": "2"}})
    model.upsert_node(h.node("n2") | {"metadata": {"name": "n2", "resourceVersion": "3"}})
    model.upsert_slice(h.gpu_slice("n1", 1, rv="4"))
    model.upsert_slice(h.gpu_slice("n2", 1, rv="5"))
    reconciler.on_claim_event(h.claim("held", rv="6", allocation=h.allocation("n1", "gpu-0")), deleted=False)
    # Seen on the watch after the listing below was taken: created later, must stay.
    reconciler.on_claim_event(h.claim("newer", rv="12"), deleted=False)
    model.upsert_slice(h.gpu_slice("n3", 1, rv="13"))
    assert model.holders(("gpu.nvidia.com", "n1", "gpu-0")) == {ClaimKey("ns", "held")}

    # At resourceVersion 10: the claim "held", slice n2-gpu and node n2 were deleted in the gap.
    api.listings = {
        "deviceclasses": Listing([h.gpu_class(rv="1")], "10"),
        "resourceslices": Listing([h.gpu_slice("n1", 1, rv="4")], "10"),
        "resourceclaims": Listing([], "10"),
        "nodes": Listing([{"metadata": {"name": "n1", "resourceVersion": "2"}}], "10"),
        "pods": Listing([], "10"),
    }
    counts = await reconciler.relist(api.listings)
    assert counts["resourceslices"] == 1
    assert set(model.claims) == {ClaimKey("ns", "newer")}
    assert model.holders(("gpu.nvidia.com", "n1", "gpu-0")) == frozenset()
    assert sorted(model.slices) == sorted(
        [h.gpu_slice("n1", 1)["metadata"]["name"], h.gpu_slice("n3", 1)["metadata"]["name"]]
    )
    assert sorted(model.nodes) == ["n1"]

    # A listing older than a deletion the watch did deliver cannot bring the object back.
    reconciler.on_claim_event(
        {"metadata": {"namespace": "ns", "name": "newer", "resourceVersion": "20"}}, deleted=True
    )
    api.listings["resourceclaims"] = Listing([h.claim("newer", rv="12")], "15")
    await reconciler.relist(["resourceclaims"])
    assert ClaimKey("ns", "newer") not in model.claims


async def test_kopf_listing_events_before_the_first_sync_do_not_relist() -> None:
    reconciler, _ = _reconciler(ListApi({}))
    reconciler.watch_relisted("resourceclaims")
    assert reconciler._relist_task is None


async def test_the_initial_listing_says_how_long_it_took(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]

    class SlowListApi(ListApi):
        """Each listing takes (fake) seconds: slices 3, claims 1, the rest nothing."""

        async def list_snapshot(self, plural: str) -> Listing:
            now[0] += {"resourceslices": 3.0, "resourceclaims": 1.0}.get(plural, 0.0)
            return await super().list_snapshot(plural)

    api = SlowListApi(
        {
            "deviceclasses": Listing([h.gpu_class(rv="1")], "10"),
            "resourceslices": Listing([h.gpu_slice("n1", 2, rv="4")], "10"),
            "resourceclaims": Listing([h.claim("c", rv="6")], "10"),
            "nodes": Listing([{"metadata": {"name": "n1", "resourceVersion": "2"}}], "10"),
            "pods": Listing([], "10"),
        }
    )
    metrics = Metrics()
    reconciler = ClaimReconciler(
        model=ClusterModel(),
        placer=PlannerPlacer(policy="first-fit", prefer_last_devices=True),
        api=api,  # type: ignore[arg-type]  # the KubeApi listing methods
        settings=Settings(gpu_class=h.GPU),
        metrics=metrics,
    )
    reconciler.relister.clock = lambda: now[0]
    with caplog.at_level(logging.INFO, logger="dra_operator.reconcile.relist"):
        await reconciler.resync()

    timing = reconciler.relister.last_timing
    assert timing is not None
    assert timing.per_kind_s == {
        "deviceclasses": 0.0,
        "resourceslices": 3.0,
        "resourceclaims": 1.0,
        "nodes": 0.0,
        "pods": 0.0,
    }
    assert timing.list_s == 4.0  # here the fake listings ran one after the other
    assert timing.apply_s == 0.0
    assert metrics.registry.get_sample_value(
        "dra_operator_model_sync_duration_seconds", {"phase": "list"}
    ) == pytest.approx(4.0)
    assert metrics.registry.get_sample_value(
        "dra_operator_model_sync_duration_seconds", {"phase": "apply"}
    ) == pytest.approx(0.0)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model synced")]
    assert line == (
        "model synced in 4.00 s (listing 4.00 s (deviceclasses 0.00 s, resourceslices 3.00 s, "
        "resourceclaims 1.00 s, nodes 0.00 s, pods 0.00 s), into the model 0.00 s): "
        "1 claims, 1 slices, 1 classes, 1 nodes"
    )


async def test_one_listing_of_a_watch_makes_at_most_one_relist() -> None:
    """Kopf dispatches a listing event by event (thousands at scale, over seconds): a re-list that
    started after the first of them covers the gap before that listing, and the rest of it must
    not list the cluster again and again."""
    api = ListApi(
        {k: Listing([], "10") for k in ("deviceclasses", "resourceslices", "resourceclaims", "nodes", "pods")}
    )
    reconciler, _ = _reconciler(api)
    relister = reconciler.relister
    now = [100.0]
    relister.clock = lambda: now[0]
    requests: list[float] = []
    relister.request_relist = lambda: requests.append(now[0])  # type: ignore[method-assign]
    await reconciler.resync()  # at 100: the takeover's own listing

    # Kopf's listing after the pause, arriving after the takeover's listing began: a re-list is
    # asked for (the asks coalesce while it waits to run)...
    for step in range(10):
        now[0] = 101.0 + step * 0.5
        reconciler.watch_relisted("resourceslices")
    assert requests[0] == 101.0
    requests.clear()
    await relister.relist(["resourceslices"])  # ... and runs at 105.5, amid the listing
    for step in range(4):
        now[0] = 106.0 + step * 0.5
        reconciler.watch_relisted("resourceslices")
    assert requests == []  # the rest of that listing asks for none

    # A change ends that listing; a listing after it is a new gap.
    reconciler.watch_event("resourceslices")
    now[0] = 108.0
    reconciler.watch_relisted("resourceslices")
    assert requests == [108.0]
    await relister.relist(["resourceslices"])  # at 108
    now[0] = 108.5
    reconciler.watch_relisted("resourceslices")
    assert requests == [108.0]

    # So is one after a quiet spell, even with no change in between.
    now[0] = 108.5 + 6.0
    reconciler.watch_relisted("resourceslices")
    assert requests == [108.0, 114.5]


async def test_a_listing_that_began_before_the_takeovers_own_listing_makes_no_relist() -> None:
    api = ListApi(
        {k: Listing([], "10") for k in ("deviceclasses", "resourceslices", "resourceclaims", "nodes", "pods")}
    )
    reconciler, _ = _reconciler(api)
    relister = reconciler.relister
    now = [100.0]
    relister.clock = lambda: now[0]
    requests: list[float] = []
    relister.request_relist = lambda: requests.append(now[0])  # type: ignore[method-assign]
    await reconciler.resync()
    now[0] = 99.0  # not possible on one clock; stands for a listing whose first event came earlier
    relister._listing["nodes"] = (99.0, 99.0)
    now[0] = 100.5
    reconciler.watch_relisted("nodes")
    assert requests == []
