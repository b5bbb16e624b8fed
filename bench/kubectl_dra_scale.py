"""``kubectl dra devices`` and ``kubectl dra claims -A`` at scale, in-process: no cluster.

Issue 31's target is 5 s for each at 5,000 nodes x 8 GPUs on a 2-core machine. This builds the
objects the commands list as an API server would return them, and times the command's work on them.

The cluster: N Nodes (``dra_devcluster``'s Node objects); per node the ResourceSlices the node agent
publishes for profile ``h100-80gb-x8`` (its simulated discovery, UUIDs from the node name, and its
publisher's slice bodies, as ``bench/scale.py`` builds them), with a taint on one GPU of every 100th
node; the operator's DeviceClasses; ResourceClaims holding half the GPUs (four per node, one each):
three of four standalone (allocated by the operator, its finalizer and condition annotation), one
of four made from a template for a Pod (reserved for it, with the agent's ``status.devices``), and
the Pods; plus one pending claim per 100 nodes. Every object carries the server's metadata
(uid, resourceVersion, creationTimestamp, managedFields) so the lists are as long as the real ones.

Stages, per N and command (wall seconds, ``time.perf_counter``):

- ``decode``: the JSON bytes of the list responses the command reads (``cli.DEVICES_LISTS``,
  ``cli.CLAIMS_LISTS``) to dicts, as the client does (``json.loads``); resource.k8s.io lists in
  pages of ``cluster.PAGE_SIZE``, core lists in one;
- ``parse``: :meth:`ClusterObjects.from_lists`;
- ``rows``: :func:`device_rows` / :func:`claim_rows`;
- ``render``: the table text;
- ``e2e``: ``cli.main`` run in this process against a fake API server (aiohttp, in a thread, serving
  the same bytes): the whole command but start-up; the server shares the process, so a little of
  it is the server's.

Then start-up: ``python -X importtime -m dra_operator.kubectl_dra.cli --help``, its wall time and the
heaviest imports. The discovered devices are cached (``--cache``; discovery takes ~30 ms a node).

    PYTHONPATH=api:operator:node_agent:devcluster:. .venv/bin/python -m bench.kubectl_dra_scale
    ... -m bench.kubectl_dra_scale --nodes 1000 --profile 25   # cProfile's top 25 per command
    ... -m bench.kubectl_dra_scale --nodes 200 --no-e2e --no-startup
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import datetime
import gc
import io
import json
import os
import pstats
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.scale import PROFILE, discover_node
from dra_api.names import GPU_DRIVER, OPERATOR_FINALIZER
from dra_devcluster.cluster import node_object
from dra_node_agent.publisher import PoolDesign, chunk_pool
from dra_node_agent.simulated.discovery import load_profile
from dra_operator.base.settings import Settings
from dra_operator.claims.status import CONDITION_ANNOTATION, condition_json
from dra_operator.kubectl_dra import cli
from dra_operator.kubectl_dra.claims_command import claim_rows, render_claims
from dra_operator.kubectl_dra.cluster import PAGE_SIZE, ClusterObjects, needs_nodes
from dra_operator.kubectl_dra.devices import device_rows, render_devices
from dra_operator.upkeep.deviceclasses import desired_classes

GROUP, VERSION = "resource.k8s.io", "v1"
CREATED = "2025-06-01T10:00:00Z"
NOW = datetime.datetime(2025, 6, 1, 12, 0, 0, tzinfo=datetime.UTC)
COMMANDS: dict[str, tuple[str, ...]] = {"devices": ("devices",), "claims": ("claims", "-A")}
LISTS = {"devices": cli.DEVICES_LISTS, "claims": cli.CLAIMS_LISTS}
"""The lists each command reads (the nodes too for claims when :func:`needs_nodes`)."""
Lists = dict[str, list[dict[str, Any]]]
"""Items by plural: deviceclasses, resourceslices, resourceclaims, nodes, pods."""


# ---- the objects ---------------------------------------------------------------------------------


def _fields(value: Any) -> Any:
    """A managedFields ``fieldsV1`` tree for ``value`` (f:key per field, as the server writes)."""
    if isinstance(value, dict):
        return {f"f:{k}": _fields(v) for k, v in value.items()}
    return {}


class _Server:
    """Stamps the metadata the API server adds to every object."""

    def __init__(self) -> None:
        self.version = 1000

    def stamp(self, obj: dict[str, Any], *, manager: str, status: bool = False) -> dict[str, Any]:
        self.version += 1
        meta = obj["metadata"]
        meta.setdefault("uid", f"{self.version:08x}-0000-4000-8000-{self.version:012x}")
        meta["resourceVersion"] = str(self.version)
        meta.setdefault("creationTimestamp", CREATED)
        meta.setdefault("generation", 1)
        body = {k: v for k, v in obj.items() if k in ("metadata", "spec")}
        managed = [
            {
                "manager": manager,
                "operation": "Update",
                "apiVersion": obj["apiVersion"],
                "time": CREATED,
                "fieldsType": "FieldsV1",
                "fieldsV1": _fields(body),
            }
        ]
        if status and "status" in obj:
            managed.append(
                {**managed[0], "subresource": "status", "fieldsV1": _fields({"status": obj["status"]})}
            )
        meta["managedFields"] = managed
        return obj


def node_devices(*, nodes: int, cache: Path) -> list[list[dict[str, Any]]]:
    """The agent's simulated discovery for each node (cached per node under ``cache``)."""
    profile = load_profile(PROFILE)
    cache.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="hardware-"))
    out = []
    try:
        for name in node_names(nodes):
            path = cache / f"{name}.json"
            if path.is_file():
                out.append(json.loads(path.read_text()))
                continue
            found = discover_node(profile=profile, node=name, driver=GPU_DRIVER, root=root)
            path.write_text(json.dumps(found))
            out.append(found)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def node_names(nodes: int) -> list[str]:
    return [f"scale-node-{i:05d}" for i in range(nodes)]


def build(*, nodes: int, cache: Path) -> Lists:
    server = _Server()
    names = node_names(nodes)
    lists: Lists = {k: [] for k in ("deviceclasses", "resourceslices", "resourceclaims", "nodes", "pods")}
    for obj in desired_classes(Settings()).values():
        lists["deviceclasses"].append(server.stamp(obj, manager="dra-operator"))
    for name in names:
        node = node_object(name, kubelet_version="v1.34.0")
        node["metadata"]["uid"] = f"uid-{name}"
        lists["nodes"].append(server.stamp(node, manager="dra-devcluster", status=True))
    for i, (name, found) in enumerate(zip(names, node_devices(nodes=nodes, cache=cache), strict=True)):
        if i % 100 == 7:
            found = [dict(d) for d in found]
            found[5]["taints"] = [
                {"key": f"{GPU_DRIVER}/xid", "value": "79", "effect": "NoSchedule", "timeAdded": CREATED}
            ]
        owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": f"uid-{name}", "controller": True}
        design = PoolDesign(
            driver=GPU_DRIVER, node=name, api_version=VERSION, owner=owner, chunks=chunk_pool(found)
        )
        for index in range(len(design.chunks)):
            body = design.body(index=index, generation=1, resource_version=None)
            lists["resourceslices"].append(server.stamp(body, manager="dra-node-agent"))
        for g in range(4):
            uuid = found[g]["attributes"]["uuid"]["string"]
            if g == 3:
                pod = f"job-{i:05d}"
                claim = _claim(f"{pod}-gpu", "scale-pods", node=name, device=f"gpu-{g}", pod=pod, uuid=uuid)
                lists["pods"].append(server.stamp(_pod(pod, "scale-pods", node=name), manager="kubelet"))
            else:
                claim = _claim(f"rss-{i:05d}-{g}", "scale-rss", node=name, device=f"gpu-{g}")
            lists["resourceclaims"].append(server.stamp(claim, manager="dra-operator", status=True))
        if i % 100 == 0:
            claim = _claim(f"big-{i:05d}", "scale-pending", node=None, device=None, count=16)
            lists["resourceclaims"].append(server.stamp(claim, manager="kubectl"))
    return lists


def _claim(
    name: str,
    namespace: str,
    *,
    node: str | None,
    device: str | None,
    pod: str | None = None,
    uuid: str = "",
    count: int = 1,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    request: dict[str, Any] = {
        "name": "gpu",
        "exactly": {"deviceClassName": GPU_DRIVER, "allocationMode": "ExactCount", "count": count},
    }
    obj: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": [request]}},
        "status": {},
    }
    if node is None or device is None:
        meta["annotations"] = {
            CONDITION_ANNOTATION: condition_json(
                status="False", reason="NoFit", message="no node has 16 free GPUs", now=CREATED
            )
        }
        return obj
    obj["status"]["allocation"] = {
        "devices": {"results": [{"request": "gpu", "driver": GPU_DRIVER, "pool": node, "device": device}]},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
        "allocationTimestamp": CREATED,
    }
    if pod is None:
        meta["finalizers"] = [OPERATOR_FINALIZER]
        meta["annotations"] = {
            CONDITION_ANNOTATION: condition_json(
                status="True", reason="Allocated", message=f"allocated on {node}", now=CREATED
            )
        }
        return obj
    meta["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": f"uid-{pod}", "controller": True}
    ]
    meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    meta["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    obj["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]
    obj["status"]["devices"] = [
        {
            "driver": GPU_DRIVER,
            "pool": node,
            "device": device,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Prepared",
                    "message": "prepared and healthy",
                    "lastTransitionTime": CREATED,
                }
            ],
            "data": {"uuid": uuid, "pciBusID": "0000:1b:00.0"},
        }
    ]
    return obj


def _pod(name: str, namespace: str, *, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": {"app": "job"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda:12",
                    "command": ["sleep", "infinity"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
        },
        "status": {
            "phase": "Running",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": CREATED}],
            "startTime": CREATED,
        },
    }


# ---- the list responses --------------------------------------------------------------------------

_KINDS = {
    "deviceclasses": ("DeviceClassList", f"{GROUP}/{VERSION}"),
    "resourceslices": ("ResourceSliceList", f"{GROUP}/{VERSION}"),
    "resourceclaims": ("ResourceClaimList", f"{GROUP}/{VERSION}"),
    "nodes": ("NodeList", "v1"),
    "pods": ("PodList", "v1"),
}


def pages(lists: Lists) -> dict[str, list[bytes]]:
    """Each list's responses as the server sends them: resource.k8s.io in pages of ``PAGE_SIZE``
    (``metadata.continue`` on all but the last), core kinds in one."""
    out: dict[str, list[bytes]] = {}
    for plural, items in lists.items():
        kind, api_version = _KINDS[plural]
        size = PAGE_SIZE if api_version != "v1" else max(1, len(items))
        chunks = [items[i : i + size] for i in range(0, len(items), size)] or [[]]
        out[plural] = []
        for n, chunk in enumerate(chunks):
            meta: dict[str, Any] = {"resourceVersion": "999999"}
            if n + 1 < len(chunks):
                meta["continue"] = f"{plural}:{n + 1}"
                meta["remainingItemCount"] = len(items) - (n + 1) * size
            body = {"kind": kind, "apiVersion": api_version, "metadata": meta, "items": chunk}
            out[plural].append(json.dumps(body, separators=(",", ":")).encode())
    return out


def decode(responses: Mapping[str, list[bytes]], kinds: Collection[str]) -> Lists:
    """What the plugin's client makes of the responses of ``kinds``: the items of every page."""
    out: Lists = {}
    for plural, bodies in responses.items():
        if plural not in kinds:
            continue
        items: list[dict[str, Any]] = []
        for body in bodies:
            items.extend(json.loads(body)["items"])
        out[plural] = items
    return out


# ---- stages --------------------------------------------------------------------------------------


@dataclass
class Timings:
    decode: float = 0.0
    parse: float = 0.0
    rows: float = 0.0
    render: float = 0.0
    e2e: float | None = None
    lines: int = 0

    @property
    def pipeline(self) -> float:
        return self.decode + self.parse + self.rows + self.render


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def pipeline(responses: Mapping[str, list[bytes]], command: str) -> tuple[str, Timings]:
    """The command's work after the HTTP layer, stage by stage; its output and the timings. The
    cyclic garbage collector is off, as the command runs (``cli.run``)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _pipeline(responses, command)
    finally:
        if enabled:
            gc.enable()


def _pipeline(responses: Mapping[str, list[bytes]], command: str) -> tuple[str, Timings]:
    t = Timings()
    kinds = LISTS[command]
    lists, t.decode = _timed(lambda: decode(responses, kinds))
    cluster, t.parse = _timed(
        lambda: ClusterObjects.from_lists(
            classes=lists.get("deviceclasses", ()),
            slices=lists.get("resourceslices", ()),
            claims=lists.get("resourceclaims", ()),
            nodes=lists.get("nodes", ()),
            pods=lists.get("pods", ()),
        )
    )
    if command == "claims" and needs_nodes(cluster.claims):  # the command's second list
        nodes, more = _timed(lambda: decode(responses, ["nodes"]))
        cluster, parse = _timed(lambda: cluster.with_nodes(nodes["nodes"]))
        t.decode, t.parse = t.decode + more, t.parse + parse
    if command == "devices":
        drows, t.rows = _timed(lambda: device_rows(cluster=cluster, node=None))
        text, t.render = _timed(lambda: render_devices(drows, output="table"))
    else:
        crows, t.rows = _timed(lambda: claim_rows(cluster=cluster, namespace=None, now=NOW))
        text, t.render = _timed(lambda: render_claims(crows, output="table", all_namespaces=True))
    t.lines = text.count("\n")
    return str(text), t


# ---- a fake API server for the end-to-end run ----------------------------------------------------


def _api_app(responses: Mapping[str, list[bytes]]) -> web.Application:
    async def groups(_: web.Request) -> web.Response:
        version = {"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}
        body = {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [{"name": GROUP, "versions": [version], "preferredVersion": version}],
        }
        return web.json_response(body)

    async def listing(request: web.Request) -> web.Response:
        plural = request.match_info["plural"]
        if plural not in responses:
            raise web.HTTPNotFound()
        cont = request.query.get("continue", "")
        index = int(cont.rsplit(":", 1)[1]) if cont else 0
        return web.Response(body=responses[plural][index], content_type="application/json")

    app = web.Application()
    app.router.add_get("/apis", groups)
    app.router.add_get("/apis/", groups)
    app.router.add_get(f"/apis/{GROUP}/{VERSION}/{{plural}}", listing)
    app.router.add_get("/api/v1/{plural}", listing)
    return app


@contextlib.contextmanager
def fake_api(responses: Mapping[str, list[bytes]]) -> Iterator[str]:
    """The fake API server in a thread; yields a kubeconfig's path."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_api_app(responses), access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    folder = Path(tempfile.mkdtemp(prefix="kubectl-dra-bench-"))
    kubeconfig = folder / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    try:
        yield str(kubeconfig)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        shutil.rmtree(folder, ignore_errors=True)


class _Clock(datetime.datetime):
    @classmethod
    def now(cls, tz: datetime.tzinfo | None = None) -> _Clock:
        return cls.fromtimestamp(NOW.timestamp(), tz)


def end_to_end(kubeconfig: str, command: str) -> tuple[str, float]:
    """``cli.main``, its clock at :data:`NOW` (the claims' ages as in :func:`pipeline`)."""
    out, err = io.StringIO(), io.StringIO()
    cli.datetime = types.SimpleNamespace(datetime=_Clock, UTC=datetime.UTC)  # type: ignore[attr-defined,assignment]
    started = time.perf_counter()
    code = cli.main([*COMMANDS[command], f"--kubeconfig={kubeconfig}"], stdout=out, stderr=err)
    seconds = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"kubectl dra {command} exited {code}: {err.getvalue().strip()}")
    return out.getvalue(), seconds


# ---- start-up ------------------------------------------------------------------------------------


def startup(*, top: int) -> tuple[float, float, list[tuple[float, str]]]:
    """``--help``'s wall time, its imports' total and the ``top`` heaviest top-level packages
    (cumulative import microseconds, from ``-X importtime``)."""
    argv = [sys.executable, "-X", "importtime", "-m", "dra_operator.kubectl_dra.cli", "--help"]
    started = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, check=False, env=os.environ.copy())
    wall = time.perf_counter() - started
    total = 0.0
    packages: dict[str, float] = {}
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = line[len("import time:") :].split("|")
        try:
            cumulative = float(parts[1])
        except ValueError:
            continue
        name = parts[2].rstrip()
        if not name.startswith(" ") or name.startswith("  "):
            continue  # only top-level imports (one space of indent)
        packages[name.strip()] = packages.get(name.strip(), 0.0) + cumulative
        total += cumulative
    heaviest = sorted(((us / 1e6, name) for name, us in packages.items()), reverse=True)[:top]
    return wall, total / 1e6, heaviest


# ---- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--nodes", default="1000,5000", help="comma-separated node counts (default: 1000,5000)"
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "kubectl-dra-scale-devices",
        help="where the discovered devices are cached",
    )
    parser.add_argument(
        "--profile", type=int, default=0, metavar="K", help="print cProfile's top K per command"
    )
    parser.add_argument("--no-e2e", action="store_true", help="leave out the end-to-end run")
    parser.add_argument("--no-startup", action="store_true", help="leave out the start-up measure")
    parser.add_argument("--save", type=Path, help="write each command's output under this folder")
    args = parser.parse_args(argv)
    for n in (int(x) for x in args.nodes.split(",")):
        lists, built = _timed(lambda n=n: build(nodes=n, cache=args.cache))  # type: ignore[misc]
        responses = pages(lists)
        size = sum(len(b) for bodies in responses.values() for b in bodies)
        gets = {p: len(b) for p, b in responses.items()}
        print(
            f"N={n}: {len(lists['resourceslices'])} slices, {len(lists['resourceclaims'])} claims, "
            f"{len(lists['pods'])} pods; {size / 1e6:.0f} MB of JSON in {sum(gets.values())} GETs "
            f"({', '.join(f'{p} {c}' for p, c in gets.items())}); built in {built:.1f} s"
        )
        for command in COMMANDS:
            text, t = pipeline(responses, command)
            e2e = ""
            if not args.no_e2e:
                with fake_api(responses) as kubeconfig:
                    e2e_text, seconds = end_to_end(kubeconfig, command)
                same = "same output" if e2e_text == text else "OUTPUT DIFFERS"
                e2e = f"; e2e {seconds:.2f} s ({same})"
            print(
                f"  {' '.join(COMMANDS[command]):10} decode {t.decode:.2f}  parse {t.parse:.2f}  "
                f"rows {t.rows:.2f}  render {t.render:.2f}  = {t.pipeline:.2f} s{e2e}  [{t.lines} lines]"
            )
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                (args.save / f"{command}-{n}.txt").write_text(text)
            if args.profile:
                profiler = cProfile.Profile()
                profiler.enable()
                pipeline(responses, command)
                profiler.disable()
                stream = io.StringIO()
                pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(args.profile)
                print("\n".join("    " + line for line in stream.getvalue().splitlines() if line.strip()))
    if not args.no_startup:
        wall, total, heaviest = startup(top=8)
        print(f"start-up: --help {wall:.2f} s wall, imports {total:.2f} s; heaviest:")
        for seconds, name in heaviest:
            print(f"  {seconds:6.3f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
