"""The claim watch: list, then watch from the listing's version; resume after a dropped stream;
list again after 410 Gone (and drop what was deleted in the gap); back off when nothing comes."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
import pytest

from dra_operator.base.settings import Settings
from dra_operator.claims.coordinator import ClaimReconciler
from dra_operator.client.errors import Expired, WatchInactive
from dra_operator.client.listwatch import Listing
from dra_operator.model.cluster import ClaimKey, ClusterModel
from dra_operator.model.metrics import Metrics
from dra_operator.planner import PlannerPlacer
from dra_operator.watch.claimwatch import ClaimWatch
from dra_operator.watch.liveness import Health

from . import helpers as h

Event = tuple[str, dict[str, Any]]


class Stop(Exception):
    """Ends ClaimWatch.run in a test (raised from its sleep)."""


class ScriptedApi:
    """Listings and watch streams, one per call, in order. A stream is a list of events, optionally
    ending in an exception."""

    api_version = "resource.k8s.io/v1"

    def __init__(self, listings: list[Listing], streams: list[list[Event | BaseException]]) -> None:
        self.listings = listings
        self.streams = streams
        self.watched_from: list[str] = []

    async def snapshot_pages(self, plural: str) -> AsyncGenerator[Listing, None]:
        """The next listing, in pages of one object (as the API server's pages of one snapshot)."""
        assert plural == "resourceclaims"
        listing = self.listings.pop(0)
        for start in range(max(len(listing.items), 1)):
            yield Listing(listing.items[start : start + 1], listing.resource_version)

    async def list_core(self, plural: str) -> Listing:
        return Listing([], "1")

    async def watch(self, plural: str, *, resource_version: str, **_: Any) -> AsyncGenerator[Event, None]:
        assert plural == "resourceclaims"
        self.watched_from.append(resource_version)
        for item in self.streams.pop(0):
            if isinstance(item, BaseException):
                raise item
            yield item

    async def post_event(self, **_: Any) -> None:
        return None


def _watch(api: ScriptedApi, sleeps: list[float], *, stop_after: int) -> tuple[ClaimWatch, ClusterModel]:
    model = ClusterModel()
    settings = Settings(gpu_class=h.GPU)
    metrics = Metrics()
    claims = ClaimReconciler(
        model=model,
        placer=PlannerPlacer(policy="first-fit", prefer_last_devices=True),
        api=api,  # type: ignore[arg-type]  # the KubeApi methods the reconciler uses
        settings=settings,
        metrics=metrics,
    )

    async def sleep(delay: float) -> None:
        sleeps.append(delay)
        if len(sleeps) >= stop_after:
            raise Stop

    watch = ClaimWatch(
        api=api,  # type: ignore[arg-type]  # snapshot_pages and watch
        claims=claims,
        health=Health(stale_after=60, heartbeat_enabled=False),
        metrics=metrics,
        settings=settings,
        sleep=sleep,
    )
    return watch, model


def _gone(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": rv}}


async def test_lists_then_watches_from_the_listing_and_follows_events_and_bookmarks() -> None:
    api = ScriptedApi(
        [Listing([h.claim("a", rv="5")], "7")],
        [
            [
                ("ADDED", h.claim("b", rv="8")),
                ("DELETED", _gone("a", "9")),
                ("BOOKMARK", {"metadata": {"resourceVersion": "12"}}),
            ],
            [aiohttp.ClientConnectionError("reset")],
        ],
    )
    sleeps: list[float] = []
    watch, model = _watch(api, sleeps, stop_after=1)
    with pytest.raises(Stop):
        await watch.run()
    assert api.watched_from == ["7", "12"]  # resumed after the bookmark, no second listing
    assert set(model.claims) == {ClaimKey("ns", "b")}
    assert sleeps == [0.5]  # the dropped stream backs off
    assert watch.claims.metrics.watch_events.labels("resourceclaims")._value.get() == 2


async def test_410_gone_lists_again_and_drops_claims_deleted_in_the_gap() -> None:
    api = ScriptedApi(
        [Listing([h.claim("a", rv="5"), h.claim("b", rv="6")], "7"), Listing([h.claim("b", rv="6")], "20")],
        [[Expired("too old resource version")], [("ADDED", h.claim("c", rv="21"))], []],
    )
    sleeps: list[float] = []
    watch, model = _watch(api, sleeps, stop_after=2)
    watch.claims.synced.set()  # after startup: the gap also asks for a re-list of the rest
    with pytest.raises(Stop):
        await watch.run()
    assert api.watched_from == ["7", "20", "21"]
    assert set(model.claims) == {ClaimKey("ns", "b"), ClaimKey("ns", "c")}
    assert watch.listings == 2
    assert watch.claims._relist_task is not None  # the other resources are listed again too
    watch.claims._relist_task.cancel()
    # One back-off after the 410, then the empty third stream that ended at once.
    assert sleeps == [0.5, 0.5]


async def test_streams_that_end_at_once_back_off_exponentially() -> None:
    api = ScriptedApi([Listing([], "3")], [[], [], [], []])
    sleeps: list[float] = []
    watch, _ = _watch(api, sleeps, stop_after=4)
    with pytest.raises(Stop):
        await watch.run()
    assert sleeps == [0.5, 1.0, 2.0, 4.0]
    assert api.watched_from == ["3", "3", "3", "3"]


async def test_a_silent_stream_is_dropped_counted_and_resumed_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """WatchInactive (nothing for the inactivity timeout) is a stall, not a failure of the server:
    the watch resumes from the last version it saw, without a back-off and without a listing."""
    api = ScriptedApi(
        [Listing([], "3")],
        [
            [("ADDED", h.claim("a", rv="4")), WatchInactive("no data for 70 s, not even a bookmark")],
            [("ADDED", h.claim("b", rv="5")), aiohttp.ClientConnectionError("reset")],
        ],
    )
    sleeps: list[float] = []
    watch, model = _watch(api, sleeps, stop_after=1)
    with pytest.raises(Stop):
        await watch.run()
    assert api.watched_from == ["3", "4"]
    assert watch.listings == 1
    assert set(model.claims) == {ClaimKey("ns", "a"), ClaimKey("ns", "b")}
    assert sleeps == [0.5]  # only the connection error backs off
    restarts = watch.metrics.watch_restarts
    assert restarts.labels("resourceclaims", "inactive")._value.get() == 1
    assert restarts.labels("resourceclaims", "error")._value.get() == 1
    silent = [r for r in caplog.records if "went silent" in r.getMessage()]
    assert [r.levelname for r in silent] == ["WARNING"]
    assert "resuming from resourceVersion 4" in silent[0].getMessage()
