"""Listing whole resources into the model: at startup, after a gap in a watch, in the background
after a takeover, and periodically.

A watch that resumes after a gap (410 Gone, a reconnect) lists what exists, so objects deleted
during the gap would stay in the model for good: a deleted slice's devices would look free, a
deleted claim's devices held. A re-list makes the model match the listing, deletions included.
What it finds goes through the reconciler's inputs (``ClaimInputs``), as watch events would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from dra_api.model import ModelError
from dra_operator.client.errors import error_text
from dra_operator.client.kubeapi import KubeApi
from dra_operator.model.cluster import ClaimKey, ClusterModel, claim_key_of
from dra_operator.model.metrics import Metrics

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
    """How long one re-list took: its listings (the requests and their decoding) and making the
    model match them (on the event loop). The kinds are listed side by side, in pages; each page
    goes into the model as it comes, and each kind's deletions once its last page has come.
    Together they are the re-list's time."""

    list_s: float
    """The re-list's time not spent applying: waiting for pages that no kind had yet."""
    apply_s: float
    """Making the model match the pages, summed over the pages and kinds."""
    per_kind_s: Mapping[str, float]
    """Each kind's own listing time: waiting for its pages, not applying them."""

    def describe(self) -> str:
        kinds = ", ".join(f"{kind} {self.per_kind_s[kind]:.2f} s" for kind in self.per_kind_s)
        return f"listing {self.list_s:.2f} s ({kinds}), into the model {self.apply_s:.2f} s"


@dataclass
class _KindPass:
    """One kind's re-list while its pages come: what was listed and when."""

    kind: str
    listed: set[Any] = field(default_factory=set)
    """The names listed so far (for pods, (namespace, name)): what the deletion pass needs."""
    resource_version: str = ""
    """The snapshot's, as the first page says."""
    count: int = 0
    changed: bool = False
    """Whether classes, slices or nodes changed."""
    list_s: float = 0.0
    apply_s: float = 0.0


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
        # Per kind, when the watch's first listing in this process began: its start, not a gap.
        self._first_listing: dict[str, float] = {}
        self._synced_at: float | None = None

    async def resync(self) -> None:
        """List claims, slices, classes, nodes and pods into the model; queue every claim. Says
        how long that took (the log line, ``dra_operator_model_sync_duration_seconds``): at start
        and at a takeover, nothing is allocated before it ends."""
        counts = await self.relist(RELIST_KINDS, mark_all=True)
        self.synced.set()
        self._synced_at = self.clock()
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
        that changed are queued; with ``mark_all``, every claim (at start, when
        nothing may have been done about them). Returns how many objects each listing had.

        The kinds side by side, each page into the model as it comes: only one page's JSON per kind
        is held at a time (at thousands of nodes, the JSON of every object at once costs ten times what the
        model holds of it, and the process keeps that peak). Watch events may come between pages:
        the resourceVersions keep whichever is newer, as they do between watch and listing."""
        chosen = set(kinds)  # once: an iterator is read once
        wanted = [k for k in RELIST_KINDS if k in chosen]
        started = self._last_started = self.clock()
        # The kinds are listed side by side (a takeover waits for the slowest, not for the sum),
        # each page into the model as it comes: at most one page per kind is held at a time.
        passes = list(await asyncio.gather(*(self._relist_kind(kind, mark_all=mark_all) for kind in wanted)))
        if any(p.changed for p in passes):
            self.inputs.on_cluster_change()
        elapsed = self.clock() - started
        apply_s = sum(p.apply_s for p in passes)
        self.last_timing = RelistTiming(
            list_s=max(0.0, elapsed - apply_s),
            apply_s=apply_s,
            per_kind_s={p.kind: p.list_s for p in passes},
        )
        return {p.kind: p.count for p in passes}

    async def _relist_kind(self, kind: str, *, mark_all: bool) -> _KindPass:
        """List ``kind`` page by page, each into the model as it comes, then drop what no page had."""
        one = _KindPass(kind)
        pages = self.api.core_pages(kind) if kind in ("nodes", "pods") else self.api.snapshot_pages(kind)
        asked = self.clock()
        async with contextlib.aclosing(pages):
            async for page in pages:
                came = self.clock()
                one.list_s += came - asked
                one.resource_version = one.resource_version or page.resource_version
                one.count += len(page.items)
                one.changed |= self._apply_page(kind, page.items, one.listed, mark_all=mark_all)
                del page  # not held while the next one is read
                asked = self.clock()
                one.apply_s += asked - came
        came = self.clock()
        one.list_s += came - asked
        one.changed |= self._remove_unlisted(kind, one.listed, one.resource_version)
        one.apply_s += self.clock() - came
        return one

    async def list_for_watch(self, kind: str) -> str:
        """List ``kind`` into the model page by page, deletions included, for a watch that starts
        or lost its place (410 Gone); the snapshot's resourceVersion, to watch from. Pages, not
        one listing: at 20,000 claims the whole listing's JSON would be held at once."""
        one = await self._relist_kind(kind, mark_all=False)
        if one.changed:
            self.inputs.on_cluster_change()
        return one.resource_version

    def _apply_page(
        self, kind: str, items: list[dict[str, Any]], listed: set[Any], *, mark_all: bool
    ) -> bool:
        """Upsert one page's objects and add their names to ``listed``; whether classes, slices or
        nodes changed."""
        model = self.model
        if kind == "resourceclaims":
            for obj in items:
                self.inputs.on_claim_event(obj, deleted=False)
                key = claim_key_of(obj)
                if mark_all:
                    self.inputs.mark(key)
                listed.add(str(key))
            return False
        if kind == "pods":
            for obj in items:
                model.upsert_pod(obj)
                listed.add((str(obj["metadata"].get("namespace", "")), str(obj["metadata"]["name"])))
            return False
        upsert = self._cluster_kind(kind)[0]
        before = model.generation
        for obj in items:
            name = (obj.get("metadata") or {}).get("name")
            listed.add(str(name or ""))
            try:
                upsert(obj)
            except ModelError as exc:
                logger.warning("ignoring %s %s: %s", kind, name, exc)
                self.metrics.reconcile_errors.labels(kind).inc()
        return model.generation != before

    def _remove_unlisted(self, kind: str, listed: set[Any], at: str) -> bool:
        """Drop what the model holds of ``kind`` that a listing at ``at`` did not have (``listed``)
        and that the model has not seen change since; whether classes, slices or nodes changed."""
        model = self.model
        if kind == "resourceclaims":
            claims = {str(k): k for k in [*model.claims, *model.invalid_claims]}
            for name in model.unseen_since("claim", claims, listed, at):
                key = claims[name]
                logger.info("claim %s was deleted while the watch was not looking", key)
                self.inputs.on_claim_event(
                    {"metadata": {"namespace": key.namespace, "name": key.name, "resourceVersion": at}},
                    deleted=True,
                )
            return False
        if kind == "pods":
            for namespace, name in [k for k in model.pods if k not in listed]:
                model.remove_pod(namespace=namespace, name=name)
                self.inputs.on_pod_gone(namespace=namespace, name=name)
            return False
        _, remove, version_kind, held = self._cluster_kind(kind)
        before = model.generation
        for name in model.unseen_since(version_kind, list(held), listed, at):
            logger.info("%s %s was deleted while the watch was not looking", kind, name)
            remove(name, resource_version=at)
        return model.generation != before

    def _cluster_kind(
        self, kind: str
    ) -> tuple[Callable[[Mapping[str, Any]], object], Callable[..., None], str, Mapping[str, object]]:
        """For classes, slices or nodes: the model's upsert and remove, the kind its versions are
        kept under, and what it holds."""
        model = self.model
        if kind == "deviceclasses":
            return model.upsert_class, model.remove_class, "class", model.classes
        if kind == "resourceslices":
            return model.upsert_slice, model.remove_slice, "slice", model.slices
        return model.upsert_node, model.remove_node, "node", model.nodes

    def watch_relisted(self, kind: str) -> None:
        """One of Kopf's watches listed ``kind`` (the claim watch knows its own listings and asks
        :meth:`request_relist` itself). Its first listing in this process is where the watch
        starts, not a gap; a later one comes after a gap in it (410 Gone, a lost connection): list
        the cluster here too, so that what was deleted during the gap leaves the model. Every
        kind, not just this one: a gap rarely hits one watch alone, and a watch whose re-list is
        empty gives no event to notice it by. A watch's first listing is one that began before the
        model was first synced or at most ``LISTING_QUIET_S`` after: a kind that had no objects
        then has none, and its first listing later is a gap's.

        One listing of a watch makes at most one re-list: its events arrive over seconds at scale
        (Kopf dispatches a listing of thousands of slices one by one), and a re-list that started
        after the first of them came started after the watch's own listing did, so it already
        covers the gap before that."""
        now = self.clock()
        first, last = self._listing.get(kind, (now, now))
        if now - last > LISTING_QUIET_S:
            first = now  # a new listing, after a quiet spell: a new gap
        self._listing[kind] = (first, now)
        if kind not in self._first_listing and (
            self._synced_at is None or first - self._synced_at <= LISTING_QUIET_S
        ):
            self._first_listing[kind] = first
        if self._first_listing.get(kind) == first:
            return  # the watch's first listing: at 5,000 nodes Kopf's takes 16 s, not a gap
        if not self.synced.is_set():
            return
        if self._last_started is not None and self._last_started >= first:
            return
        self.request_relist()

    def watch_event(self, kind: str) -> None:
        """A watch delivered a change of ``kind``: its listing, if any, is over."""
        self._listing.pop(kind, None)

    async def settle(self) -> None:
        """Wait for the re-list in progress, if any (a takeover allocates after it)."""
        task = self.task
        if task is not None and not task.done():
            await asyncio.shield(task)

    def describe_age(self) -> str:
        """How long ago the model was last listed whole or in part, for a log line."""
        if self._last_started is None:
            return "never"
        return f"{self.clock() - self._last_started:.0f} s ago"

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
