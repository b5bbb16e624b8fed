"""Publishes one driver's devices on this node as ResourceSlices, and keeps them there.

One pool per driver and node, named after the node. The pool is cut into slices of at most 128
devices (64 when any device has taints, counters or list-type attributes, the apiserver's lower
limit); ``pool.resourceSliceCount`` is the number of slices, and ``pool.generation`` goes up only
when the pool's content (devices or counter sets per slice, slice count) really changes, so a
restart or a slice recreated after someone deleted it does not make consumers re-read the pool.

Shared counter sets (KEP-4815 partitionable devices, which dynamic MIG needs) go in slices of their
own, at most 8 sets each, because a slice may carry ``devices`` or ``sharedCounters`` but never both.
They come first, at indexes 0..k-1, with the device slices after them in their preference order:
consumers (the scheduler's allocator, the operator) read the counter sets as part of the whole pool,
not of the slice a device sits in, so a pool is only usable once all its slices are there, and with
counters in front their slice names stay put while the number of device slices changes. A pool
without counter sets is exactly what it was before counters existed: same slice names, same bodies.

Slice names are deterministic, ``<node>-<driver>-<index>``, rather than generateName: a crash
between a create and recording its result can then never leave a duplicate slice behind, and a
restarted agent finds its slices by name and leaves them untouched when nothing changed.

Every slice is owned by the Node object (garbage-collected with it). A watch on the slices of this
node and driver (field selectors ``spec.nodeName`` and ``spec.driver``) triggers a reconcile after
any change, so a slice deleted by someone else (kubelet wipes a driver's slices 30 s after it
disappears) is recreated and stale ones are removed. Every request has a deadline: a read or write
that hangs (a silent network stall) fails after ``request_timeout`` and the pass is retried, and
the watch, which asks for bookmarks (about one a minute), is dropped and started again from a fresh
listing when nothing came for ``watch_inactivity_timeout``. Slices are written in the version the server
serves: ``v1``/``v1beta2`` as is, ``v1beta1`` with each device's fields under ``basic``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter

from dra_api.names import RESOURCE_GROUP

logger = logging.getLogger(__name__)

SLICE_PUBLISHES = Counter(
    "dra_agent_resourceslice_publish_total",
    "ResourceSlice reconcile passes that wrote to the API server, by driver and result (success, error).",
    ["driver", "result"],
)

MAX_DEVICES_PER_SLICE: Final = 128
# resource.k8s.io/v1 validation: a slice whose devices use taints, consumesCounters or list-type
# attributes may hold at most 64 devices.
MAX_DEVICES_PER_SLICE_WITH_EXTRAS: Final = 64
# resource.k8s.io 1.35+: at most 8 counter sets per slice (and 32 counters per set, not split here).
MAX_COUNTER_SETS_PER_SLICE: Final = 8
_LIST_ATTRIBUTE_KINDS: Final = frozenset({"ints", "bools", "strings", "versions"})
MAX_NAME_LENGTH: Final = 253
PLURAL: Final = "resourceslices"
WATCH_SERVER_TIMEOUT_S: Final = 300
# The API server sends a bookmark about every minute to a watch that asks for them: 70 s of nothing
# at all is a stalled connection, not a quiet pool (the operator's default too).
WATCH_INACTIVITY_TIMEOUT_S: Final = 70.0
REQUEST_TIMEOUT_S: Final = 30.0

Device = Mapping[str, Any]
# A v1 CounterSet: {"name": <DNS label>, "counters": {<counter>: {"value": <quantity>}}}.
CounterSet = Mapping[str, Any]


def needs_small_slices(devices: Sequence[Device]) -> bool:
    """Whether any device uses a field that lowers the per-slice device limit to 64."""
    for device in devices:
        if device.get("taints") or device.get("consumesCounters"):
            return True
        for value in (device.get("attributes") or {}).values():
            if isinstance(value, Mapping) and _LIST_ATTRIBUTE_KINDS & set(value):
                return True
    return False


def chunk_devices(devices: Sequence[Device]) -> list[list[Device]]:
    """The pool's slices in order; an empty pool still gets one (empty) slice, so it is complete."""
    limit = MAX_DEVICES_PER_SLICE_WITH_EXTRAS if needs_small_slices(devices) else MAX_DEVICES_PER_SLICE
    if not devices:
        return [[]]
    return [list(devices[start : start + limit]) for start in range(0, len(devices), limit)]


@dataclass(frozen=True)
class SliceChunk:
    """What one slice of the pool holds: devices, or shared counter sets (the API forbids both)."""

    devices: tuple[Device, ...] = ()
    counter_sets: tuple[CounterSet, ...] = ()

    def __post_init__(self) -> None:
        if self.devices and self.counter_sets:
            raise ValueError("a ResourceSlice holds devices or sharedCounters, never both")

    def content(self) -> dict[str, Any]:
        """The slice's content as v1 JSON, in the form ``slice_content`` reads back from the server."""
        return {
            "devices": [dict(d) for d in self.devices],
            "sharedCounters": [dict(c) for c in self.counter_sets],
        }

    def spec(self, *, api_version: str) -> dict[str, Any]:
        """The slice's ``spec`` fields for the content, in ``api_version``; no ``devices`` with counters."""
        if self.counter_sets:
            return {"sharedCounters": [dict(c) for c in self.counter_sets]}
        return {"devices": [for_version(d, api_version=api_version) for d in self.devices]}


def chunk_pool(devices: Sequence[Device], counter_sets: Sequence[CounterSet] = ()) -> list[SliceChunk]:
    """The pool's slices in order: counter sets first (at most 8 a slice), then the devices' chunks.

    A pool with counter sets and no devices gets no empty device slice; without either it gets one.
    """
    sets = tuple(dict(c) for c in counter_sets)
    counters = [
        SliceChunk(counter_sets=sets[start : start + MAX_COUNTER_SETS_PER_SLICE])
        for start in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    if counters and not devices:
        return counters
    return [*counters, *(SliceChunk(devices=tuple(chunk)) for chunk in chunk_devices(devices))]


def slice_name(*, node: str, driver: str, index: int) -> str:
    """``<node>-<driver>-<index>``; shortened with a hash of the full name if over 253 characters."""
    name = f"{node}-{driver}-{index}"
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    suffix = f"-{digest}-{index}"
    return name[: MAX_NAME_LENGTH - len(suffix)].rstrip("-.") + suffix


def to_v1_device(device: Mapping[str, Any]) -> dict[str, Any]:
    """A device entry as v1 JSON, unwrapping the v1beta1 ``basic`` wrapper."""
    if "basic" in device:
        return {"name": device.get("name"), **(device.get("basic") or {})}
    return dict(device)


def for_version(device: Device, *, api_version: str) -> dict[str, Any]:
    """A v1 device entry in the shape of ``api_version`` (v1beta1 wraps the fields in ``basic``)."""
    if api_version == "v1beta1":
        body = {k: v for k, v in device.items() if k != "name"}
        return {"name": device["name"], "basic": body}
    return dict(device)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _pool(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    pool = _spec(obj).get("pool")
    return pool if isinstance(pool, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def server_devices(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [to_v1_device(d) for d in _spec(obj).get("devices") or []]


def counters_dropped(*, sent: Mapping[str, Any], written: Mapping[str, Any]) -> bool:
    """Whether the server stored the slice without the counters it was sent: its counter sets, or a
    device's ``consumesCounters`` (the partitionable-devices gate is off on that API server)."""
    if _spec(sent).get("sharedCounters") and not _spec(written).get("sharedCounters"):
        return True
    consuming = {d.get("name") for d in server_devices(sent) if d.get("consumesCounters")}
    return any(d.get("name") in consuming and not d.get("consumesCounters") for d in server_devices(written))


def shares_dropped(*, sent: Mapping[str, Any], written: Mapping[str, Any]) -> bool:
    """Whether the server stored a device sent with ``allowMultipleAllocations`` without it (the
    consumable-capacity gate is off on that API server): its claims then take it whole."""
    sharing = {d.get("name") for d in server_devices(sent) if d.get("allowMultipleAllocations")}
    return any(
        d.get("name") in sharing and not d.get("allowMultipleAllocations") for d in server_devices(written)
    )


def slice_content(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A slice's devices and counter sets as v1 JSON (``SliceChunk.content``'s form), any version."""
    return {
        "devices": server_devices(obj),
        "sharedCounters": [dict(c) for c in _spec(obj).get("sharedCounters") or []],
    }


@dataclass(frozen=True)
class PoolPlan:
    """What to write to make the pool match: deletions first, then updates, then creates."""

    generation: int
    bumped: bool
    delete: tuple[str, ...] = ()
    update: tuple[dict[str, Any], ...] = ()
    create: tuple[dict[str, Any], ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.delete or self.update or self.create)


@dataclass
class PoolDesign:
    """The inputs that decide a pool's slices; ``owner`` is the Node ownerReference."""

    driver: str
    node: str
    api_version: str
    owner: Mapping[str, Any] | None
    chunks: Sequence[SliceChunk]
    # Server-side spellings of slice contents seen after our own writes, by the canonical JSON of the
    # content we wrote: an apiserver that drops a disabled feature's fields (taints, consumesCounters,
    # sharedCounters) must not make every pass look like a change.
    accepted: dict[str, str] = field(default_factory=dict)

    def same_content(self, *, desired: SliceChunk, actual: Mapping[str, Any]) -> bool:
        """Whether the slice ``actual`` (as listed) holds ``desired``, or what the server made of it."""
        want = canonical(desired.content())
        have = canonical(slice_content(actual))
        return want == have or self.accepted.get(want) == have

    def accept(self, *, sent: Mapping[str, Any], written: Mapping[str, Any]) -> bool:
        """Record what the server stored for the slice body ``sent``; True when it differs and is news."""
        want = canonical(slice_content(sent))
        have = canonical(slice_content(written))
        if want == have:
            return False
        news = self.accepted.get(want) != have
        self.accepted[want] = have
        return news

    def body(self, *, index: int, generation: int, resource_version: str | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": slice_name(node=self.node, driver=self.driver, index=index)}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        if self.owner is not None:
            metadata["ownerReferences"] = [dict(self.owner)]
        return {
            "apiVersion": f"{RESOURCE_GROUP}/{self.api_version}",
            "kind": "ResourceSlice",
            "metadata": metadata,
            "spec": {
                "driver": self.driver,
                "nodeName": self.node,
                "pool": {
                    "name": self.node,
                    "generation": generation,
                    "resourceSliceCount": len(self.chunks),
                },
                **self.chunks[index].spec(api_version=self.api_version),
            },
        }


def _owner_matches(obj: Mapping[str, Any], owner: Mapping[str, Any] | None) -> bool:
    if owner is None:
        return True
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner.get("uid") for ref in refs)


def pool_content(chunks: Sequence[SliceChunk]) -> str:
    """The pool's content as canonical JSON: what a generation stands for."""
    return canonical([chunk.content() for chunk in chunks])


def plan_pool(
    *,
    design: PoolDesign,
    existing: Sequence[Mapping[str, Any]],
    last_generation: int,
    last_content: str | None = None,
) -> PoolPlan:
    """Compare the pool's slices on the server with the design and say what to write.

    ``existing`` are the slices listed for this node and driver; ``last_generation`` and
    ``last_content`` what this process last published, so a pool wiped by someone else comes back
    at the same generation when its content is unchanged, and never goes back in generation.
    """
    ours = [
        s
        for s in existing
        if _spec(s).get("driver") == design.driver and _spec(s).get("nodeName") == design.node
    ]
    names = [slice_name(node=design.node, driver=design.driver, index=i) for i in range(len(design.chunks))]
    by_name = {_name(s): s for s in ours if _pool(s).get("name") == design.node and _name(s) in names}
    stale = tuple(sorted(_name(s) for s in ours if _name(s) not in by_name))
    generations = [int(_pool(s).get("generation") or 0) for s in ours if _pool(s).get("name") == design.node]
    current = max([last_generation, *generations])

    if current == 0:
        changed = True  # nothing was ever published: the first generation
    elif not by_name:
        changed = last_content != pool_content(design.chunks)
    else:
        changed = False
    for index, name in enumerate(names):
        obj = by_name.get(name)
        if obj is None:
            continue
        pool = _pool(obj)
        if int(pool.get("resourceSliceCount") or 0) != len(names) or not design.same_content(
            desired=design.chunks[index], actual=obj
        ):
            changed = True
    generation = current + 1 if changed else current

    updates: list[dict[str, Any]] = []
    creates: list[dict[str, Any]] = []
    for index, name in enumerate(names):
        obj = by_name.get(name)
        if obj is None:
            creates.append(design.body(index=index, generation=generation, resource_version=None))
            continue
        pool = _pool(obj)
        up_to_date = (
            not changed
            and int(pool.get("generation") or 0) == generation
            and _owner_matches(obj, design.owner)
            and (obj.get("apiVersion") == f"{RESOURCE_GROUP}/{design.api_version}" or "apiVersion" not in obj)
        )
        if not up_to_date:
            version = str((obj.get("metadata") or {}).get("resourceVersion", "")) or None
            updates.append(design.body(index=index, generation=generation, resource_version=version))
    return PoolPlan(
        generation=generation, bumped=changed, delete=stale, update=tuple(updates), create=tuple(creates)
    )


class SlicePublisher:
    """Keeps one driver's pool for this node published; ``publish`` sets its content, ``run`` guards it."""

    def __init__(
        self,
        *,
        api: client.ApiClient,
        driver: str,
        node_name: str,
        api_version: str,
        resync_delay: float = 1.0,
        resync_interval: float = 300.0,
        request_timeout: float = REQUEST_TIMEOUT_S,
        watch_inactivity_timeout: float = WATCH_INACTIVITY_TIMEOUT_S,
    ) -> None:
        self.driver = driver
        self.node_name = node_name
        self.api_version = api_version
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._resync_delay = resync_delay
        self._resync_interval = resync_interval
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        # The server ends the watch after WATCH_SERVER_TIMEOUT_S; the total deadline is the backstop.
        self._watch_timeout = aiohttp.ClientTimeout(
            total=WATCH_SERVER_TIMEOUT_S + 30,
            sock_connect=request_timeout,
            sock_read=watch_inactivity_timeout,
        )
        self.watch_inactivity_timeout = watch_inactivity_timeout
        self._devices: list[Device] | None = None
        self._counter_sets: list[CounterSet] = []
        self._guards: frozenset[str] = frozenset()
        self._owner: dict[str, Any] | None = None
        self._last_generation = 0
        self._last_content: str | None = None
        self._accepted: dict[str, str] = {}
        # The API server dropped counters once: devices that consume counters (dynamic MIG
        # placements) are no longer published, since without them the scheduler would give out
        # overlapping placements.
        self.counters_refused = False
        # The API server dropped allowMultipleAllocations once (said once; nothing else changes).
        self.shares_refused = False
        self._dirty = asyncio.Event()
        self._lock = asyncio.Lock()
        self.syncs = 0  # passes that wrote something; for tests and metrics
        self.generation = 0

    @property
    def field_selector(self) -> str:
        return f"spec.nodeName={self.node_name},spec.driver={self.driver}"

    async def publish(
        self,
        devices: Sequence[Device],
        counter_sets: Sequence[CounterSet] | None = None,
        *,
        guards: Collection[str] = (),
    ) -> None:
        """Set the pool's devices (v1 device dicts, in preference order) and reconcile now.

        ``counter_sets`` are v1 CounterSet dicts the devices' ``consumesCounters`` name; they are
        published in slices of their own ahead of the devices. None keeps those set before (the
        health monitor republishes the devices with new taints only), and their ``guards``: the
        names of the sets that only keep two devices of one GPU apart (see
        :class:`~dra_node_agent.devices.CounterSet`).
        """
        self._devices = [dict(d) for d in devices]
        if counter_sets is not None:
            self._counter_sets = [dict(c) for c in counter_sets]
            self._guards = frozenset(guards)
        await self.sync()

    async def _node_owner(self) -> dict[str, Any]:
        # Read on every pass: a Node deleted and re-created under the same name has a new UID, and
        # slices owned by the old one would be garbage-collected as soon as they are written.
        node: Any = await self._core.read_node(self.node_name, _request_timeout=self._timeout)
        self._owner = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self.node_name,
            "uid": node.metadata.uid,
            "controller": True,
        }
        return self._owner

    async def list_slices(self) -> tuple[list[dict[str, Any]], str]:
        """This node's slices of this driver, and the list's resourceVersion."""
        result: Any = await self._custom.list_cluster_custom_object(
            RESOURCE_GROUP,
            self.api_version,
            PLURAL,
            field_selector=self.field_selector,
            _request_timeout=self._timeout,
        )
        items = [dict(i) for i in result.get("items") or []]
        for item in items:
            item.setdefault("apiVersion", f"{RESOURCE_GROUP}/{self.api_version}")
        return items, str((result.get("metadata") or {}).get("resourceVersion", ""))

    async def sync(self) -> PoolPlan | None:
        """One reconcile pass; returns what it wrote (None before the first ``publish``)."""
        if self._devices is None:
            return None
        async with self._lock:
            design = PoolDesign(
                driver=self.driver,
                node=self.node_name,
                api_version=self.api_version,
                owner=await self._node_owner(),
                chunks=chunk_pool(*self._publishable()),
                accepted=self._accepted,
            )
            existing, _ = await self.list_slices()
            plan = plan_pool(
                design=design,
                existing=existing,
                last_generation=self._last_generation,
                last_content=self._last_content,
            )
            if not plan.empty:
                await self._apply(plan, design=design)
            self._last_generation = max(self._last_generation, plan.generation)
            self._last_content = pool_content(design.chunks)
            self.generation = plan.generation
            return plan

    async def _apply(self, plan: PoolPlan, *, design: PoolDesign) -> None:
        for name in plan.delete:
            await self._delete(name)
        for body in plan.update:
            await self._write(body, design=design, create=False)
        for body in plan.create:
            await self._write(body, design=design, create=True)
        self.syncs += 1
        SLICE_PUBLISHES.labels(self.driver, "success").inc()
        logger.info(
            "ResourceSlices of driver %s on node %s: pool generation %d%s, %d slices (%d created, %d "
            "updated, %d stale deleted)",
            self.driver,
            self.node_name,
            plan.generation,
            " (changed)" if plan.bumped else "",
            len(design.chunks),
            len(plan.create),
            len(plan.update),
            len(plan.delete),
        )

    async def _delete(self, name: str) -> None:
        try:
            await self._custom.delete_cluster_custom_object(
                RESOURCE_GROUP, self.api_version, PLURAL, name, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _publishable(self) -> tuple[list[Device], list[CounterSet]]:
        devices = self._devices or []
        if not self.counters_refused:
            return devices, self._counter_sets
        kept = []
        for device in devices:
            used = {str(c.get("counterSet")) for c in device.get("consumesCounters") or []}
            if not used:
                kept.append(device)
            elif used <= self._guards:
                kept.append({k: v for k, v in device.items() if k != "consumesCounters"})
        return kept, []

    async def _write(self, body: dict[str, Any], *, design: PoolDesign, create: bool) -> None:
        name = body["metadata"]["name"]
        written: Any
        if create:
            written = await self._custom.create_cluster_custom_object(
                RESOURCE_GROUP, self.api_version, PLURAL, body, _request_timeout=self._timeout
            )
        else:
            written = await self._custom.replace_cluster_custom_object(
                RESOURCE_GROUP, self.api_version, PLURAL, name, body, _request_timeout=self._timeout
            )
        if counters_dropped(sent=body, written=written) and not self.counters_refused:
            self.counters_refused = True
            self.mark_dirty()
            logger.error(
                "ResourceSlice %s: the API server dropped the shared counters of driver %s (the "
                "DRAPartitionableDevices feature gate is off): the devices that consume them (dynamic MIG "
                "placements) are withdrawn from the pool, since without counters overlapping ones would "
                "be allocated, and a GPU's CUDA and passthrough devices are published without them (two "
                "claims may then be given the two; the second prepare is refused); turn the gate on and "
                "restart the agent, or run without --dynamic-mig",
                name,
                self.driver,
            )
        if shares_dropped(sent=body, written=written) and not self.shares_refused:
            self.shares_refused = True
            logger.error(
                "ResourceSlice %s: the API server dropped allowMultipleAllocations and the request policies "
                "of driver %s's devices (the DRAConsumableCapacity feature gate is off): each device serves "
                "one claim, as without --consumable-shares; turn the gate on for shares",
                name,
                self.driver,
            )
        if design.accept(sent=body, written=written):
            logger.warning(
                "ResourceSlice %s: the API server dropped or changed device or sharedCounters fields "
                "it was sent (a feature gate off?); publishing what it accepts",
                name,
            )

    def mark_dirty(self) -> None:
        """Ask ``run`` for a reconcile pass soon."""
        self._dirty.set()

    async def run(self) -> None:
        """Watch this pool's slices and reconcile after every change, and every resync interval."""
        watcher = asyncio.create_task(self._watch_loop(), name=f"slice-watch-{self.driver}")
        backoff = self._resync_delay
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._dirty.wait(), timeout=self._resync_interval)
                # Let a burst of events settle into one pass.
                await asyncio.sleep(self._resync_delay)
                self._dirty.clear()
                try:
                    await self.sync()
                    backoff = self._resync_delay
                except Exception as exc:  # any API or network failure: retry with backoff
                    SLICE_PUBLISHES.labels(self.driver, "error").inc()
                    logger.warning(
                        "reconciling ResourceSlices of driver %s failed, retrying in %.0f s: %s",
                        self.driver,
                        backoff,
                        _short(exc),
                    )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 60.0)
                    self._dirty.set()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch_loop(self) -> None:
        backoff = 1.0
        while True:
            try:
                _, version = await self.list_slices()
                self.mark_dirty()
                async with watch.Watch() as stream:
                    async for event in stream.stream(
                        self._custom.list_cluster_custom_object,
                        RESOURCE_GROUP,
                        self.api_version,
                        PLURAL,
                        field_selector=self.field_selector,
                        resource_version=version,
                        timeout_seconds=WATCH_SERVER_TIMEOUT_S,
                        allow_watch_bookmarks=True,
                        _request_timeout=self._watch_timeout,
                    ):
                        kind = event.get("type")
                        if kind == "ERROR":
                            break  # 410 Gone and friends: list again
                        if kind == "BOOKMARK":
                            continue  # only proves the stream is alive
                        logger.debug("ResourceSlice event %s %s", kind, _name(event.get("object") or {}))
                        self.mark_dirty()
                backoff = 1.0
            except asyncio.CancelledError:
                raise
            except TimeoutError as exc:
                # aiohttp's read deadline (SocketTimeoutError), or a list that hung: a stalled
                # connection, not a failing server; list and watch again at once.
                logger.warning(
                    "ResourceSlice watch of driver %s went silent (%s); listing and watching again",
                    self.driver,
                    _short(exc),
                )
                backoff = 1.0
            except Exception as exc:  # the watch must survive any API hiccup; it re-lists
                logger.warning("ResourceSlice watch of driver %s failed: %s", self.driver, _short(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)


def _short(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return str(exc) or type(exc).__name__
