"""What the local cluster changes on the product's workloads (``localnode.adapt``): the pod network
and the replicas stay as shipped; only the API server's address, the node and the agent's folders
change, and a workload put on the host network also gets a free port and one replica."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
import yaml

from tests.integration.deploy import localnode
from tests.integration.deploy.localnode import API_NAME, LocalNode, adapt
from tests.unit.deploy.render import Obj

LOCAL = LocalNode(
    node="n-1",
    apiserver_port="6443",
    gateway="10.244.3.1",
    registry_dir="/tmp/n/kubelet/plugins_registry",
    plugins_dir="/tmp/n/kubelet/plugins",
    cdi_dir="/tmp/n/cdi",
    state_dir="/tmp/n/state",
)


def _workloads(rendered: dict[str, list[Obj]]) -> dict[str, Obj]:
    objects = copy.deepcopy(rendered["simulated"])
    return {o["kind"]: o for o in objects if o["kind"] in ("Deployment", "DaemonSet")}


def _env(workload: dict[str, Any]) -> dict[str, str]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_pods_stay_on_the_pod_network_and_reach_the_api_server_through_the_nodes_relay(
    rendered: dict[str, list[Obj]],
) -> None:
    shipped = _workloads(rendered)
    adapted = copy.deepcopy(shipped)
    adapt(list(adapted.values()), LOCAL)
    for kind, workload in adapted.items():
        spec = workload["spec"]["template"]["spec"]
        assert not spec.get("hostNetwork"), kind
        assert spec["hostAliases"] == [{"ip": "10.244.3.1", "hostnames": [API_NAME]}]
        assert spec["nodeSelector"] == {"kubernetes.io/hostname": "n-1"}
        env = _env(workload)
        assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (API_NAME, "6443")
        (container,) = spec["containers"]
        (before,) = shipped[kind]["spec"]["template"]["spec"]["containers"]
        assert container["ports"] == before["ports"], kind
    assert adapted["Deployment"]["spec"]["replicas"] == shipped["Deployment"]["spec"]["replicas"] == 2
    (agent,) = adapted["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert "--kubelet-plugins-dir=/tmp/n/kubelet/plugins" in agent["args"]
    assert "--cdi-dir=/tmp/n/cdi" in agent["args"]


def test_a_host_network_workload_gets_loopback_a_free_port_and_one_replica(
    rendered: dict[str, list[Obj]],
) -> None:
    deployment = _workloads(rendered)["Deployment"]
    deployment["spec"]["template"]["spec"]["hostNetwork"] = True
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    container["env"] = [*container.get("env", []), {"name": "KUBERNETES_SERVICE_HOST", "value": "x"}]
    adapt([deployment], LOCAL)
    env = _env(deployment)
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "6443")
    assert [e["name"] for e in container["env"]].count("KUBERNETES_SERVICE_HOST") == 1
    assert deployment["spec"]["replicas"] == 1
    port = container["ports"][0]["containerPort"]
    assert f"--metrics-port={port}" in container["args"]
    assert "hostAliases" not in deployment["spec"]["template"]["spec"]


def test_the_post_renderer_reads_and_writes_yaml_documents(
    rendered: dict[str, list[Obj]], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = yaml.safe_dump_all(list(_workloads(rendered).values()))
    monkeypatch.setattr("sys.stdin", io.StringIO(documents))
    assert localnode.main([LOCAL.to_json()]) == 0
    out = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert {o["kind"] for o in out} == {"Deployment", "DaemonSet"}
    assert all(o["spec"]["template"]["spec"]["hostAliases"] for o in out)
