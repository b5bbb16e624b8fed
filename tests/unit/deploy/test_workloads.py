"""Security context, resources, probes, images and node placement of the rendered workloads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy.render import (
    BASE_DIR,
    OVERLAYS,
    Obj,
    containers,
    of_kind,
    one,
    overlay_dir,
    pod_specs,
    render,
)

AGENT_HOST_PATHS = {
    "/var/lib/kubelet/plugins_registry",
    "/var/lib/kubelet/plugins",
    "/var/run/cdi",
    "/var/lib/accel-dra",
}
DEVICE_OVERLAYS = {"gpu": "--backends=nvidia", "tpu": "--backends=tpu"}


def _effective(spec: Obj, container: Obj, key: str) -> Any:
    """A security setting as the container gets it: its own, else the pod's."""
    return container.get("securityContext", {}).get(key, spec.get("securityContext", {}).get(key))


def _daemonset(objs: list[Obj]) -> tuple[Obj, Obj, Obj]:
    (daemonset,) = of_kind(objs, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return daemonset, spec, container


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_is_hardened_and_bounded(rendered: dict[str, list[Obj]], overlay: str) -> None:
    workloads = list(pod_specs(rendered[overlay]))
    assert {w["kind"] for w, _ in workloads} == {"Deployment", "DaemonSet"}
    for workload, spec in workloads:
        for host_namespace in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(host_namespace), f"{workload['kind']} uses {host_namespace}"
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in containers(spec):
            where = f"{overlay}: {workload['kind']} container {container['name']}"
            assert _effective(spec, container, "readOnlyRootFilesystem") is True, where
            resources = container["resources"]
            for kind in ("requests", "limits"):
                assert set(resources[kind]) >= {"cpu", "memory"}, where
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                assert probe in container, f"{where} has no {probe}"
            if not _effective(spec, container, "privileged"):
                assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], where
                assert "add" not in container["securityContext"]["capabilities"], where
                assert _effective(spec, container, "allowPrivilegeEscalation") is False, where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_operator_runs_as_non_root_with_a_standby(rendered: dict[str, list[Obj]], overlay: str) -> None:
    deployment = one(rendered[overlay], "Deployment", "accel-dra-operator")
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert _effective(spec, container, "runAsNonRoot") is True
    assert _effective(spec, container, "runAsUser") == 65532
    assert not _effective(spec, container, "privileged")
    assert container["command"] == ["dra-operator"]
    assert container["args"][0] == "run"
    assert {p["containerPort"] for p in container["ports"]} == {8080}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # Two instances; peering (random priorities per instance) keeps one of them active.
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    budgets = of_kind(rendered[overlay], "PodDisruptionBudget")
    assert [b["spec"]["minAvailable"] for b in budgets] == [1]
    assert budgets[0]["spec"]["selector"] == deployment["spec"]["selector"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert not [v for v in spec.get("volumes", []) if "hostPath" in v]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_privileges_depend_on_the_backend(rendered: dict[str, list[Obj]], overlay: str) -> None:
    _, spec, container = _daemonset(rendered[overlay])
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert container["command"] == ["dra-node-agent"]
    assert container["args"][0] == "run"
    if overlay in DEVICE_OVERLAYS:
        assert container["securityContext"]["privileged"] is True
        assert DEVICE_OVERLAYS[overlay] in container["args"]
        assert "/dev" in host_paths
        assert host_paths - {"/dev", "/", "/sys/fs/cgroup"} == AGENT_HOST_PATHS
        # Only the NVIDIA backend needs the host's driver libraries, and only read-only.
        assert ("/" in host_paths) == (overlay == "gpu")
        assert ("--driver-root=/driver-root" in container["args"]) == (overlay == "gpu")
        # Only it runs MPS daemons: in cgroups of their own in the node's hierarchy, with each
        # claim's shm tmpfs mounted under the state folder and propagated to the host.
        assert ("/sys/fs/cgroup" in host_paths) == (overlay == "gpu")
        assert ("--cgroup-root=/host/sys/fs/cgroup" in container["args"]) == (overlay == "gpu")
        state = next(m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/accel-dra")
        assert (state.get("mountPropagation") == "Bidirectional") == (overlay == "gpu")
        root_volumes = {v["name"] for v in spec["volumes"] if v.get("hostPath", {}).get("path") == "/"}
        for mount in container["volumeMounts"]:
            if mount["name"] in root_volumes:
                assert mount.get("readOnly") is True
    else:
        assert not _effective(spec, container, "privileged")
        assert host_paths == AGENT_HOST_PATHS, "simulated agent mounts more of the host than it needs"
        assert any(a.startswith("--simulate-profile=") for a in container["args"])
        assert not any(a.startswith("--backends") for a in container["args"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_rollout_keeps_prepared_claims(rendered: dict[str, list[Obj]], overlay: str) -> None:
    daemonset, spec, container = _daemonset(rendered[overlay])
    strategy = daemonset["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    # The new pod starts beside the old one (per-pod socket names from POD_UID) and the old one
    # stops only once the new one is ready, which is once the kubelet registered it.
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0
    assert strategy["rollingUpdate"]["maxSurge"] == 1
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    # The checkpoint outlives the pod only on the host.
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    for path in AGENT_HOST_PATHS:
        assert volumes[mounts[path]]["hostPath"]["path"] == path, f"{path} is not the host's {path}"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    tolerated = {(t["key"], t["operator"]) for t in spec["tolerations"]}
    assert {("nvidia.com/gpu", "Exists"), ("google.com/tpu", "Exists")} <= tolerated
    assert {p["containerPort"] for p in container["ports"]} == {8081}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def _required_node_keys(spec: Obj) -> set[str]:
    affinity = spec.get("affinity", {}).get("nodeAffinity", {})
    terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    return {expr["key"] for term in terms for expr in term.get("matchExpressions", [])} | set(
        spec.get("nodeSelector", {})
    )


@pytest.mark.parametrize(
    ("overlay", "keys"),
    [
        ("gpu", {"nvidia.com/gpu.present", "cloud.google.com/gke-accelerator"}),
        ("tpu", {"cloud.google.com/gke-tpu-accelerator"}),
        ("simulated", set()),
    ],
)
def test_overlays_place_the_agent(rendered: dict[str, list[Obj]], overlay: str, keys: set[str]) -> None:
    _, spec, _ = _daemonset(rendered[overlay])
    assert _required_node_keys(spec) == keys


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_image_for_both_components(rendered: dict[str, list[Obj]], overlay: str) -> None:
    images = {c["image"] for _, spec in pod_specs(rendered[overlay]) for c in containers(spec)}
    kustomization = yaml.safe_load((overlay_dir(overlay) / "kustomization.yaml").read_text())
    (entry,) = [i for i in kustomization["images"] if i["name"] == "accel-dra"]
    assert images == {f"{entry['newName']}:{entry['newTag']}"}
    (image,) = images
    assert not image.endswith(":latest")


def test_base_alone_is_the_least_privileged_agent(kubectl: Path) -> None:
    objs = render(BASE_DIR, kubectl=kubectl)
    _, spec, container = _daemonset(objs)
    assert container["securityContext"]["privileged"] is False
    assert {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v} == AGENT_HOST_PATHS
    assert "affinity" not in spec
