"""``kubectl dra`` against the real control plane: the installed ``kubectl-dra`` script, run directly
and as a plugin of the cluster's kubectl, its rows checked against the cluster's objects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from dra_devcluster import LocalCluster
from dra_devcluster.cluster import free_port
from tests.integration.objects import gpu_devices, resource_slice
from tests.integration.operator.conftest import Operators, claims_json, events_for
from tests.integration.operator.objects import allocated_node, claim, claim_template, pod

SCRIPT_DIR = Path(sys.executable).parent
SCRIPT = SCRIPT_DIR / "kubectl-dra"
TAINT = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
NODES = ("kd-a", "kd-b")


def run(*args: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args, f"--kubeconfig={kubeconfig}"], capture_output=True, text=True, timeout=120
    )


def table_rows(text: str) -> list[dict[str, str]]:
    """The first table of ``text`` as dicts (header -> cell); cells hold no spaces."""
    lines = text.split("\n\n")[0].strip().splitlines()
    header = lines[0].split()
    return [dict(zip(header, line.split(), strict=True)) for line in lines[1:]]


def second_table(text: str) -> list[dict[str, str]]:
    return table_rows(text.split("\n\n", 1)[1])


def _allocated(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.wait_for(
        lambda: (
            (c := cluster.get_json("resourceclaim", name, "-n", ns)).get("status", {}).get("allocation") and c
        ),
        timeout=90,
        what=f"claim {ns}/{name} allocated",
    )
    return found


def _devices(obj: dict[str, Any]) -> list[str]:
    results = obj["status"]["allocation"]["devices"]["results"]
    return [f"{r['driver']}/{r['pool']}/{r['device']}" for r in results]


def _simulate(cluster: LocalCluster, tmp: Path, *, pending: str, ns: str, node: str | None) -> str:
    """What ``dra-operator simulate`` prints for the cluster's objects with one pending claim."""
    objects = [
        *cluster.get_json("deviceclasses")["items"],
        *cluster.get_json("resourceslices")["items"],
        *cluster.get_json("nodes")["items"],
    ]
    for c in cluster.get_json("resourceclaims", "-A")["items"]:
        mine = c["metadata"]["namespace"] == ns and c["metadata"]["name"] == pending
        if mine or (c.get("status") or {}).get("allocation"):
            objects.append(c)
    path = tmp / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}))
    argv = [sys.executable, "-m", "dra_operator.entry.cli", "simulate", "-f", str(path)]
    result = subprocess.run(
        [*argv, *(["--node", node] if node else [])], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stderr
    return result.stdout


def test_kubectl_dra_devices_claims_and_explain(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]], tmp_path: Path
) -> None:
    kubeconfig = local_cluster.kubeconfig
    ns = "kubectl-dra"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    for node in NODES:
        local_cluster.add_node(node)
        scratch.append(("node", node))
        devices = gpu_devices(2, node=node)
        if node == "kd-b":
            devices[1]["taints"] = [TAINT]
        local_cluster.apply([resource_slice(driver="gpu.nvidia.com", node=node, devices=devices)])
        scratch.append(("resourceslice", f"{node}-gpu.nvidia.com"))
    operators.start()
    cls = operators.gpu_class
    local_cluster.wait_for(
        lambda: local_cluster.kubectl("get", "deviceclass", cls, check=False).returncode == 0,
        what="the operator's DeviceClass",
    )
    # A standalone claim the operator allocates, a pod whose template claim kube-scheduler allocates.
    local_cluster.apply([claim("solo", ns, cls=cls)])
    solo = _allocated(local_cluster, ns, "solo")
    local_cluster.apply([claim_template("tpl", ns, cls=cls), pod("p", ns, template="tpl")])
    pod_claim_name = local_cluster.wait_for(
        lambda: [
            c["metadata"]["name"] for c in claims_json(local_cluster, ns) if c["metadata"]["name"] != "solo"
        ],
        what="the pod's claim",
    )[0]
    pod_claim = _allocated(local_cluster, ns, pod_claim_name)
    local_cluster.wait_for(
        lambda: (local_cluster.get_json("resourceclaim", pod_claim_name, "-n", ns).get("status") or {}).get(
            "reservedFor"
        ),
        what="the pod's claim reserved",
    )
    # Three GPUs: more than either node has.
    local_cluster.apply([claim("big", ns, cls=cls, count=3)])
    local_cluster.wait_for(
        lambda: [e for e in events_for(local_cluster, ns, "big") if e["reason"] == "NoFit"],
        what="the NoFit Event on claim big",
    )

    # ---- devices ------------------------------------------------------------------------------
    result = run("devices", kubeconfig=kubeconfig)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    rows = {(r["NODE"], r["DEVICE"]): r for r in table_rows(result.stdout)}
    assert list(table_rows(result.stdout)[0]) == [
        "NODE",
        "DRIVER",
        "DEVICE",
        "HEALTH",
        "TAINTS",
        "CLAIM",
        "POD",
    ]
    tainted = rows[("kd-b", "gpu-1")]
    assert tainted["HEALTH"] == "Unhealthy"
    assert tainted["TAINTS"] == "gpu.nvidia.com/xid=79:NoSchedule"
    assert rows[("kd-a", "gpu-0")]["TAINTS"] == "<none>"
    holders = {}
    for obj, user in ((solo, "<none>"), (pod_claim, f"{ns}/p")):
        for device in _devices(obj):
            _, pool, name = device.split("/")
            row = rows[(pool, name)]
            assert row["CLAIM"] == f"{ns}/{obj['metadata']['name']}"
            assert row["POD"] == user
            assert row["HEALTH"] == "Healthy"
            holders[(pool, name)] = row["CLAIM"]
    for key, row in rows.items():
        if key not in holders:
            assert (row["CLAIM"], row["POD"]) == ("<none>", "<none>"), row
    # Totals, from the cluster's own objects: the class takes gpu.nvidia.com devices of type gpu.
    gpus = {
        (s["spec"]["pool"]["name"], d["name"]): d
        for s in local_cluster.get_json("resourceslices")["items"]
        if s["spec"]["driver"] == "gpu.nvidia.com"
        for d in s["spec"].get("devices") or []
        if d.get("attributes", {}).get("type", {}).get("string") == "gpu"
    }
    published = list(gpus.values())
    # Only results on those devices: other tests of the session may leave allocations elsewhere.
    allocated = sum(
        1
        for c in local_cluster.get_json("resourceclaims", "-A")["items"]
        for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        if r["driver"] == "gpu.nvidia.com" and (r["pool"], r["device"]) in gpus
    )
    unhealthy = sum(1 for d in published if d.get("taints"))
    totals = {r["CLASS"]: r for r in second_table(result.stdout)}
    assert totals[cls] == {
        "CLASS": cls,
        "DEVICES": str(len(published)),
        "ALLOCATED": str(allocated),
        "UNHEALTHY": str(unhealthy),
        "FREE": str(len(published) - allocated - unhealthy),
    }
    assert (len(published), allocated, unhealthy) >= (4, 2, 1)

    # The same through kubectl's plugin mechanism, with the script's folder on PATH.
    env = {**os.environ, "PATH": f"{SCRIPT_DIR}{os.pathsep}{os.environ.get('PATH', '')}"}
    assert local_cluster.binaries is not None
    plugin = subprocess.run(
        [
            str(local_cluster.binaries.kubectl),
            "dra",
            "devices",
            f"--kubeconfig={kubeconfig}",
            "--node",
            "kd-b",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert plugin.returncode == 0, plugin.stderr
    assert {r["NODE"] for r in table_rows(plugin.stdout)} == {"kd-b"}
    assert plugin.stdout == run("devices", "--node", "kd-b", kubeconfig=kubeconfig).stdout

    wide = run("devices", "-o", "wide", "--node", "kd-a", kubeconfig=kubeconfig)
    assert all(r["CLASSES"] == cls or cls in r["CLASSES"].split(",") for r in table_rows(wide.stdout))
    assert {r["POOL"] for r in table_rows(wide.stdout)} == {"kd-a"}
    as_json = json.loads(run("devices", "-o", "json", kubeconfig=kubeconfig).stdout)
    assert as_json["kind"] == "List"
    (item,) = [i for i in as_json["items"] if (i["node"], i["device"]) == ("kd-b", "gpu-1")]
    assert item["taints"] == ["gpu.nvidia.com/xid=79:NoSchedule"]

    # ---- claims -------------------------------------------------------------------------------
    result = run("claims", "-n", ns, kubeconfig=kubeconfig)
    assert result.returncode == 0, result.stderr
    claims = {r["NAME"]: r for r in table_rows(result.stdout)}
    assert set(claims) == {"solo", pod_claim_name, "big"}
    assert claims["solo"]["STATE"] == "allocated"
    assert claims["solo"]["ALLOCATOR"] == "operator"
    assert claims["solo"]["NODE"] == allocated_node(solo)
    assert claims["solo"]["DEVICES"] == ",".join(_devices(solo))
    assert claims["solo"]["CONSUMERS"] == "<none>"
    assert claims[pod_claim_name]["STATE"] == "allocated,reserved"
    assert claims[pod_claim_name]["ALLOCATOR"] == "scheduler"
    assert claims[pod_claim_name]["NODE"] == allocated_node(pod_claim)
    assert claims[pod_claim_name]["DEVICES"] == ",".join(_devices(pod_claim))
    assert claims[pod_claim_name]["CONSUMERS"] == "pod/p"
    assert claims["big"]["STATE"] == "pending"
    assert claims["big"]["ALLOCATOR"] == "operator"
    assert claims["big"]["NODE"] == claims["big"]["DEVICES"] == "<none>"
    wide_claims = {
        r["NAME"]: r for r in table_rows(run("claims", "-n", ns, "-o", "wide", kubeconfig=kubeconfig).stdout)
    }
    assert wide_claims["big"]["REASON"] == "NoFit"
    assert wide_claims["solo"]["CLASSES"] == cls
    everywhere = table_rows(run("claims", "-A", kubeconfig=kubeconfig).stdout)
    assert {(r["NAMESPACE"], r["NAME"]) for r in everywhere} >= {(ns, "solo"), (ns, "big")}
    as_yaml = yaml.safe_load(run("claims", "-n", ns, "-o", "yaml", kubeconfig=kubeconfig).stdout)
    assert {i["name"]: i["allocator"] for i in as_yaml["items"]} == {
        "solo": "operator",
        pod_claim_name: "scheduler",
        "big": "operator",
    }

    # ---- explain: the pending claim -----------------------------------------------------------
    result = run("explain", "big", "-n", ns, kubeconfig=kubeconfig)
    assert result.returncode == 1, result.stderr
    assert result.stderr == ""
    assert result.stdout.startswith(f"claim {ns}/big cannot be allocated on any of ")
    assert result.stdout == _simulate(local_cluster, tmp_path, pending="big", ns=ns, node=None)
    # -o json carries the one-line form, which is the operator's Event and condition.
    data = json.loads(run("explain", "big", "-n", ns, "-o", "json", kubeconfig=kubeconfig).stdout)
    assert data["reason"] == "NoFit"
    assert data["explanation"] == result.stdout.rstrip("\n")
    local_cluster.wait_for(
        lambda: (
            data["message"]
            in [e["message"] for e in events_for(local_cluster, ns, "big") if e["reason"] == "NoFit"]
        ),
        what="the operator's NoFit Event with the same message",
    )
    # What if it went to kd-a.
    what_if = run("explain", "big", "-n", ns, "--node", "kd-a", kubeconfig=kubeconfig)
    assert what_if.returncode == 1
    assert what_if.stdout.startswith(f"claim {ns}/big cannot be allocated on node kd-a.")
    assert what_if.stdout == _simulate(local_cluster, tmp_path, pending="big", ns=ns, node="kd-a")

    # ---- explain: allocated claims ------------------------------------------------------------
    solo_node = allocated_node(solo)
    result = run("explain", "solo", "-n", ns, kubeconfig=kubeconfig)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"claim {ns}/solo is allocated on node {solo_node} by the operator."
    assert lines[2] == f"  request gpu: {_devices(solo)[0]} (Healthy)"
    assert lines[3] == (
        f"why it fits on node {solo_node} (the allocator's checks, its own devices counted free):"
    )
    assert lines[4].startswith(f"  request gpu: 2 devices, 2 match class {cls}, 2 match the selectors, ")
    result = run("explain", pod_claim_name, "-n", ns, kubeconfig=kubeconfig)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        f"claim {ns}/{pod_claim_name} is allocated on node {allocated_node(pod_claim)} by kube-scheduler "
        "(or another allocator), reserved for pod/p."
    )
    # What if solo went to the other node: it fits when that node has a healthy device nobody holds.
    other = next(n for n in NODES if n != solo_node)
    held = {d for c in (solo, pod_claim) for d in _devices(c)}
    free_there = [d for d in ("gpu-0",) if f"gpu.nvidia.com/{other}/{d}" not in held]
    result = run("explain", "solo", "-n", ns, "--node", other, kubeconfig=kubeconfig)
    if free_there:
        assert result.returncode == 0, result.stdout
        assert f"allocated 1 claim on node {other}" in result.stdout
    else:
        assert result.returncode == 1, result.stdout
        assert result.stdout.startswith(f"claim {ns}/solo cannot be allocated on node {other}.")

    # ---- errors: one line on stderr, exit 2, never a traceback --------------------------------
    result = run("explain", "nosuch", "-n", ns, kubeconfig=kubeconfig)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f'error: resourceclaims.resource.k8s.io "nosuch" not found in namespace "{ns}"\n'
    closed = tmp_path / "closed.kubeconfig"
    config = yaml.safe_load(kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    closed.write_text(yaml.safe_dump(config))
    for argv in (["devices"], ["claims", "-A"], ["explain", "big", "-n", ns]):
        result = run(*argv, kubeconfig=closed)
        assert result.returncode == 2, result
        assert result.stdout == ""
        assert result.stderr.startswith("error: cannot reach the API server"), result.stderr
        assert result.stderr.count("\n") == 1
        assert "Traceback" not in result.stderr
    result = run("claims", "--output=table", kubeconfig=kubeconfig)
    assert result.returncode == 2
    assert result.stderr.startswith("error: argument -o/--output: invalid choice")
    assert result.stderr.count("\n") == 1
