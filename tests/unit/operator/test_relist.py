"""After a watch gap the model is re-listed: what was deleted meanwhile leaves it, what was created
after the listing stays (resourceVersions decide)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from dra_operator.base.settings import Settings
from dra_operator.claims.coordinator import ClaimReconciler
from dra_operator.claims.relist import RELIST_KINDS, Relister
from dra_operator.client.listwatch import Listing
from dra_operator.model.cluster import ClaimKey, ClusterModel, claim_key_of
from dra_operator.model.metrics import Metrics
from dra_operator.planner import PlannerPlacer

from . import helpers as h


class ListApi:
    """Serves ``listings`` whole, or in pages of ``page_sizes[kind]`` objects (500 unless told),
    each page carrying the listing's resourceVersion, as the API server's pages of a snapshot do."""

    api_version = "resource.k8s.io/v1"

    def __init__(self, listings: dict[str, Listing], *, page_sizes: Mapping[str, int] = {}) -> None:
        self.listings = listings
        self.page_sizes = page_sizes
        self.pages: list[tuple[str, int]] = []
        """(kind, page index) of every page served, in order."""

    async def list_snapshot(self, plural: str) -> Listing:
        return self.listings[plural]

    async def list_core(self, plural: str) -> Listing:
        return self.listings[plural]

    async def snapshot_pages(self, plural: str) -> AsyncIterator[Listing]:
        async for page in self._pages(plural):
            yield page

    async def core_pages(self, plural: str) -> AsyncIterator[Listing]:
        assert plural in ("nodes", "pods")
        async for page in self._pages(plural):
            yield page

    async def _pages(self, plural: str) -> AsyncIterator[Listing]:
        listing = self.listings[plural]
        size = self.page_sizes.get(plural, 500)
        for index, start in enumerate(range(0, max(len(listing.items), 1), size)):
            await self.before_page(plural, index)
            self.pages.append((plural, index))
            yield Listing(listing.items[start : start + size], listing.resource_version)

    async def before_page(self, plural: str, index: int) -> None:
        """Runs while page ``index`` of ``plural`` is being read: tests override it."""

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
        """Each page takes (fake) seconds: slices 1.5 (two pages), claims 1, the rest nothing."""

        async def before_page(self, plural: str, index: int) -> None:
            now[0] += {"resourceslices": 1.5, "resourceclaims": 1.0}.get(plural, 0.0)

    api = SlowListApi(
        {
            "deviceclasses": Listing([h.gpu_class(rv="1")], "10"),
            "resourceslices": Listing([h.gpu_slice("n1", 2, rv="4"), h.gpu_slice("n2", 2, rv="5")], "10"),
            "resourceclaims": Listing([h.claim("c", rv="6")], "10"),
            "nodes": Listing([{"metadata": {"name": "n1", "resourceVersion": "2"}}], "10"),
            "pods": Listing([], "10"),
        },
        page_sizes={"resourceslices": 1},
    )
    metrics = Metrics()
    model = ClusterModel()
    upsert_slice = model.upsert_slice

    def slow_upsert_slice(obj: Mapping[str, Any]) -> Any:
        now[0] += 0.25  # each slice takes (fake) time into the model
        return upsert_slice(obj)

    model.upsert_slice = slow_upsert_slice  # type: ignore[method-assign]
    reconciler = ClaimReconciler(
        model=model,
        placer=PlannerPlacer(policy="first-fit", prefer_last_devices=True),
        api=api,  # type: ignore[arg-type]  # the KubeApi listing methods
        settings=Settings(gpu_class=h.GPU),
        metrics=metrics,
    )
    reconciler.relister.clock = lambda: now[0]
    with caplog.at_level(logging.INFO, logger="dra_operator.claims.relist"):
        await reconciler.resync()

    assert ("resourceslices", 1) in api.pages
    timing = reconciler.relister.last_timing
    assert timing is not None
    assert timing.per_kind_s == {
        "deviceclasses": 0.0,
        "resourceslices": 3.0,  # both pages' reading, not what went into the model between them
        "resourceclaims": 1.0,
        "nodes": 0.0,
        "pods": 0.0,
    }
    assert timing.list_s == 4.0
    assert timing.apply_s == 0.5
    assert metrics.registry.get_sample_value(
        "dra_operator_model_sync_duration_seconds", {"phase": "list"}
    ) == pytest.approx(4.0)
    assert metrics.registry.get_sample_value(
        "dra_operator_model_sync_duration_seconds", {"phase": "apply"}
    ) == pytest.approx(0.5)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model synced")]
    assert line == (
        "model synced in 4.50 s (listing 4.00 s (deviceclasses 0.00 s, resourceslices 3.00 s, "
        "resourceclaims 1.00 s, nodes 0.00 s, pods 0.00 s), into the model 0.50 s): "
        "1 claims, 2 slices, 1 classes, 1 nodes"
    )


class Inputs:
    """The reconciler's inputs, recorded; claims go into the model as the reconciler puts them."""

    def __init__(self, model: ClusterModel) -> None:
        self.model = model
        self.marked: list[ClaimKey] = []
        self.pods_gone: list[tuple[str, str]] = []
        self.cluster_changes = 0

    def on_claim_event(self, obj: Mapping[str, Any], *, deleted: bool) -> None:
        if deleted:
            rv = str(obj["metadata"].get("resourceVersion", ""))
            self.model.remove_claim(claim_key_of(obj), resource_version=rv)
        else:
            self.model.upsert_claim(obj)

    def mark(self, key: ClaimKey) -> None:
        self.marked.append(key)

    def on_pod_gone(self, *, namespace: str, name: str) -> None:
        self.pods_gone.append((namespace, name))

    def on_cluster_change(self) -> None:
        self.cluster_changes += 1


def _relister(api: ListApi) -> tuple[Relister, ClusterModel, Inputs]:
    model = ClusterModel()
    inputs = Inputs(model)
    relister = Relister(model=model, api=api, metrics=Metrics(), inputs=inputs)  # type: ignore[arg-type]
    return relister, model, inputs


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name}, "spec": {}, "status": {}}


def _node(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


async def test_deletions_are_found_across_pages(caplog: pytest.LogCaptureFixture) -> None:
    """What no page has is gone, however many pages there were; what a later page has stays."""
    api = ListApi({}, page_sizes={"resourceslices": 2, "resourceclaims": 2, "nodes": 2, "pods": 2})
    relister, model, inputs = _relister(api)
    nodes = [f"n{i}" for i in range(1, 8)]
    for i, name in enumerate(nodes):
        model.upsert_node(_node(name, rv=str(10 + i)))
        model.upsert_slice(h.gpu_slice(name, 1, rv=str(20 + i)))
        model.upsert_claim(h.claim(f"c{i}", rv=str(30 + i)))
        model.upsert_pod(_pod(f"p{i}"))
    kept = ["n1", "n2", "n4", "n5", "n7"]  # n3 and n6 were deleted in the gap, one in each page
    api.listings = {
        "deviceclasses": Listing([], "50"),
        "resourceslices": Listing([h.gpu_slice(n, 1, rv=str(19 + int(n[1:]))) for n in kept], "50"),
        "resourceclaims": Listing(
            [h.claim(f"c{int(n[1:]) - 1}", rv=str(29 + int(n[1:]))) for n in kept], "50"
        ),
        "nodes": Listing([_node(n, rv=str(9 + int(n[1:]))) for n in kept], "50"),
        "pods": Listing([_pod(f"p{int(n[1:]) - 1}") for n in kept], "50"),
    }
    with caplog.at_level(logging.INFO, logger="dra_operator.claims.relist"):
        counts = await relister.relist(RELIST_KINDS)

    assert [i for kind, i in api.pages if kind == "resourceslices"] == [0, 1, 2]
    assert counts == {"deviceclasses": 0, "resourceslices": 5, "resourceclaims": 5, "nodes": 5, "pods": 5}
    assert sorted(model.nodes) == kept
    assert sorted(model.slices) == [f"{n}-gpu" for n in kept]
    assert sorted(k.name for k in model.claims) == ["c0", "c1", "c3", "c4", "c6"]
    assert sorted(name for _, name in model.pods) == ["p0", "p1", "p3", "p4", "p6"]
    assert sorted(inputs.pods_gone) == [("ns", "p2"), ("ns", "p5")]
    assert inputs.cluster_changes == 1  # once, for slices and nodes together
    gone = sorted(
        r.getMessage() for r in caplog.records if "while the watch was not looking" in r.getMessage()
    )
    assert gone == sorted(
        [
            "claim ns/c2 was deleted while the watch was not looking",
            "claim ns/c5 was deleted while the watch was not looking",
            "nodes n3 was deleted while the watch was not looking",
            "nodes n6 was deleted while the watch was not looking",
            "resourceslices n3-gpu was deleted while the watch was not looking",
            "resourceslices n6-gpu was deleted while the watch was not looking",
        ]
    )

    # The same listing again: nothing changes, nothing is deleted.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dra_operator.claims.relist"):
        await relister.relist(RELIST_KINDS)
    assert inputs.cluster_changes == 1
    assert not [r for r in caplog.records if "while the watch was not looking" in r.getMessage()]


async def test_a_watch_event_between_pages_is_not_undone_by_a_later_page() -> None:
    """The pages are a snapshot at the first page's resourceVersion: an object of page 2 that a
    watch changed (or created, or deleted) while page 1 went into the model keeps the newer state."""

    class Watching(ListApi):
        async def before_page(self, plural: str, index: int) -> None:
            if index != 1:
                return
            if plural == "resourceslices":
                model.upsert_slice(h.gpu_slice("n3", 2, rv="60"))  # page 2 has it at 3, 1 GPU
                model.upsert_slice(h.gpu_slice("n9", 1, rv="61"))  # created after the snapshot
                model.remove_slice("n4-gpu", resource_version="62")  # page 2 still has it
            if plural == "resourceclaims":
                inputs.on_claim_event(
                    h.claim("c3", rv="63", allocation=h.allocation("n3", "gpu-1")), deleted=False
                )
                inputs.on_claim_event(h.claim("c9", rv="64"), deleted=False)

    api = Watching({}, page_sizes={"resourceslices": 2, "resourceclaims": 2})
    relister, model, inputs = _relister(api)
    names = ["n1", "n2", "n3", "n4"]
    api.listings = {
        "resourceslices": Listing([h.gpu_slice(n, 1, rv=str(i + 1)) for i, n in enumerate(names)], "50"),
        "resourceclaims": Listing([h.claim(f"c{i}", rv=str(10 + i)) for i in range(4)], "50"),
    }
    await relister.relist(["resourceslices", "resourceclaims"])

    assert sorted(model.slices) == ["n1-gpu", "n2-gpu", "n3-gpu", "n9-gpu"]
    assert len(model.slices["n3-gpu"].devices) == 2
    assert model.claims[ClaimKey("ns", "c3")].metadata.resource_version == "63"
    assert model.holders(("gpu.nvidia.com", "n3", "gpu-1")) == {ClaimKey("ns", "c3")}
    assert sorted(k.name for k in model.claims) == ["c0", "c1", "c2", "c3", "c9"]


async def test_every_page_of_claims_is_queued_with_mark_all() -> None:
    claims = [h.claim(f"c{i}", rv=str(10 + i)) for i in range(7)]
    api = ListApi(
        {
            **{k: Listing([], "50") for k in RELIST_KINDS},
            "resourceclaims": Listing(claims, "50"),
        },
        page_sizes={"resourceclaims": 3},
    )
    relister, model, inputs = _relister(api)
    await relister.relist(RELIST_KINDS, mark_all=True)
    assert [i for kind, i in api.pages if kind == "resourceclaims"] == [0, 1, 2]
    assert inputs.marked == [ClaimKey("ns", f"c{i}") for i in range(7)]
    assert len(model.claims) == 7

    inputs.marked.clear()
    await relister.relist(["resourceclaims"])  # without mark_all, unchanged claims are not queued
    assert inputs.marked == []


async def test_the_kinds_are_listed_side_by_side_each_page_in_its_order() -> None:
    """A takeover waits for the slowest listing, not for the sum of them; the pages of one kind
    still come one after another."""

    class Yielding(ListApi):
        async def before_page(self, plural: str, index: int) -> None:
            await asyncio.sleep(0)  # listings made together interleave here

    api = Yielding(
        {k: Listing([_node(f"x{i}", rv=str(i + 1)) for i in range(3)], "50") for k in ("nodes", "pods")}
        | {k: Listing([], "50") for k in ("deviceclasses", "resourceslices", "resourceclaims")},
        page_sizes={"nodes": 2},
    )
    api.listings["pods"] = Listing([_pod("p")], "50")
    relister, model, _ = _relister(api)
    counts = await relister.relist(reversed(RELIST_KINDS))
    assert sorted(api.pages) == [
        ("deviceclasses", 0),
        ("nodes", 0),
        ("nodes", 1),
        ("pods", 0),
        ("resourceclaims", 0),
        ("resourceslices", 0),
    ]
    # Side by side: every kind's first page was asked for before the second page of nodes.
    assert api.pages.index(("nodes", 1)) == len(api.pages) - 1
    assert counts["nodes"] == 3
    assert sorted(model.nodes) == ["x0", "x1", "x2"]


def _synced_at_a_fake_clock() -> tuple[ClaimReconciler, list[float], list[float]]:
    """A reconciler on an empty cluster whose clock is ``now[0]`` (100 to begin with) and whose
    re-list requests are recorded (at the clock's time) instead of run."""
    reconciler, _ = _reconciler(ListApi({k: Listing([], "10") for k in RELIST_KINDS}))
    now = [100.0]
    reconciler.relister.clock = lambda: now[0]
    requests: list[float] = []
    reconciler.relister.request_relist = lambda: requests.append(now[0])  # type: ignore[method-assign]
    return reconciler, now, requests


async def test_one_listing_of_a_watch_makes_at_most_one_relist() -> None:
    """Kopf dispatches a listing event by event (thousands at scale, over seconds): a re-list that
    started after the first of them covers the gap before that listing, and the rest of it must
    not list the cluster again and again."""
    reconciler, now, requests = _synced_at_a_fake_clock()
    relister = reconciler.relister
    reconciler.watch_relisted("resourceslices")  # the watch's first listing, at 100: its start
    await reconciler.resync()  # at 100: the listing at start
    now[0] = 100.5
    reconciler.watch_relisted("resourceslices")  # the rest of that first listing
    assert requests == []
    reconciler.watch_event("resourceslices")  # a change ends it

    # Kopf's listing after a gap in its watch, arriving after the re-list at start began: a
    # re-list is asked for (the asks coalesce while it waits to run)...
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


async def test_a_listing_that_began_before_the_last_relist_makes_no_relist() -> None:
    reconciler, now, requests = _synced_at_a_fake_clock()
    relister = reconciler.relister
    now[0] = 90.0
    reconciler.watch_relisted("nodes")  # the watch's first listing
    reconciler.watch_event("nodes")
    now[0] = 99.0  # a gap's listing whose first event came before the re-list below started
    reconciler.watch_relisted("nodes")
    requests.clear()
    now[0] = 100.0
    await relister.relist(RELIST_KINDS)
    now[0] = 100.5
    reconciler.watch_relisted("nodes")
    assert requests == []


async def test_a_watchs_first_listing_is_its_start_not_a_gap() -> None:
    """Kopf's first listing of each resource takes seconds at scale (16 s for 5,000 slices) and
    mostly arrives after the operator's own listing at start has ended: it is no gap to re-list
    for, on the active instance or the standby. A listing after a change is."""
    reconciler, now, requests = _synced_at_a_fake_clock()
    await reconciler.resync()  # at 100
    for step in range(30):  # Kopf's first listings of slices and nodes, side by side, 101 to 115.5
        now[0] = 101.0 + step * 0.5
        reconciler.watch_relisted("resourceslices")
        reconciler.watch_relisted("nodes")
    assert requests == []
    reconciler.watch_event("resourceslices")
    now[0] = 200.0
    reconciler.watch_relisted("resourceslices")
    assert requests == [200.0]


async def test_the_first_listing_of_a_kind_empty_at_the_start_is_a_gaps() -> None:
    """On a fresh install there are no slices yet, so Kopf's watch of them starts with an empty
    listing, which brings no event. Its first listing seen later comes after a gap."""
    reconciler, now, requests = _synced_at_a_fake_clock()
    await reconciler.resync()  # at 100
    now[0] = 103.0
    reconciler.watch_relisted("nodes")  # Kopf's first listing of nodes, just after the sync
    assert requests == []
    now[0] = 500.0
    reconciler.watch_relisted("resourceslices")  # slices were published since; a gap's listing
    assert requests == [500.0]


async def test_a_takeover_allocates_from_the_kept_model_and_relists_in_the_background(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The standby's watches kept its model current: a takeover queues every claim at once and
    lists nothing before that; the re-list that follows in the background still repairs what a
    watch missed."""
    api = ListApi(
        {
            "deviceclasses": Listing([h.gpu_class(rv="1")], "10"),
            "resourceslices": Listing([h.gpu_slice("n1", 2, rv="2")], "10"),
            "resourceclaims": Listing([h.claim("old", rv="3")], "10"),
            "nodes": Listing([{"metadata": {"name": "n1", "resourceVersion": "4"}}], "10"),
            "pods": Listing([], "10"),
        }
    )
    reconciler, model = _reconciler(api)
    await reconciler.resync()  # the standby's listing at start
    reconciler.queue.dirty.clear()
    api.pages.clear()
    # What the watches brought while standing by; a slice deleted in a gap they did not report.
    reconciler.on_claim_event(h.claim("new", rv="11"), deleted=False)
    api.listings["resourceslices"] = Listing([], "12")
    api.listings["resourceclaims"] = Listing([h.claim("old", rv="3"), h.claim("new", rv="11")], "12")
    reconciler.queue.dirty.clear()

    with caplog.at_level(logging.INFO, logger="dra_operator.claims.coordinator"):
        await reconciler.take_over()
    assert api.pages == []  # nothing listed before the claims are queued
    assert set(reconciler.queue.dirty) == {ClaimKey("ns", "old"), ClaimKey("ns", "new")}
    assert any("2 claims queued" in r.getMessage() for r in caplog.records)
    assert model.slices  # the watch missed the deletion: still in the model

    task = reconciler._relist_task
    assert task is not None
    await asyncio.wait_for(task, timeout=5)
    assert not model.slices  # the background re-list removed it
    assert {kind for kind, _ in api.pages} == set(RELIST_KINDS)


async def test_a_takeover_waits_for_a_relist_in_flight_and_lists_if_never_synced() -> None:
    api = ListApi({kind: Listing([], "5") for kind in RELIST_KINDS})
    reconciler, _ = _reconciler(api)
    await reconciler.take_over()  # never listed: it lists first, as at start
    assert reconciler.synced.is_set()
    assert {kind for kind, _ in api.pages} == set(RELIST_KINDS)

    reconciler.request_relist()  # a gap in a watch
    in_flight = reconciler._relist_task
    assert in_flight is not None
    api.pages.clear()
    await reconciler.take_over()
    assert in_flight.done()
    assert {kind for kind, _ in api.pages} == set(RELIST_KINDS)
