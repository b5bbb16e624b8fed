"""Model memory: what the operator's cluster model and placement index cost per device and per claim.

In one process, without a cluster: N nodes' ResourceSlices are made exactly as the node agent
publishes them (its simulated discovery of profile ``h100-80gb-x8``, UUIDs from the node name, then
the publisher's :func:`chunk_pool` and :func:`plan_pool`, which give the bodies it would create),
with the fields the API server adds (uid, resourceVersion, creationTimestamp). They are fed to a
:class:`ClusterModel` as the operator's watch handlers do (``upsert_node``, ``upsert_slice``, the
operator's GPU DeviceClass), a :class:`PlannerPlacer` is built as ``dra-operator run`` builds it
and places one claim (which builds its slice index and the index of free devices), then M claims
are added as the operator writes them (one GPU each, ``status.allocation`` as the placer made it,
finalizer and allocationTimestamp) and the placer catches up with them, as it does before its next
placement.

Each phase prints the growth of the process's RSS (``VmRSS`` of ``/proc/self/status``) and, with
``--trace``, of the memory tracemalloc sees (RSS then includes tracemalloc's own bookkeeping), with
the top allocation sites by file:line; at the end, what the model and the placer hold, walked from
them object by object (each object counted once), by type. Figures are per device (slices, index)
and per claim.

    .venv/bin/python -m bench.model_memory --nodes 1000 --claims 8000
    .venv/bin/python -m bench.model_memory --nodes 1000 --claims 0 --trace
    .venv/bin/python -m bench.model_memory --nodes 5000 --claims 20000 --no-walk
    .venv/bin/python -m bench.model_memory --nodes 1000 --claims 0 --no-walk --feed relist

``--feed relist`` drives the operator's ``Relister`` with a fake API that decodes each page of 500
from its own JSON, and prints the peak RSS of each re-list (``VmHWM``, reset before it).

Discovery writes each node's fake hardware under a temporary directory (about 10 ms a node).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import sys
import tempfile
import time
import tracemalloc
import types
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
from kopf._core.reactor.inventory import ResourceMemories

from bench.operator_allocation import gpu_claim
from bench.scale import PROFILE, discover_node
from dra_api.model import AllocationResult, ResourceClaim
from dra_api.names import OPERATOR_FINALIZER
from dra_devcluster.cluster import node_object
from dra_node_agent.publisher import PoolDesign, chunk_pool, plan_pool
from dra_node_agent.simulated.discovery import load_profile
from dra_operator.base.settings import Settings
from dra_operator.claims.relist import Relister
from dra_operator.client.listwatch import Listing
from dra_operator.model.cluster import ClaimKey, ClusterModel
from dra_operator.model.metrics import Metrics
from dra_operator.planner import PlannerPlacer
from dra_operator.planner.placement import OutOfBudget, Placement
from dra_operator.upkeep.deviceclasses import desired_classes
from dra_operator.watch.handlers import _plain

NAMESPACE = "mem"
CREATED = "2025-01-01T00:00:00Z"


def rss_bytes(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Start ``VmHWM`` (the peak RSS) again from the current RSS."""
    Path("/proc/self/clear_refs").write_text("5")


class Versions:
    """resourceVersions and uids as the API server hands them out: one counter for every kind."""

    def __init__(self) -> None:
        self.last = 1000

    def stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.last += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self.last)
        meta["uid"] = f"00000000-0000-4000-8000-{self.last:012d}"
        meta["creationTimestamp"] = CREATED
        meta.setdefault("generation", 1)
        return obj


def node_slices(*, node: str, node_uid: str, driver: str, root: Path) -> list[dict[str, Any]]:
    """The ResourceSlices the agent would create for ``node``: simulated discovery of the profile,
    cut into slices and rendered by the publisher's own functions, owned by the Node."""
    devices = discover_node(profile=load_profile(PROFILE), node=node, driver=driver, root=root)
    owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
    design = PoolDesign(driver=driver, node=node, api_version="v1", owner=owner, chunks=chunk_pool(devices))
    return list(plan_pool(design=design, existing=[], last_generation=0).create)


@dataclass
class Phase:
    name: str
    rss: int
    traced: int
    snapshot: tracemalloc.Snapshot | None


class Meter:
    """RSS (and traced memory, with tracemalloc on) after each phase, after a full collection."""

    def __init__(self, *, trace: bool, top: int) -> None:
        self.trace = trace
        self.top = top
        self.phases: list[Phase] = []

    def mark(self, name: str) -> Phase:
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] if self.trace else 0
        snapshot = tracemalloc.take_snapshot() if self.trace else None
        phase = Phase(name=name, rss=rss_bytes(), traced=traced, snapshot=snapshot)
        self.phases.append(phase)
        return phase

    def report(self, phase: Phase, *, per: int, unit: str) -> None:
        before = self.phases[self.phases.index(phase) - 1]
        rss = phase.rss - before.rss
        line = f"{phase.name}: RSS +{rss / 2**20:.1f} MiB ({rss / max(per, 1):,.0f} B/{unit})"
        if self.trace:
            traced = phase.traced - before.traced
            line += f"; traced +{traced / 2**20:.1f} MiB ({traced / max(per, 1):,.0f} B/{unit})"
        print(line, flush=True)
        if phase.snapshot is not None and before.snapshot is not None:
            filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
            stats = phase.snapshot.filter_traces(filters).compare_to(
                before.snapshot.filter_traces(filters), "lineno"
            )
            for stat in stats[: self.top]:
                frame = stat.traceback[0]
                print(
                    f"    {stat.size_diff / 2**10:9.0f} KiB {stat.count_diff:+9d} blocks  "
                    f"{_short(frame.filename)}:{frame.lineno}"
                )


def _short(path: str) -> str:
    for marker in ("/site-packages/", "/work/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType)


def reachable(roots: list[Any], *, exclude: set[int]) -> Iterator[Any]:
    """Every object reachable from ``roots`` (once each), not entering those in ``exclude``,
    classes, modules and functions (shared by the program, not data)."""
    seen = set(exclude)
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SKIP):
            continue
        seen.add(id(obj))
        yield obj
        stack.extend(gc.get_referents(obj))
    exclude.update(seen)


def by_type(objects: Iterator[Any], *, top: int, per: int, unit: str) -> None:
    sizes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for obj in objects:
        name = type(obj).__qualname__
        sizes[name] += sys.getsizeof(obj)
        counts[name] += 1
    total = sum(sizes.values())
    print(f"    total {total / 2**20:.1f} MiB ({total / max(per, 1):,.0f} B/{unit})")
    for name, size in sizes.most_common(top):
        print(
            f"    {size / 2**10:9.0f} KiB {counts[name]:9d} objects "
            f"({size / max(per, 1):6.0f} B/{unit}, {counts[name] / max(per, 1):5.1f}/{unit})  {name}"
        )


def claim_body(
    name: str,
    *,
    template: dict[str, Any],
    node: str,
    device: str,
    versions: Versions,
    anchor: tuple[str, str],
) -> dict[str, Any]:
    """A claim as the operator leaves it: its finalizer, and the template allocation (the one the
    placer made for the probe claim) moved to ``device`` of ``node``."""
    text = (
        json.dumps(template).replace(f'"{anchor[0]}"', f'"{node}"').replace(f'"{anchor[1]}"', f'"{device}"')
    )
    obj = gpu_claim(name, NAMESPACE, Settings().gpu_class)
    obj["metadata"]["finalizers"] = [OPERATOR_FINALIZER]
    obj["status"] = {"allocation": json.loads(text)}
    return versions.stamp(obj)


def discover(names: list[str], *, driver: str, versions: Versions) -> tuple[list[str], list[str]]:
    """Nodes and their slices as the API server would return them, as JSON text (kept aside so
    that discovery's garbage is not counted, and each phase parses what it feeds)."""
    nodes: list[str] = []
    slices: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="model-memory-"))
    try:
        for name in names:
            node = versions.stamp(node_object(name, kubelet_version="v1.35.0"))
            nodes.append(json.dumps(node))
            uid = node["metadata"]["uid"]
            for body in node_slices(node=name, node_uid=uid, driver=driver, root=root):
                slices.append(json.dumps(versions.stamp(body)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return nodes, slices


def feed_direct(model: ClusterModel, nodes: list[str], slices: list[str]) -> None:
    """One object at a time: the model's own cost, nothing else alive beside it."""
    for text in nodes:
        model.upsert_node(json.loads(text))
    for text in slices:
        model.upsert_slice(json.loads(text))


async def feed_kopf(model: ClusterModel, texts: list[str], *, chunk: int, kind: str) -> ResourceMemories:
    """As Kopf's initial listing feeds the handlers: each listing response (every object at once
    unless ``chunk``) parsed whole and held until its last object is handled, each object wrapped
    in a :class:`kopf.Body` and copied by the handlers' ``_plain``, and Kopf's per-object memory
    (``ResourceMemories.recall``) kept for every object, as it is for as long as the object exists."""
    memories = ResourceMemories()
    size = chunk or len(texts)
    for start in range(0, len(texts), size):
        items = ",".join(texts[start : start + size])
        head = f'"kind":"{kind}List","apiVersion":"v1","metadata":{{"resourceVersion":"1"}}'
        response = json.loads(f'{{{head},"items":[{items}]}}')
        del items
        for raw in response["items"]:
            await memories.recall(raw, noticed_by_listing=True)
            body = _plain(kopf.Body(raw))
            if kind == "Node":
                model.upsert_node(body)
            else:
                model.upsert_slice(body)
        del response
    return memories


class PagedTexts:
    """The listing methods of a :class:`KubeApi` over JSON texts: each page of ``page`` objects
    decoded from its own JSON, as the client decodes a response. ``snapshot_pages`` and
    ``core_pages`` yield one page at a time; ``list_snapshot`` and ``list_core`` collect them all
    first, as the re-list did before it read page by page (so this bench runs against either)."""

    api_version = "resource.k8s.io/v1"

    def __init__(self, texts: dict[str, list[str]], *, page: int, resource_version: str) -> None:
        self.texts = texts
        self.page = page
        self.resource_version = resource_version

    async def snapshot_pages(self, plural: str) -> AsyncIterator[Listing]:
        texts = self.texts.get(plural, [])
        for start in range(0, max(len(texts), 1), self.page):
            joined = ",".join(texts[start : start + self.page])
            head = f'"metadata":{{"resourceVersion":"{self.resource_version}"}}'
            response = json.loads(f'{{{head},"items":[{joined}]}}')
            del joined
            yield Listing(response["items"], self.resource_version)
            del response
            await asyncio.sleep(0)

    core_pages = snapshot_pages

    async def list_snapshot(self, plural: str) -> Listing:
        items: list[dict[str, Any]] = []
        async for page in self.snapshot_pages(plural):
            items.extend(page.items)
        return Listing(items, self.resource_version)

    list_core = list_snapshot


class RelistInputs:
    """What a :class:`Relister` feeds, reduced to the model (no claims are listed here)."""

    def __init__(self, model: ClusterModel) -> None:
        self.model = model

    def on_claim_event(self, obj: Mapping[str, Any], *, deleted: bool) -> None:
        self.model.upsert_claim(obj)

    def mark(self, key: ClaimKey) -> None:
        return None

    def on_pod_gone(self, *, namespace: str, name: str) -> None:
        return None

    def on_cluster_change(self) -> None:
        return None


def feed_relist(
    model: ClusterModel, nodes: list[str], slices: list[str], *, page: int, versions: Versions, meter: Meter
) -> None:
    """As the operator's re-list feeds the model (``Relister.relist`` of nodes and slices), twice:
    into the empty model (start-up, takeover), then again into the full one (a periodic re-list or
    one after a watch gap, where every object is unchanged). Prints each one's peak RSS (VmHWM)
    above the RSS it began at: the JSON it held at once."""
    api = PagedTexts(
        {"resourceslices": slices, "nodes": nodes}, page=page, resource_version=str(versions.last)
    )
    relister = Relister(model=model, api=api, metrics=Metrics(), inputs=RelistInputs(model))  # type: ignore[arg-type]
    for what in ("into the empty model", "again, the model full"):
        gc.collect()
        before = rss_bytes()
        reset_peak()
        counts = asyncio.run(relister.relist(["resourceslices", "nodes"]))
        peak = rss_bytes("VmHWM") - before
        gc.collect()
        after = rss_bytes() - before
        timing = relister.last_timing
        assert timing is not None
        print(
            f"re-list {what}: {counts['resourceslices']} slices, {counts['nodes']} nodes; "
            f"peak RSS +{peak / 2**20:.1f} MiB, RSS after +{after / 2**20:.1f} MiB; "
            f"{timing.describe()}",
            flush=True,
        )
        if what == "into the empty model":
            meter.report(
                meter.mark("slices in the model"),
                per=sum(len(s.devices) for s in model.slices.values()),
                unit="device",
            )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--claims", type=int, default=8000, help="allocated claims, one GPU each")
    parser.add_argument(
        "--feed",
        choices=("direct", "kopf", "relist"),
        default="direct",
        help="one object at a time (the model alone), as Kopf's listing does (see feed_kopf), or as"
        " the operator's re-list does (see feed_relist)",
    )
    parser.add_argument(
        "--chunk",
        type=int,
        default=0,
        help="objects per listing page: with --feed kopf (0: all at once), --feed relist (0: 500)",
    )
    parser.add_argument("--trace", action="store_true", help="tracemalloc: traced memory and top sites")
    parser.add_argument("--top", type=int, default=15, help="allocation sites and types shown")
    parser.add_argument("--no-walk", action="store_true", help="skip the walk of the model by type")
    args = parser.parse_args(argv)

    settings = Settings()
    versions = Versions()
    model = ClusterModel()
    for cls in desired_classes(settings).values():
        model.upsert_class(versions.stamp(json.loads(json.dumps(cls))))
    placer = PlannerPlacer(prefer_last_devices=True)  # the policy and gates of a default run
    names = [f"mem-node-{i:05d}" for i in range(args.nodes)]
    started = time.monotonic()
    node_texts, slice_texts = discover(names, driver=settings.gpu_driver, versions=versions)
    print(
        f"{args.nodes} nodes, {len(slice_texts)} slices discovered ({time.monotonic() - started:.1f} s)",
        flush=True,
    )
    if args.trace:
        tracemalloc.start()
    meter = Meter(trace=args.trace, top=args.top)
    meter.mark("start")

    kopf_memories: list[ResourceMemories] = []
    if args.feed == "direct":
        feed_direct(model, node_texts, slice_texts)
    elif args.feed == "relist":
        feed_relist(model, node_texts, slice_texts, page=args.chunk or 500, versions=versions, meter=meter)
    else:
        kopf_memories = [
            asyncio.run(feed_kopf(model, node_texts, chunk=args.chunk, kind="Node")),
            asyncio.run(feed_kopf(model, slice_texts, chunk=args.chunk, kind="ResourceSlice")),
        ]
    devices = sum(len(s.devices) for s in model.slices.values())
    print(f"{len(model.slices)} slices, {devices} devices in the model", flush=True)
    if args.feed != "relist":  # reported by feed_relist, before its second re-list
        meter.report(meter.mark("slices in the model"), per=devices, unit="device")
    started = time.monotonic()
    probe = model.upsert_claim(
        versions.stamp(gpu_claim("probe", NAMESPACE, settings.gpu_class)),
    )
    if not isinstance(probe, ResourceClaim):
        raise SystemExit(f"the probe claim did not parse: {probe}")
    placed = placer.place(claims=[probe], model=model)
    if isinstance(placed, OutOfBudget):
        # Past its slice of the event loop (the first placement compiles the class's selector and
        # builds the index): searched again off the loop within the full budget, as the operator does.
        placed = asyncio.run(placer.place_off_loop(claims=[probe], model=model, namespace=NAMESPACE))
    if not isinstance(placed, Placement):
        raise SystemExit(f"the probe claim was not placed: {placed}")
    print(f"placer built, probe placed ({time.monotonic() - started:.1f} s)", flush=True)
    meter.report(meter.mark("placer index"), per=devices, unit="device")

    claims = min(args.claims, devices)
    if claims:
        allocation: AllocationResult = placed.allocations[0]
        result = allocation.devices[0]
        template = {**allocation.to_json(), "allocationTimestamp": CREATED}
        anchor = (result.pool, result.device)
        started = time.monotonic()
        per_node = devices // len(names)
        for i in range(claims):
            node, gpu = names[i % len(names)], f"gpu-{i // len(names) % per_node}"
            model.upsert_claim(
                claim_body(
                    f"claim-{i:06d}",
                    template=template,
                    node=node,
                    device=gpu,
                    versions=versions,
                    anchor=anchor,
                )
            )
        placer.planner_for(model)
        print(f"{claims} claims allocated ({time.monotonic() - started:.1f} s)", flush=True)
        meter.report(meter.mark("allocated claims"), per=claims, unit="claim")

    if not args.no_walk:
        if args.trace:
            tracemalloc.stop()
        planner = placer.planner_for(model)
        seen: set[int] = {id(placer), id(planner)}
        print("held by the model, by type (shallow sizes):")
        slices_part = [model.slices, model.nodes, model.classes]
        by_type(reachable(slices_part, exclude=seen), top=args.top, per=devices, unit="device")
        if claims:
            print("held by the model for claims:")
            claim_part = [v for k, v in vars(model).items() if k not in ("slices", "nodes", "classes")]
            by_type(reachable(claim_part, exclude=seen), top=args.top, per=claims, unit="claim")
        if kopf_memories:
            print("held by Kopf's per-object memories:")
            by_type(reachable(kopf_memories, exclude=seen), top=args.top, per=devices, unit="device")
        print("held by the placer beyond the model:")
        seen.discard(id(placer))
        seen.discard(id(planner))
        by_type(reachable([placer], exclude=seen), top=args.top, per=devices, unit="device")


if __name__ == "__main__":
    main()
