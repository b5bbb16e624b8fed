"""Listing whole resources into the model: at startup, after a standby period, after a gap in a
watch, and periodically.

A watch that resumes after a gap (410 Gone, a reconnect) lists what exists, so objects deleted
during the gap would stay in the model for good: a deleted slice's devices would look free, a
deleted claim's devices held. A re-list makes the model match the listing, deletions included.
What it finds goes through the reconciler's inputs (``ClaimInputs``), as watch events would.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dra_api.model import ModelError
from dra_operator.clustermodel import ClaimKey, ClusterModel, claim_key_of
from dra_operator.kubeapi import KubeApi, Listing, error_text
from dra_operator.metrics import Metrics

logger = logging.getLogger(__name__)

RELIST_KINDS = ("deviceclasses", "resourceslices", "resourceclaims", "nodes", "pods")
LISTING_QUIET_S = 5.0
"""Listing events of one kind this far apart belong to two listings (two gaps), not one."""


class ClaimInputs(Protocol):
    """What a listing feeds: the reconciler's own inputs."""

    def on_claim_event(self, obj: Mapping[str, Any], *, deleted: bool) -> None: ...
    def mark(self, key: ClaimKey) -> None: ...
    def on_pod_gone(self, *, namespace: str, name: str) -> None: ...
    def on_cluster_change(self) -> None: ...


@dataclass(frozen=True)
class RelistTiming:
    """How long one re-list took: its listings (the requests and their decoding, all at once) and
    making the model match them (on the event loop, after every listing has come)."""

    list_s: float
    """From the start of the listings until the last one had come."""
    apply_s: float
    """Making the model match the listings."""
    per_kind_s: Mapping[str, float]
    """Each listing's own time, from its start (all start together) until it had come."""

    def describe(self) -> str:
        kinds = ", ".join(f"{kind} {self.per_kind_s[kind]:.2f} s" for kind in self.per_kind_s)
        return f"listing {self.list_s:.2f} s ({kinds}), into the model {self.apply_s:.2f} s"


class Relister:
    def __init__(
        self,
        *,
        model: ClusterModel,
        api: KubeApi,
        metrics: Metrics,
        inputs: ClaimInputs,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.api = api
        self.metrics = metrics
        self.inputs = inputs
        self.clock = clock
        self._wanted: set[str] = set()
        self.task: asyncio.Task[None] | None = None
        self.synced = asyncio.Event()
        """Set once the model holds a full listing; nothing is allocated before."""
        self.last_timing: RelistTiming | None = None
        """How long the last re-list took (None before the first)."""
        self._last_started: float | None = None
        # Per kind, when the watch's current listing began to arrive, and its last listing event.
        self._listing: dict[str, tuple[float, float]] = {}

    async def resync(self) -> None:
        """List claims, slices, classes, nodes and pods into the model; queue every claim. Says
        how long that took (the log line, ``dra_operator_model_sync_duration_seconds``): at start
        and at a takeover, nothing is allocated before it ends."""
        counts = await self.relist(RELIST_KINDS, mark_all=True)
        self.synced.set()
        timing = self.last_timing
        assert timing is not None  # set by the relist just made
        self.metrics.model_sync.labels("list").set(timing.list_s)
        self.metrics.model_sync.labels("apply").set(timing.apply_s)
        logger.info(
            "model synced in %.2f s (%s): %d claims, %d slices, %d classes, %d nodes",
            timing.list_s + timing.apply_s,
            timing.describe(),
            counts["resourceclaims"],
            counts["resourceslices"],
            counts["deviceclasses"],
            counts["nodes"],
        )

    async def relist(self, kinds: Iterable[str], *, mark_all: bool = False) -> dict[str, int]:
        """Read whole resources again and make the model match them, deletions included. Claims
        that changed are queued; with ``mark_all``, every claim (after a standby period, when
        nothing may have been done about them). Returns how many objects each listing had."""
        wanted = [k for k in RELIST_KINDS if k in set(kinds)]
        started = self.clock()
        self._last_started = started
        timed: list[tuple[Listing, float]] = await asyncio.gather(*(self._list(kind) for kind in wanted))
        listed = self.clock()
        listings = [listing for listing, _ in timed]
        changed = False
        for kind, listing in zip(wanted, listings, strict=True):
            changed |= self.apply_listing(kind, listing, mark_all=mark_all)
        if changed:
            self.inputs.on_cluster_change()
        self.last_timing = RelistTiming(
            list_s=listed - started,
            apply_s=self.clock() - listed,
            per_kind_s={kind: seconds for kind, (_, seconds) in zip(wanted, timed, strict=True)},
        )
        return {kind: len(listing.items) for kind, listing in zip(wanted, listings, strict=True)}

    async def _list(self, kind: str) -> tuple[Listing, float]:
        """The listing of ``kind`` and the seconds it took."""
        started = self.clock()
        if kind in ("nodes", "pods"):
            listing = await self.api.list_core(kind)
        else:
            listing = await self.api.list_snapshot(kind)
        return listing, self.clock() - started

    def apply_listing(self, kind: str, listing: Listing, *, mark_all: bool = False) -> bool:
        """Upsert what is listed, drop what is gone; whether classes, slices or nodes changed."""
        if kind == "resourceclaims":
            self._apply_claims(listing, mark_all=mark_all)
            return False
        if kind == "pods":
            self._apply_pods(listing)
            return False
        return self._apply_cluster(kind, listing)

    def _apply_claims(self, listing: Listing, *, mark_all: bool) -> None:
        model, at = self.model, listing.resource_version
        for obj in listing.items:
            self.inputs.on_claim_event(obj, deleted=False)
            if mark_all:
                self.inputs.mark(claim_key_of(obj))
        listed = {str(claim_key_of(o)) for o in listing.items}
        held = {str(k): k for k in [*model.claims, *model.invalid_claims]}
        for name in model.unseen_since("claim", held, listed, at):
            key = held[name]
            logger.info("claim %s was deleted while the watch was not looking", key)
            self.inputs.on_claim_event(
                {"metadata": {"namespace": key.namespace, "name": key.name, "resourceVersion": at}},
                deleted=True,
            )

    def _apply_pods(self, listing: Listing) -> None:
        model = self.model
        for obj in listing.items:
            model.upsert_pod(obj)
        listed_pods = {
            (str(o["metadata"].get("namespace", "")), str(o["metadata"]["name"])) for o in listing.items
        }
        for namespace, name in [k for k in model.pods if k not in listed_pods]:
            model.remove_pod(namespace=namespace, name=name)
            self.inputs.on_pod_gone(namespace=namespace, name=name)

    def _apply_cluster(self, kind: str, listing: Listing) -> bool:
        """Classes, slices or nodes; whether the model changed."""
        model, at = self.model, listing.resource_version
        before = model.generation
        names = {str((o.get("metadata") or {}).get("name", "")) for o in listing.items}
        upsert: Callable[[Mapping[str, Any]], object]
        remove: Callable[..., None]
        if kind == "deviceclasses":
            upsert, remove, version_kind, held_names = (
                model.upsert_class,
                model.remove_class,
                "class",
                list(model.classes),
            )
        elif kind == "resourceslices":
            upsert, remove, version_kind, held_names = (
                model.upsert_slice,
                model.remove_slice,
                "slice",
                list(model.slices),
            )
        else:
            upsert, remove, version_kind, held_names = (
                model.upsert_node,
                model.remove_node,
                "node",
                list(model.nodes),
            )
        for obj in listing.items:
            try:
                upsert(obj)
            except ModelError as exc:
                logger.warning("ignoring %s %s: %s", kind, (obj.get("metadata") or {}).get("name"), exc)
                self.metrics.reconcile_errors.labels(kind).inc()
        for name in model.unseen_since(version_kind, held_names, names, at):
            logger.info("%s %s was deleted while the watch was not looking", kind, name)
            remove(name, resource_version=at)
        return model.generation != before

    def watch_relisted(self, kind: str) -> None:
        """A watch listed ``kind`` again (Kopf's, or the claim watch), which happens after a gap in
        it (410 Gone, a lost connection, the pause of a standby): list the cluster here too, so that
        what was deleted during the gap leaves the model. Every kind, not just this one: a gap
        rarely hits one watch alone, and a watch whose re-list is empty gives no event to notice it
        by.

        One listing of a watch makes at most one re-list: its events arrive over seconds at scale
        (Kopf dispatches a listing of thousands of slices one by one), and a re-list that started
        after the first of them came started after the watch's own listing did, so it already
        covers the gap before that. That is also why the listing Kopf makes when a standby becomes
        active, arriving while or after the takeover's own listing ran, lists nothing again."""
        if not self.synced.is_set():
            return
        now = self.clock()
        first, last = self._listing.get(kind, (now, now))
        if now - last > LISTING_QUIET_S:
            first = now  # a new listing, after a quiet spell: a new gap
        self._listing[kind] = (first, now)
        if self._last_started is not None and self._last_started >= first:
            return
        self.request_relist()

    def watch_event(self, kind: str) -> None:
        """A watch delivered a change of ``kind``: its listing, if any, is over."""
        self._listing.pop(kind, None)

    def request_relist(self) -> None:
        self._wanted.update(RELIST_KINDS)
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._relist_soon(), name="relist")

    async def _relist_soon(self) -> None:
        attempt = 0
        while self._wanted:
            await asyncio.sleep(1.0)  # let Kopf's listing, which triggered this, reach the model first
            kinds = tuple(self._wanted)
            self._wanted.clear()
            try:
                await self.relist(kinds)
            except Exception as exc:
                attempt += 1
                delay = min(30.0, 0.5 * 2**attempt)
                logger.warning("re-listing failed (%s); retrying in %.1f s", error_text(exc), delay)
                self._wanted.update(kinds)
                await asyncio.sleep(delay)
                continue
            attempt = 0
            for kind in kinds:
                self.metrics.relists.labels(kind).inc()
            logger.info("re-listed %s", ", ".join(k for k in RELIST_KINDS if k in kinds))
