"""``kubectl dra``: rows, tables and explanations built from hand-made objects; flags and errors."""

from __future__ import annotations

import datetime
import io
import json
import os
import socket
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_api.model import Node
from dra_operator.allocator import FeatureGates
from dra_operator.entry.simulate import plan, render, result_of
from dra_operator.kubectl_dra import cli
from dra_operator.kubectl_dra.claims_command import claim_rows, render_claims
from dra_operator.kubectl_dra.cluster import ClusterObjects
from dra_operator.kubectl_dra.devices import class_totals, device_rows, render_devices
from dra_operator.kubectl_dra.explain import explain_claim
from dra_operator.kubectl_dra.output import human_age, table

V1 = "resource.k8s.io/v1"
GPU = "gpu.nvidia.com"
CLASS = "gpu.nvidia.com"
NOW = datetime.datetime(2025, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
TAINT = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}


def _class() -> dict[str, Any]:
    return {
        "apiVersion": V1,
        "kind": "DeviceClass",
        "metadata": {"name": CLASS, "labels": {"app.kubernetes.io/managed-by": "accel-dra-operator"}},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GPU}"'}}]},
    }


def _slice(node: str, *, tainted: tuple[int, ...] = ()) -> dict[str, Any]:
    devices: list[dict[str, Any]] = []
    for i in range(2):
        device: dict[str, Any] = {"name": f"gpu-{i}", "attributes": {"index": {"int": i}}}
        if i in tainted:
            device["taints"] = [TAINT]
        devices.append(device)
    return {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{GPU}"},
        "spec": {
            "driver": GPU,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _claim(
    name: str,
    *,
    count: int = 1,
    device: tuple[str, str] | None = None,
    ours: bool = False,
    pod: str | None = None,
    created: str = "2025-01-01T11:57:00Z",
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "creationTimestamp": created,
    }
    if ours:
        meta["finalizers"] = ["dra.accel.dev/allocation"]
    if pod:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": f"uid-{pod}"}]
    obj: dict[str, Any] = {
        "apiVersion": V1,
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS, "count": count}}]}
        },
    }
    if device is not None:
        node, dev = device
        obj["status"] = {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": GPU, "pool": node, "device": dev}]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
            }
        }
        if pod:
            obj["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]
        if status is not None:
            obj["status"]["devices"] = [status]
    return obj


def _device_status(node: str, device: str, *, ready: str, reason: str, uuid: str) -> dict[str, Any]:
    """The node agent's status.devices entry (KEP-4817) of one device."""
    return {
        "driver": GPU,
        "pool": node,
        "device": device,
        "conditions": [
            {
                "type": "Ready",
                "status": ready,
                "reason": reason,
                "message": "XID 79 on GPU" if ready == "False" else "prepared and healthy",
                "lastTransitionTime": "2025-01-01T11:58:00Z",
            }
        ],
        "data": {"uuid": uuid, "pciBusID": "0000:10:00.0"},
    }


def _pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"nodeName": "a", "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]},
    }


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}}}


@pytest.fixture
def cluster() -> ClusterObjects:
    """Nodes a and b with 2 GPUs each (b's gpu-1 tainted); solo (ours) on a/gpu-1, p-gpu (the
    scheduler's, pod p) on a/gpu-0, and big (3 GPUs) pending."""
    return ClusterObjects.from_lists(
        classes=[_class()],
        slices=[_slice("b", tainted=(1,)), _slice("a")],
        claims=[
            _claim("solo", device=("a", "gpu-1"), ours=True),
            _claim(
                "p-gpu",
                device=("a", "gpu-0"),
                pod="p",
                status=_device_status("a", "gpu-0", ready="False", reason="XID", uuid="GPU-a0"),
            ),
            _claim("big", count=3, created="2025-01-01T09:00:00Z"),
        ],
        nodes=[_node("b"), _node("a")],
        pods=[_pod("p", "p-gpu")],
    )


def test_table_is_kubectl_style() -> None:
    text = table(["name", "state"], [["a-long-name", ""], ["b", "pending"]])
    assert text == "NAME          STATE\na-long-name   <none>\nb             pending\n"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(5, "5s"), (119, "119s"), (192, "3m12s"), (2520, "42m"), (5 * 3600 + 180, "5h3m"), (20 * 3600, "20h"),
     (3 * 86400 + 4 * 3600, "3d4h"), (12 * 86400, "12d"), (800 * 86400, "2y70d")],
)  # fmt: skip
def test_human_age(seconds: int, text: str) -> None:
    assert human_age(seconds) == text


def test_device_rows_show_health_taints_holders_and_classes(cluster: ClusterObjects) -> None:
    rows = {(r.node, r.device): r for r in device_rows(cluster=cluster, node=None)}
    assert list(rows) == [("a", "gpu-0"), ("a", "gpu-1"), ("b", "gpu-0"), ("b", "gpu-1")]
    assert rows[("a", "gpu-0")].claims == ("ns/p-gpu",)
    assert rows[("a", "gpu-0")].pods == ("ns/p",)
    assert rows[("a", "gpu-1")].claims == ("ns/solo",)
    assert rows[("a", "gpu-1")].pods == ()
    assert rows[("b", "gpu-1")].health == "Unhealthy"
    assert rows[("b", "gpu-1")].taints == ("gpu.nvidia.com/xid=79:NoSchedule",)
    assert rows[("b", "gpu-0")].health == "Healthy"
    assert all(r.classes == (CLASS,) for r in rows.values())
    (total,) = class_totals(list(rows.values()))
    assert (total.devices, total.allocated, total.unhealthy, total.free) == (4, 2, 1, 1)


def test_devices_table_and_node_filter(cluster: ClusterObjects) -> None:
    text = render_devices(device_rows(cluster=cluster, node="b"), output="table")
    assert text == (
        "NODE   DRIVER           DEVICE   HEALTH      TAINTS                             CLAIM    POD\n"
        "b      gpu.nvidia.com   gpu-0    Healthy     <none>                             <none>   <none>\n"
        "b      gpu.nvidia.com   gpu-1    Unhealthy   gpu.nvidia.com/xid=79:NoSchedule   <none>   <none>\n"
        "\n"
        "CLASS            DEVICES   ALLOCATED   UNHEALTHY   FREE\n"
        "gpu.nvidia.com   2         0           1           1\n"
    )
    wide = render_devices(device_rows(cluster=cluster, node="a"), output="wide")
    assert wide.splitlines()[0].split() == [
        "NODE", "DRIVER", "DEVICE", "HEALTH", "TAINTS", "CLAIM", "POD", "POOL", "SLICE", "CLASSES",
    ]  # fmt: skip
    data = json.loads(render_devices(device_rows(cluster=cluster, node=None), output="json"))
    assert data["kind"] == "List"
    assert len(data["items"]) == 4
    assert data["totals"] == [{"deviceClass": CLASS, "devices": 4, "allocated": 2, "unhealthy": 1, "free": 1}]


def test_claim_rows(cluster: ClusterObjects) -> None:
    rows = {r.name: r for r in claim_rows(cluster=cluster, namespace="ns", now=NOW)}
    assert (rows["solo"].state, rows["solo"].allocator, rows["solo"].node) == ("allocated", "operator", "a")
    assert rows["solo"].devices == ("gpu.nvidia.com/a/gpu-1",)
    assert rows["p-gpu"].state == "allocated,reserved"
    assert rows["p-gpu"].allocator == "scheduler"
    assert rows["p-gpu"].consumers == ("pod/p",)
    assert (rows["big"].state, rows["big"].allocator, rows["big"].node) == ("pending", "operator", "")
    assert rows["big"].age_seconds == 3 * 3600
    assert claim_rows(cluster=cluster, namespace="other", now=NOW) == []
    text = render_claims(list(rows.values()), output="table", all_namespaces=True)
    assert text.splitlines() == [
        "NAMESPACE   NAME    STATE                ALLOCATOR   NODE     DEVICES                  READY        CONSUMERS   AGE",  # noqa: E501
        "ns          big     pending              operator    <none>   <none>                   <none>       <none>      3h",  # noqa: E501
        "ns          p-gpu   allocated,reserved   scheduler   a        gpu.nvidia.com/a/gpu-0   False(XID)   pod/p       3m",  # noqa: E501
        "ns          solo    allocated            operator    a        gpu.nvidia.com/a/gpu-1   <none>       <none>      3m",  # noqa: E501
    ]
    data = yaml.safe_load(render_claims(list(rows.values()), output="yaml", all_namespaces=False))
    assert [i["allocator"] for i in data["items"]] == ["operator", "scheduler", "operator"]
    (status,) = data["items"][1]["deviceStatus"]
    assert status == {
        "driver": GPU,
        "pool": "a",
        "device": "gpu-0",
        "ready": "False",
        "reason": "XID",
        "message": "XID 79 on GPU",
        "data": {"uuid": "GPU-a0", "pciBusID": "0000:10:00.0"},
    }
    assert data["items"][2]["deviceStatus"] == []


def test_claim_rows_show_each_devices_ready_condition_and_data() -> None:
    claims = [
        _claim(
            "two",
            device=("a", "gpu-0"),
            status=_device_status("a", "gpu-0", ready="True", reason="Healthy", uuid="GPU-a0"),
        )
    ]
    # A second device of the claim whose driver wrote no entry yet, and another driver's entry.
    claims[0]["status"]["allocation"]["devices"]["results"].append(
        {"request": "gpu", "driver": GPU, "pool": "a", "device": "gpu-1"}
    )
    claims[0]["status"]["devices"].append({"driver": "other.example.com", "pool": "a", "device": "x"})
    found = ClusterObjects.from_lists(
        classes=[_class()], slices=[_slice("a")], claims=claims, nodes=[_node("a")], pods=[]
    )
    (row,) = claim_rows(cluster=found, namespace="ns", now=NOW)
    assert row.ready_cell() == "True,-"
    assert row.data_cell() == "uuid=GPU-a0,-"
    wide = render_claims([row], output="wide", all_namespaces=False).splitlines()
    assert wide[0].split()[-3:] == ["CLASSES", "REASON", "DEVICE-DATA"]
    assert wide[1].split()[-1] == "uuid=GPU-a0,-"
    as_json = json.loads(render_claims([row], output="json", all_namespaces=False))
    assert [s["device"] for s in as_json["items"][0]["deviceStatus"]] == ["gpu-0"]


def test_explain_pending_is_simulates_text(cluster: ClusterObjects) -> None:
    obj = cluster.claim("ns", "big")
    assert obj is not None
    explained = explain_claim(cluster=cluster, obj=obj, node=None, gates=FeatureGates(), policy="first-fit")
    assert explained.code == 1
    outcome = plan(
        classes=cluster.classes,
        slices=cluster.slices,
        nodes=cluster.nodes,
        allocated=[c.claim.status.allocation for c in cluster.claims if c.claim.status.allocation],
        pending=[obj.claim],
        node=None,
        gates=FeatureGates(),
        policy="first-fit",
    )
    expected = render(result_of(outcome, pending=[obj.claim], policy="first-fit")[0], "table")
    assert explained.text == expected
    assert explained.text.startswith("claim ns/big cannot be allocated on any of 2 nodes")
    assert explained.data["reason"] == "NoFit"
    assert explained.data["message"].startswith("claim ns/big cannot be allocated on any of 2 nodes")
    assert "\n" not in explained.data["message"]


def test_explain_what_if_and_allocated(cluster: ClusterObjects) -> None:
    solo = cluster.claim("ns", "solo")
    assert solo is not None
    explained = explain_claim(cluster=cluster, obj=solo, node=None, gates=FeatureGates(), policy="first-fit")
    assert explained.code == 0
    assert explained.text.splitlines() == [
        "claim ns/solo is allocated on node a by the operator.",
        "devices:",
        "  request gpu: gpu.nvidia.com/a/gpu-1 (Healthy)",
        "why it fits on node a (the allocator's checks, its own devices counted free):",
        "  request gpu: 2 devices, 2 match class gpu.nvidia.com, 2 match the selectors, 1 free, 1 untainted, "
        "1 within counters, 1 with enough capacity; needs 1",
    ]
    # What if solo went to b: b/gpu-0 is free and healthy.
    what_if = explain_claim(cluster=cluster, obj=solo, node="b", gates=FeatureGates(), policy="first-fit")
    assert what_if.code == 0
    assert "gpu.nvidia.com   b      gpu-0" in what_if.text
    assert what_if.data["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    big = cluster.claim("ns", "big")
    assert big is not None
    on_a = explain_claim(cluster=cluster, obj=big, node="a", gates=FeatureGates(), policy="first-fit")
    assert on_a.code == 1
    assert on_a.text.startswith("claim ns/big cannot be allocated on node a.")


def test_explain_shows_that_the_operator_waits_for_kube_scheduler() -> None:
    waiting = _claim("w")
    message = "kube-scheduler is placing 3 pods that could use the devices this claim would get"
    condition = {
        "type": "Allocated",
        "status": "False",
        "reason": "WaitingForScheduler",
        "message": message,
        "lastTransitionTime": "2025-01-01T11:59:00Z",
    }
    waiting["metadata"]["annotations"] = {"dra.accel.dev/condition": json.dumps(condition)}
    cluster = ClusterObjects.from_lists(
        classes=[_class()], slices=[_slice("a")], claims=[waiting], nodes=[_node("a")], pods=[]
    )
    obj = cluster.claim("ns", "w")
    assert obj is not None
    explained = explain_claim(cluster=cluster, obj=obj, node=None, gates=FeatureGates(), policy="first-fit")
    # The allocator alone would place it; the operator says why it has not yet.
    assert explained.code == 0
    assert explained.text.endswith(
        f"the operator is waiting for kube-scheduler (since 2025-01-01T11:59:00Z): {message}\n"
    )
    assert explained.data["waitingForScheduler"] == {"message": message, "since": "2025-01-01T11:59:00Z"}
    # Another reason (a NoFit condition) is not a wait for kube-scheduler.
    condition["reason"] = "NoFit"
    waiting["metadata"]["annotations"] = {"dra.accel.dev/condition": json.dumps(condition)}
    cluster = ClusterObjects.from_lists(
        classes=[_class()], slices=[_slice("a")], claims=[waiting], nodes=[_node("a")], pods=[]
    )
    obj = cluster.claim("ns", "w")
    assert obj is not None
    plain = explain_claim(cluster=cluster, obj=obj, node=None, gates=FeatureGates(), policy="first-fit")
    assert "waiting for kube-scheduler" not in plain.text
    assert plain.data["waitingForScheduler"] is None


def test_unparsable_objects_are_skipped_with_a_warning() -> None:
    bad = _claim("bad")
    bad["spec"]["devices"]["requests"][0]["exactly"]["count"] = "three"
    found = ClusterObjects.from_lists(classes=[], slices=[], claims=[bad], nodes=[], pods=[])
    assert found.claims == []
    assert len(found.warnings) == 1
    assert "ns/bad" in found.warnings[0]


def test_nodes_and_pods_are_sorted(cluster: ClusterObjects) -> None:
    assert [n.name for n in cluster.nodes] == ["a", "b"]
    assert cluster.nodes[0] == Node.make("a")


# ---- flags and errors ----------------------------------------------------------------------------


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _kubeconfig(tmp_path: Path, server: str, *, namespace: str | None = None) -> Path:
    context: dict[str, Any] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "ctx", "context": context}],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["claims", "--bogus"], "error: unrecognized arguments: --bogus; see 'kubectl dra claims --help'\n"),
        (["nosuch"], "error: argument COMMAND: invalid choice: 'nosuch'"),
        (["explain"], "error: the following arguments are required: CLAIM"),
        (["explain", "c", "--feature-gates=DRAPrioritizedList=maybe"], "error: --feature-gates: invalid"),
        (["devices", "--kubeconfig=/no/such/file"], "error: stat /no/such/file: no such file or directory\n"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv: list[str], message: str) -> None:
    code, out, err = _main(*argv)
    assert code == 2
    assert out == ""
    assert err.startswith(message)
    assert err.count("\n") == 1


def test_unknown_context_is_one_line(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, f"https://127.0.0.1:{_closed_port()}")
    code, out, err = _main("claims", f"--kubeconfig={path}", "--context=other")
    assert (code, out) == (2, "")
    assert err == 'error: context "other" does not exist\n'


@pytest.mark.parametrize("argv", [["devices"], ["claims", "-A"], ["explain", "c"]])
def test_unreachable_server_exits_2_without_a_traceback(tmp_path: Path, argv: list[str]) -> None:
    path = _kubeconfig(tmp_path, f"https://127.0.0.1:{_closed_port()}")
    code, out, err = _main(*argv, f"--kubeconfig={path}")
    assert (code, out) == (2, "")
    assert err.startswith("error: cannot reach the API server: ")
    assert err.count("\n") == 1


def test_namespace_comes_from_the_context(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, "https://127.0.0.1:1", namespace="team")
    assert cli.context_namespace(str(path), None) == "team"
    assert cli.context_namespace(str(path), "ctx") == "team"
    assert cli.kubeconfig_path(
        None, environ={"KUBECONFIG": f"/no/such:{path}", "HOME": str(tmp_path)}
    ) == str(path)
    with pytest.raises(cli.UsageError, match="no configuration has been provided"):
        cli.kubeconfig_path(None, environ={"HOME": str(tmp_path / "nowhere")})


def test_help_for_each_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("devices", "claims", "explain"):
        code, _, err = _main(command, "--help")
        assert code == 0
        assert err == ""
        assert f"usage: kubectl dra {command}" in capsys.readouterr().out


# ---- the whole command's output, pinned ------------------------------------------------------------

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "kubectl_dra"
UPDATE_GOLDEN = "KUBECTL_DRA_UPDATE_GOLDEN"
"""Set to 1 to rewrite the pinned outputs (then review the diff: output must not change by accident)."""


def _golden_lists() -> dict[str, list[dict[str, Any]]]:
    """The fixture's cluster and the cases it lacks: a device two claims share, a claim pinned by a
    label selector (its node comes from the node list), an allNodes slice, a NoExecute taint,
    pods of another namespace, a pending claim with the operator's condition."""
    shared_a = _claim("shared-a", device=("b", "gpu-0"), pod="q")
    shared_b = _claim("shared-b", device=("b", "gpu-0"), pod="r")
    by_label = _claim("by-label", device=("c", "gpu-1"), ours=True)
    by_label["status"]["allocation"]["nodeSelector"] = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]
    }
    pending = _claim("waits", created="2024-12-30T12:00:00Z")
    pending["metadata"]["annotations"] = {
        "dra.accel.dev/condition": json.dumps({"type": "Allocated", "status": "False", "reason": "NoFit"})
    }
    other = _claim("elsewhere", device=("c", "gpu-0"), pod="s")
    other["metadata"]["namespace"] = "team"
    net = {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": "fabric"},
        "spec": {
            "driver": "net.example.com",
            "allNodes": True,
            "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "link-0", "taints": [{"key": "down", "effect": "NoExecute"}]}],
        },
    }
    labelled = _node("c")
    labelled["metadata"]["labels"] = {"zone": "z1"}
    team_pod = _pod("s", "elsewhere")
    team_pod["metadata"]["namespace"] = "team"
    return {
        "deviceclasses": [_class()],
        "resourceslices": [_slice("b", tainted=(1,)), _slice("a"), _slice("c"), net],
        "resourceclaims": [
            _claim("solo", device=("a", "gpu-1"), ours=True),
            _claim(
                "p-gpu",
                device=("a", "gpu-0"),
                pod="p",
                status=_device_status("a", "gpu-0", ready="False", reason="XID", uuid="GPU-a0"),
            ),
            _claim("big", count=3, created="2025-01-01T09:00:00Z"),
            shared_a,
            shared_b,
            by_label,
            pending,
            other,
        ],
        "nodes": [_node("b"), _node("a"), labelled],
        "pods": [_pod("p", "p-gpu"), _pod("q", "shared-a"), _pod("r", "shared-b"), team_pod],
    }


class _FakeApi:
    """An API server in a thread that lists ``lists`` (in pages when asked for a limit)."""

    def __init__(self, lists: dict[str, list[dict[str, Any]]]) -> None:
        import asyncio
        import threading

        from aiohttp import web

        async def groups(_: web.Request) -> web.Response:
            version = {"groupVersion": V1, "version": "v1"}
            return web.json_response(
                {"kind": "APIGroupList", "groups": [{"name": "resource.k8s.io", "versions": [version]}]}
            )

        async def listing(request: web.Request) -> web.Response:
            items = lists[request.match_info["plural"]]
            start = int(request.query.get("continue") or 0)
            limit = int(request.query.get("limit") or 0) or len(items) or 1
            meta: dict[str, Any] = {"resourceVersion": "7"}
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
            self.requests.append(request.path_qs)
            return web.json_response({"metadata": meta, "items": items[start : start + limit]})

        self.requests: list[str] = []
        app = web.Application()
        app.router.add_get("/apis/", groups)
        app.router.add_get("/apis/resource.k8s.io/v1/{plural}", listing)
        app.router.add_get("/api/v1/{plural}", listing)
        self.port = _closed_port()
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def fake_api() -> Any:
    api = _FakeApi(_golden_lists())
    yield api
    api.close()


class _FixedClock(datetime.datetime):
    @classmethod
    def now(cls, tz: datetime.tzinfo | None = None) -> _FixedClock:
        return cls.fromtimestamp(NOW.timestamp(), tz)


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("devices.txt", ["devices"]),
        ("devices-wide.txt", ["devices", "-o", "wide"]),
        ("devices-node-b.txt", ["devices", "--node", "b"]),
        ("devices.json", ["devices", "-o", "json"]),
        ("claims-all.txt", ["claims", "-A"]),
        ("claims-all-wide.txt", ["claims", "-A", "-o", "wide"]),
        ("claims-ns.yaml", ["claims", "-n", "ns", "-o", "yaml"]),
        ("claims-team.txt", ["claims", "-n", "team"]),
    ],
)
def test_output_is_pinned(
    fake_api: _FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, argv: list[str]
) -> None:
    """The whole command, from the API's lists to its text: byte for byte what it printed before
    the command was made fast (``tests/fixtures/kubectl_dra``)."""
    monkeypatch.setattr(cli, "datetime", types.SimpleNamespace(datetime=_FixedClock, UTC=datetime.UTC))
    path = _kubeconfig(tmp_path, f"http://127.0.0.1:{fake_api.port}")
    code, out, err = _main(*argv, f"--kubeconfig={path}")
    assert (code, err) == (0, "")
    golden = GOLDEN / name
    if os.environ.get(UPDATE_GOLDEN) == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(out)
    assert out == golden.read_text()


def test_policy_flag_offers_the_planners_policies() -> None:
    """The flag's choices come from settings (the planner is imported only to explain)."""
    from dra_operator.planner import POLICIES

    assert cli.PLACEMENT_POLICIES == POLICIES


@pytest.mark.parametrize(
    ("created", "age"),
    [
        ("2025-01-01T11:57:00Z", 180.0),
        ("2025-1-1T11:57:00Z", 180.0),  # strptime's looser form still reads
        ("2025-02-30T11:57:00Z", None),
        ("yesterday", None),
        ("", None),
    ],
)
def test_claim_age(created: str, age: float | None) -> None:
    from dra_operator.kubectl_dra.claims_command import age_seconds

    assert age_seconds(created, now=NOW) == age


def test_each_command_lists_only_what_it_shows(fake_api: _FakeApi, tmp_path: Path) -> None:
    """claims reads no slices, and nodes only for an allocation not pinned by name (by-label here);
    devices reads nodes only for --node."""
    path = _kubeconfig(tmp_path, f"http://127.0.0.1:{fake_api.port}")

    def listed(*argv: str) -> set[str]:
        fake_api.requests.clear()
        assert _main(*argv, f"--kubeconfig={path}")[0] == 0
        return {r.split("?")[0].rsplit("/", 1)[1] for r in fake_api.requests}

    assert listed("claims", "-A") == {"deviceclasses", "resourceclaims", "pods", "nodes"}
    assert listed("claims", "-n", "team") == {"deviceclasses", "resourceclaims", "pods", "nodes"}
    assert listed("devices") == {"deviceclasses", "resourceslices", "resourceclaims", "pods"}
    assert listed("devices", "--node", "a") == {
        "deviceclasses",
        "resourceslices",
        "resourceclaims",
        "pods",
        "nodes",
    }
