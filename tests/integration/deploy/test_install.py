"""Install the CRDs and every overlay on a real control plane, and prove the permissions hold.

What runs: `kubectl apply -k` for real (not a dry run), the DaemonSet controller placing agent pods by
the overlays' node affinity, SubjectAccessReviews for both ServiceAccounts, and the node-scoped
ResourceSlice admission policy exercised with a ServiceAccount token bound to a pod on a node, the
same kind of token the agent gets from the kubelet. The images never run (no kubelet here).

The install is removed afterwards (workloads, namespace, cluster-scoped objects, CRDs), so the
suites sharing the session's cluster find it as it was.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_devcluster import LocalCluster
from dra_devcluster.cluster import free_port
from tests.unit.deploy.render import (
    AGENT_SA,
    CRDS_DIR,
    EXAMPLES_DIR,
    NAMESPACE,
    OPERATOR_SA,
    PEERING_NAME,
    overlay_dir,
    service_account_username,
)

pytestmark = pytest.mark.cluster

POLICY = "accel-dra-resourceslices-own-node"
NODE_A = "deploy-node-a"
NODE_B = "deploy-node-b"
GPU_NODE = "deploy-gpu-node"
TPU_NODE = "deploy-tpu-node"
PLAIN_NODE = "deploy-plain-node"
NODES = {
    NODE_A: {},
    NODE_B: {},
    GPU_NODE: {"nvidia.com/gpu.present": "true"},
    TPU_NODE: {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"},
    PLAIN_NODE: {},
}
# The overlays in the order the test applies them; the last one stays for the permission tests.
OVERLAY_ORDER = ("gpu", "tpu", "simulated")
PLACEMENT = {
    "gpu": {GPU_NODE},
    "tpu": {TPU_NODE},
    "simulated": set(NODES),
}
PROBE_POD = "agent-token-probe"


def _agent_pods_on_our_nodes(cluster: LocalCluster) -> dict[str, str]:
    """node -> agent pod name, for the test's own nodes (other suites may add nodes)."""
    pods = cluster.get_json("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=accel-dra-node-agent")
    placed = {}
    for pod in pods["items"]:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        node = terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
        if node in NODES:
            placed[node] = pod["metadata"]["name"]
    return placed


def _force_delete_pods(cluster: LocalCluster, namespace: str) -> None:
    # Pods bound to nodes without a kubelet never finish terminating on their own.
    cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--force", "--grace-period=0",
                    "--ignore-not-found", "--wait=false", check=False)  # fmt: skip


def _teardown(cluster: LocalCluster) -> None:
    cluster.kubectl("delete", "-k", str(overlay_dir(OVERLAY_ORDER[-1])), "--ignore-not-found", "--wait=false",
                    check=False)  # fmt: skip

    def namespace_gone() -> bool:
        # Again on every pass: a pod created just before its DaemonSet went would block the namespace.
        _force_delete_pods(cluster, NAMESPACE)
        return cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0

    cluster.wait_for(namespace_gone, timeout=120, interval=2, what=f"namespace {NAMESPACE} to be deleted")
    cluster.kubectl("delete", "-k", str(CRDS_DIR), "--ignore-not-found", check=False)
    cluster.kubectl("delete", "resourceslices", "-l", "accel-dra-test=deploy", "--ignore-not-found",
                    check=False)  # fmt: skip
    for node in NODES:
        cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture(scope="module")
def installed(local_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """CRDs applied and established, the test's nodes present; the overlays are applied by the tests."""
    cluster = local_cluster
    for node, labels in NODES.items():
        cluster.add_node(node, labels=labels)
        # Node admission taints new nodes not-ready; with no node-lifecycle controller to lift it
        # once Ready, the DaemonSet controller would place no agent (DaemonSets do not tolerate it).
        cluster.kubectl("taint", "node", node, "node.kubernetes.io/not-ready:NoSchedule-", check=False)
    # The agent tests give their agents the TPU install's role on the same ServiceAccount: this test
    # starts from an install without it, as a new cluster would be.
    cluster.kubectl(
        "delete",
        "-f",
        str(overlay_dir("tpu") / "node-agent-tpu-workloads.yaml"),
        "--ignore-not-found",
    )
    try:
        cluster.kubectl("apply", "-k", str(CRDS_DIR))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        "crd/clusterkopfpeerings.kopf.dev", "crd/kopfpeerings.kopf.dev")  # fmt: skip
        yield cluster
    finally:
        _teardown(cluster)


def _rendered_refs(cluster: LocalCluster, overlay: str) -> set[tuple[str, str]]:
    """(kind.group/name, namespace or "") of what an overlay renders, as kubectl delete takes them."""
    text = cluster.kubectl("kustomize", str(overlay_dir(overlay))).stdout
    refs = set()
    for obj in yaml.safe_load_all(text):
        if obj:
            group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
            kind = f"{obj['kind'].lower()}.{group}" if group else obj["kind"].lower()
            refs.add((f"{kind}/{obj['metadata']['name']}", obj["metadata"].get("namespace", "")))
    return refs


# What the agent may read only where multi-host TPU needs it; recorded after each overlay.
WORKLOAD_READS = [("get", "", "pods"), ("get", "batch", "jobs")]


@dataclass
class Applied:
    placements: dict[str, dict[str, str]]
    """overlay -> node -> the agent pod the DaemonSet controller put there"""
    workload_reads: dict[str, list[bool]]
    """overlay -> whether the agent may do each of WORKLOAD_READS with it installed"""


@pytest.fixture(scope="module")
def overlays_applied(installed: LocalCluster) -> Applied:
    """Apply each overlay in turn, removing what the previous one had and this one has not (as
    `kubectl apply --prune` would); record where the DaemonSet controller put the agent pods."""
    cluster = installed
    applied = Applied(placements={}, workload_reads={})
    previous: set[tuple[str, str]] = set()
    for overlay in OVERLAY_ORDER:
        cluster.kubectl("apply", "-k", str(overlay_dir(overlay)))
        current = _rendered_refs(cluster, overlay)
        for ref, namespace in sorted(previous - current):
            cluster.kubectl("delete", ref, *(["-n", namespace] if namespace else []), "--ignore-not-found")
        previous = current
        expected = PLACEMENT[overlay]
        # Pods of the previous overlay that no longer fit are deleted by the DaemonSet controller; they
        # only go away once forced (no kubelet), so clear them and wait for the new placement.
        _force_delete_pods(cluster, NAMESPACE)
        applied.placements[overlay] = cluster.wait_for(
            lambda expected=expected: (
                (placed := _agent_pods_on_our_nodes(cluster)) and set(placed) == expected and placed
            ),
            timeout=90,
            what=f"agent pods of overlay {overlay} on exactly {sorted(expected)}",
        )
        applied.workload_reads[overlay] = _settled_workload_reads(cluster, tpu=overlay == "tpu")
    return applied


def _settled_workload_reads(cluster: LocalCluster, *, tpu: bool) -> list[bool]:
    """Whether the agent may do each of WORKLOAD_READS, once the API server's RBAC caught up with the
    roles just applied or deleted (or what it still answers after a while)."""
    seen: list[list[bool]] = []

    def settled() -> bool:
        seen.append([_agent_may(cluster, verb, group, resource) for verb, group, resource in WORKLOAD_READS])
        return seen[-1] == [tpu] * len(WORKLOAD_READS)

    with contextlib.suppress(TimeoutError):
        cluster.wait_for(settled, timeout=15, what="RBAC to follow the overlay")
    return seen[-1]


def test_crds_are_served(installed: LocalCluster) -> None:
    installed.kubectl("get", "clusterkopfpeerings.kopf.dev")
    # The schema keeps Kopf's keep-alive records (a structural schema would prune unknown fields).
    installed.apply([{"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                      "metadata": {"name": "schema-check", "namespace": "default"},
                      "status": {"someone@host": {"priority": 7, "lifetime": 60,
                                                  "lastseen": "2026-01-01T00:00:00+00:00"}}}])  # fmt: skip
    try:
        stored = installed.get_json("kopfpeering", "schema-check", "-n", "default")
        assert stored["status"]["someone@host"]["priority"] == 7
    finally:
        installed.kubectl("delete", "kopfpeering", "schema-check", "-n", "default")


def test_each_overlay_applies_and_places_the_agent(overlays_applied: Applied) -> None:
    for overlay, placed in overlays_applied.placements.items():
        assert set(placed) == PLACEMENT[overlay], overlay


def _agent_may(cluster: LocalCluster, verb: str, group: str, resource: str) -> bool:
    row = (AGENT_SA, verb, group, resource, "", "x", "team-a", True)
    answer = yaml.safe_load(
        cluster.kubectl("create", "-f", "-", "-o", "yaml", input=yaml.safe_dump(_review(row))).stdout
    )
    return bool(answer["status"].get("allowed"))


def test_only_the_tpu_overlay_lets_the_agent_read_pods_and_jobs(overlays_applied: Applied) -> None:
    """Pod specs carry environment literals: the agent reads pods and Jobs only for multi-host TPU."""
    assert overlays_applied.workload_reads == {
        "gpu": [False, False],
        "tpu": [True, True],
        "simulated": [False, False],
    }


def test_installed_objects_match_the_last_overlay(installed: LocalCluster, overlays_applied: Any) -> None:
    daemonset = installed.get_json("daemonset", "accel-dra-node-agent", "-n", NAMESPACE)
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert any(arg.startswith("--simulate-profile=") for arg in container["args"])
    assert not container["securityContext"].get("privileged")
    installed.get_json("clusterkopfpeering", PEERING_NAME)
    classes = installed.get_json("deviceclasses", "-l", "app.kubernetes.io/managed-by=accel-dra-operator")
    assert {c["metadata"]["name"] for c in classes["items"]} == {"gpu.nvidia.com", "mig.nvidia.com",
                                                                 "tpu.google.com"}  # fmt: skip
    # The operator's pods passed admission under its ServiceAccount.
    pods = installed.get_json("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=accel-dra-operator")[
        "items"
    ]
    assert pods
    assert {p["spec"]["serviceAccountName"] for p in pods} == {OPERATOR_SA}


# (service account, verb, group, resource, subresource, name, namespace, allowed)
ACCESS_TABLE: list[tuple[str, str, str, str, str, str, str, bool]] = [
    # the operator: what it needs
    (OPERATOR_SA, "list", "resource.k8s.io", "deviceclasses", "", "", "", True),
    (OPERATOR_SA, "watch", "resource.k8s.io", "deviceclasses", "", "", "", True),
    (OPERATOR_SA, "create", "resource.k8s.io", "deviceclasses", "", "", "", True),
    (OPERATOR_SA, "patch", "resource.k8s.io", "deviceclasses", "", "gpu.nvidia.com", "", True),
    (OPERATOR_SA, "update", "resource.k8s.io", "deviceclasses", "", "tpu.google.com", "", True),
    (OPERATOR_SA, "watch", "resource.k8s.io", "resourceclaims", "", "", "", True),
    (OPERATOR_SA, "patch", "resource.k8s.io", "resourceclaims", "", "c", "team-a", True),
    (OPERATOR_SA, "update", "resource.k8s.io", "resourceclaims", "status", "c", "team-a", True),
    (OPERATOR_SA, "patch", "resource.k8s.io", "resourceclaims", "binding", "c", "team-a", True),
    (OPERATOR_SA, "update", "resource.k8s.io", "resourceclaims", "binding", "c", "team-a", True),
    (OPERATOR_SA, "list", "resource.k8s.io", "resourceslices", "", "", "", True),
    (OPERATOR_SA, "delete", "resource.k8s.io", "resourceslices", "", "gone-node-gpu", "", True),
    (OPERATOR_SA, "watch", "", "nodes", "", "", "", True),
    (OPERATOR_SA, "list", "", "pods", "", "", "", True),
    (OPERATOR_SA, "create", "", "events", "", "", "team-a", True),
    (OPERATOR_SA, "patch", "events.k8s.io", "events", "", "e", "team-a", True),
    (OPERATOR_SA, "watch", "kopf.dev", "clusterkopfpeerings", "", "", "", True),
    (OPERATOR_SA, "patch", "kopf.dev", "clusterkopfpeerings", "", PEERING_NAME, "", True),
    (OPERATOR_SA, "watch", "apiextensions.k8s.io", "customresourcedefinitions", "", "", "", True),
    # the operator: what it must not do
    (OPERATOR_SA, "patch", "resource.k8s.io", "deviceclasses", "", "someone-elses-class", "", False),
    (OPERATOR_SA, "delete", "resource.k8s.io", "deviceclasses", "", "gpu.nvidia.com", "", False),
    (OPERATOR_SA, "create", "resource.k8s.io", "resourceclaims", "", "", "team-a", False),
    (OPERATOR_SA, "delete", "resource.k8s.io", "resourceclaims", "", "c", "team-a", False),
    (
        OPERATOR_SA,
        "arbitrary-node:update",
        "resource.k8s.io",
        "resourceclaims",
        "driver",
        "gpu.nvidia.com",
        "team-a",
        False,
    ),
    (OPERATOR_SA, "create", "resource.k8s.io", "resourceslices", "", "", "", False),
    (OPERATOR_SA, "update", "resource.k8s.io", "resourceslices", "", "node-a-gpu", "", False),
    (OPERATOR_SA, "patch", "kopf.dev", "clusterkopfpeerings", "", "default", "", False),
    (OPERATOR_SA, "update", "", "nodes", "", "node-a", "", False),
    (OPERATOR_SA, "create", "", "pods", "", "", "team-a", False),
    (OPERATOR_SA, "get", "", "secrets", "", "", NAMESPACE, False),
    (OPERATOR_SA, "create", "", "serviceaccounts", "token", AGENT_SA, NAMESPACE, False),
    # the node agent: what it needs
    (AGENT_SA, "create", "resource.k8s.io", "resourceslices", "", "", "", True),
    (AGENT_SA, "update", "resource.k8s.io", "resourceslices", "", "node-a-gpu", "", True),
    (AGENT_SA, "delete", "resource.k8s.io", "resourceslices", "", "node-a-gpu", "", True),
    (AGENT_SA, "watch", "resource.k8s.io", "resourceslices", "", "", "", True),
    (AGENT_SA, "get", "resource.k8s.io", "resourceclaims", "", "c", "team-a", True),
    (AGENT_SA, "get", "", "nodes", "", "node-a", "", True),
    (AGENT_SA, "create", "", "events", "", "", "team-a", True),
    (AGENT_SA, "create", "events.k8s.io", "events", "", "", "team-a", True),
    # KEP-4817 device status: a PUT of the claim's status, and its own drivers' entries on the node
    # its token is bound to (the API server's granular check of resourceclaims/driver).
    (AGENT_SA, "update", "resource.k8s.io", "resourceclaims", "status", "c", "team-a", True),
    (
        AGENT_SA,
        "associated-node:update",
        "resource.k8s.io",
        "resourceclaims",
        "driver",
        "gpu.nvidia.com",
        "team-a",
        True,
    ),
    (
        AGENT_SA,
        "associated-node:update",
        "resource.k8s.io",
        "resourceclaims",
        "driver",
        "tpu.google.com",
        "team-a",
        True,
    ),
    # the node agent: what it must not do
    (AGENT_SA, "list", "resource.k8s.io", "resourceclaims", "", "", "", False),
    (AGENT_SA, "patch", "resource.k8s.io", "resourceclaims", "status", "c", "team-a", False),
    (AGENT_SA, "update", "resource.k8s.io", "resourceclaims", "", "c", "team-a", False),
    (
        AGENT_SA,
        "arbitrary-node:update",
        "resource.k8s.io",
        "resourceclaims",
        "driver",
        "gpu.nvidia.com",
        "team-a",
        False,
    ),
    (
        AGENT_SA,
        "associated-node:update",
        "resource.k8s.io",
        "resourceclaims",
        "driver",
        "other.example.com",
        "team-a",
        False,
    ),
    (AGENT_SA, "patch", "resource.k8s.io", "resourceclaims", "binding", "c", "team-a", False),
    (AGENT_SA, "patch", "resource.k8s.io", "resourceslices", "", "node-a-gpu", "", False),
    (AGENT_SA, "deletecollection", "resource.k8s.io", "resourceslices", "", "", "", False),
    (AGENT_SA, "create", "resource.k8s.io", "deviceclasses", "", "", "", False),
    (AGENT_SA, "list", "", "nodes", "", "", "", False),
    (AGENT_SA, "update", "", "nodes", "", "node-a", "", False),
    (AGENT_SA, "list", "", "pods", "", "", "", False),
    # Only the TPU overlay reads pods and Jobs (test_only_the_tpu_overlay_lets_the_agent_read_pods_and_jobs).
    (AGENT_SA, "get", "", "pods", "", "p", "team-a", False),
    (AGENT_SA, "get", "batch", "jobs", "", "j", "team-a", False),
    (AGENT_SA, "get", "", "secrets", "", "", NAMESPACE, False),
    (AGENT_SA, "patch", "kopf.dev", "clusterkopfpeerings", "", PEERING_NAME, "", False),
]


def _review(row: tuple[str, str, str, str, str, str, str, bool]) -> dict[str, Any]:
    account, verb, group, resource, subresource, name, namespace, _ = row
    attributes = {"verb": verb, "group": group, "resource": resource, "subresource": subresource,
                  "name": name, "namespace": namespace}  # fmt: skip
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": service_account_username(NAMESPACE, account),
            # The groups every ServiceAccount token carries, so group grants count as they would.
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{NAMESPACE}",
                "system:authenticated",
            ],
            "resourceAttributes": {k: v for k, v in attributes.items() if v},
        },
    }


def test_service_accounts_can_do_exactly_what_they_need(
    installed: LocalCluster, overlays_applied: Any
) -> None:
    text = yaml.safe_dump_all([_review(row) for row in ACCESS_TABLE])
    output = installed.kubectl("create", "-f", "-", "-o", "yaml", input=text).stdout
    answers = [doc for doc in yaml.safe_load_all(output) if doc]
    assert len(answers) == len(ACCESS_TABLE)
    wrong = [
        f"{row[0]} {row[1]} {row[3]}{'/' + row[4] if row[4] else ''} {row[5]!r} in {row[6] or 'cluster'}: "
        f"expected {'allowed' if row[7] else 'denied'}, got {answer['status']}"
        for row, answer in zip(ACCESS_TABLE, answers, strict=True)
        if bool(answer["status"].get("allowed")) != row[7]
    ]
    assert wrong == []


def _slice(name: str, *, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"accel-dra-test": "deploy"}},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        },
    }


@pytest.fixture(scope="module")
def agent_kubeconfig(installed: LocalCluster, overlays_applied: Any) -> Iterator[Path]:
    """A kubeconfig with the agent ServiceAccount's token bound to a pod on node A."""
    cluster = installed
    cluster.apply([{
        "apiVersion": "v1",
        "kind": "Pod",
        # Labels unlike the DaemonSet's, so its controller does not adopt the pod.
        "metadata": {"name": PROBE_POD, "namespace": NAMESPACE, "labels": {"accel-dra-test": "deploy"}},
        "spec": {
            "serviceAccountName": AGENT_SA,
            "nodeName": NODE_A,
            "containers": [{"name": "probe", "image": "accel-dra:0.1.0", "command": ["sleep", "infinity"]}],
        },
    }])  # fmt: skip
    token = cluster.kubectl("create", "token", AGENT_SA, "-n", NAMESPACE, "--bound-object-kind=Pod",
                            f"--bound-object-name={PROBE_POD}", "--duration=1h").stdout.strip()  # fmt: skip
    yield cluster.kubeconfig_for_token(token, name="deploy-agent-on-node-a")
    cluster.kubectl("delete", "pod", PROBE_POD, "-n", NAMESPACE, "--force", "--grace-period=0",
                    "--ignore-not-found", check=False)  # fmt: skip


def _as_agent(
    cluster: LocalCluster, kubeconfig: Path, *args: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    # Client-side validation would list CRDs, which the agent may not; the server validates anyway.
    if args and args[0] in ("create", "replace"):
        args = (*args, "--validate=false")
    return cluster.kubectl(*args, input=input, check=False, kubeconfig=kubeconfig)


def _replace_with_label(
    cluster: LocalCluster, kubeconfig: Path, name: str, *, label: str
) -> subprocess.CompletedProcess[str]:
    """Update (PUT, as the agent's publisher does; it has no patch right) a slice with a new label."""
    body = cluster.get_json("resourceslice", name)
    key, _, value = label.partition("=")
    body["metadata"].setdefault("labels", {})[key] = value
    return _as_agent(cluster, kubeconfig, "replace", "-f", "-", input=json.dumps(body))


def test_agent_token_carries_its_node(installed: LocalCluster, agent_kubeconfig: Path) -> None:
    answer = _as_agent(installed, agent_kubeconfig, "auth", "whoami", "-o", "json")
    assert answer.returncode == 0, answer.stderr
    review = json.loads(answer.stdout)
    user = review["status"]["userInfo"]
    assert user["username"] == service_account_username(NAMESPACE, AGENT_SA)
    assert user["extra"]["authentication.kubernetes.io/node-name"] == [NODE_A]


def test_agent_writes_only_its_own_nodes_slices(installed: LocalCluster, agent_kubeconfig: Path) -> None:
    cluster = installed
    own, other = f"{NODE_A}-gpu", f"{NODE_B}-gpu"

    # Its own node: create, update, delete all pass.
    created = _as_agent(
        cluster, agent_kubeconfig, "create", "-f", "-", input=json.dumps(_slice(own, node=NODE_A))
    )
    assert created.returncode == 0, created.stderr
    relabelled = _replace_with_label(cluster, agent_kubeconfig, own, label="generation=2")
    assert relabelled.returncode == 0, relabelled.stderr
    # Nor can it move its slice to another node (validation refuses first; the policy would too).
    moved = cluster.get_json("resourceslice", own)
    moved["spec"]["nodeName"] = NODE_B
    refused = _as_agent(cluster, agent_kubeconfig, "replace", "-f", "-", input=json.dumps(moved))
    assert refused.returncode != 0
    assert "spec.nodeName" in refused.stderr, refused.stderr

    # Another node: creating is refused by the policy, with its message.
    denied = _as_agent(
        cluster, agent_kubeconfig, "create", "-f", "-", input=json.dumps(_slice(other, node=NODE_B))
    )
    assert denied.returncode != 0
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in denied.stderr
    expected = f"accel-dra node agent on node {NODE_A}: CREATE of ResourceSlice {other} denied"
    assert f'{expected}: it belongs to node "{NODE_B}"' in denied.stderr, denied.stderr
    assert cluster.kubectl("get", "resourceslice", other, check=False).returncode != 0

    # Another node's existing slice (written by an admin): no update, no delete.
    cluster.apply([_slice(other, node=NODE_B)])
    for operation, refused in (
        ("UPDATE", _replace_with_label(cluster, agent_kubeconfig, other, label="taken=yes")),
        ("DELETE", _as_agent(cluster, agent_kubeconfig, "delete", "resourceslice", other)),
    ):
        assert refused.returncode != 0, operation
        assert f"ValidatingAdmissionPolicy '{POLICY}'" in refused.stderr, refused.stderr
        assert f'{operation} of ResourceSlice {other} denied: it belongs to node "{NODE_B}"' in refused.stderr
    assert cluster.get_json("resourceslice", other)["metadata"].get("labels", {}).get("taken") is None

    # A slice without a node (a network-attached pool) is not the agent's to write either.
    unbound = _slice(f"{NODE_A}-shared", node=NODE_A)
    del unbound["spec"]["nodeName"]
    unbound["spec"]["allNodes"] = True
    refused = _as_agent(cluster, agent_kubeconfig, "create", "-f", "-", input=json.dumps(unbound))
    assert refused.returncode != 0
    assert 'belongs to node ""' in refused.stderr

    deleted = _as_agent(cluster, agent_kubeconfig, "delete", "resourceslice", own)
    assert deleted.returncode == 0, deleted.stderr

    # The operator (not matched by the policy) cleans up any node's slices.
    operator = service_account_username(NAMESPACE, OPERATOR_SA)
    cleaned = cluster.kubectl("delete", "resourceslice", other, f"--as={operator}", check=False)
    assert cleaned.returncode == 0, cleaned.stderr


def test_unbound_agent_token_is_refused(installed: LocalCluster, overlays_applied: Any) -> None:
    cluster = installed
    token = cluster.kubectl("create", "token", AGENT_SA, "-n", NAMESPACE, "--duration=1h").stdout.strip()
    kubeconfig = cluster.kubeconfig_for_token(token, name="deploy-agent-unbound")
    refused = _as_agent(
        cluster, kubeconfig, "create", "-f", "-", input=json.dumps(_slice(f"{NODE_A}-x", node=NODE_A))
    )
    assert refused.returncode != 0
    assert "the caller's token is not bound to a pod on a node" in refused.stderr


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES_DIR.glob("*.yaml")))
def test_examples_apply_as_is(installed: LocalCluster, overlays_applied: Any, example: str) -> None:
    cluster = installed
    path = EXAMPLES_DIR / example
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    namespaces = [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"]
    target: list[str] = []
    if not namespaces and not any(d["metadata"].get("namespace") for d in docs):
        # Written without a namespace (GKE's guide): applied into one, as `kubectl create -n` would.
        namespaces = [f"deploy-example-{path.stem}"]
        cluster.create_namespace(namespaces[0])
        target = ["-n", namespaces[0]]
    try:
        cluster.kubectl("apply", *target, "-f", str(path))
        templates = cluster.get_json("resourceclaimtemplates", "-n", namespaces[0])["items"]
        assert templates
        for template in templates:
            # Read back through v1 whatever version the example used.
            for request in template["spec"]["spec"]["devices"]["requests"]:
                assert request["exactly"]["deviceClassName"] in {
                    "gpu.nvidia.com",
                    "mig.nvidia.com",
                    "tpu.google.com",
                }
    finally:
        for namespace in namespaces:
            _force_delete_pods(cluster, namespace)
            cluster.kubectl(
                "delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False
            )


@contextlib.contextmanager
def _running(argv: list[str], *, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A component as a child process, stopped with SIGTERM (as the kubelet would) afterwards."""
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_components_work_with_only_their_own_permissions(
    installed: LocalCluster, agent_kubeconfig: Path, tmp_path: Path
) -> None:
    """The real programs under the ServiceAccounts' tokens: the agent (token bound to its pod on node A,
    so the admission policy applies) publishes its slices, the operator allocates a standalone claim
    on them (finalizer, status.allocation through resourceclaims/binding, an Event). A missing
    permission shows as a failure here and as `Forbidden` in the logs attached below."""
    cluster = installed
    scripts = Path(sys.executable).parent
    token = cluster.kubectl("create", "token", OPERATOR_SA, "-n", NAMESPACE, "--duration=1h").stdout.strip()
    operator_kubeconfig = cluster.kubeconfig_for_token(token, name="deploy-operator")
    dirs = {name: tmp_path / name for name in ("registry", "plugins", "cdi", "state")}
    for directory in dirs.values():
        directory.mkdir()
    agent_port, operator_port = free_port(), free_port()
    agent_argv = [
        str(scripts / "dra-node-agent"), "run", f"--kubeconfig={agent_kubeconfig}", f"--node-name={NODE_A}",
        "--simulate-profile=h100-80gb-x8", f"--kubelet-registry-dir={dirs['registry']}",
        f"--kubelet-plugins-dir={dirs['plugins']}", f"--cdi-dir={dirs['cdi']}",
        f"--state-dir={dirs['state']}",
        f"--metrics-address=127.0.0.1:{agent_port}",
    ]  # fmt: skip
    operator_argv = [
        str(scripts / "dra-operator"), "run", f"--kubeconfig={operator_kubeconfig}",
        f"--peering-name={PEERING_NAME}", "--metrics-host=127.0.0.1", f"--metrics-port={operator_port}",
    ]  # fmt: skip
    namespace = "deploy-least-privilege"
    cluster.create_namespace(namespace)
    logs = {"agent": tmp_path / "agent.log", "operator": tmp_path / "operator.log"}
    try:
        with (
            _running(agent_argv, log=logs["agent"]),
            _running(operator_argv, log=logs["operator"]),
        ):
            cluster.wait_for(
                lambda: [
                    s for s in cluster.get_json("resourceslices")["items"]
                    if s["spec"].get("nodeName") == NODE_A and s["spec"]["driver"] == "gpu.nvidia.com"
                ],
                timeout=90,
                what=f"the agent's ResourceSlices for {NODE_A}",
            )  # fmt: skip
            request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
            cluster.apply([{
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "one-gpu", "namespace": namespace},
                "spec": {"devices": {"requests": [request]}},
            }])  # fmt: skip
            claim = cluster.wait_for(
                lambda: (c := cluster.get_json("resourceclaim", "one-gpu", "-n", namespace))
                .get("status", {}).get("allocation") and c,
                timeout=90,
                what="the operator to allocate the standalone claim",
            )  # fmt: skip
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert (result["driver"], result["pool"]) == ("gpu.nvidia.com", NODE_A)
            assert claim["metadata"]["finalizers"]
            # Events go out after the writes, once the claim worker is idle: wait for it.
            cluster.wait_for(
                lambda: cluster.get_json(
                    "events", "-n", namespace, "--field-selector=involvedObject.name=one-gpu"
                )["items"],
                timeout=30,
                what="the operator's Event about the claim",
            )
            assert _healthy(agent_port)
            assert _healthy(operator_port)
            # Deallocation and finalizer removal also go through the operator's own permissions.
            cluster.kubectl("delete", "resourceclaim", "one-gpu", "-n", namespace, "--timeout=90s")
    finally:
        for name, path in logs.items():
            text = path.read_text(errors="replace") if path.exists() else ""
            sys.stderr.write(f"--- {name} log ---\n{text[-4000:]}\n")
        # If the operator stopped before releasing the claim, its finalizer would hold the namespace.
        cluster.kubectl("patch", "resourceclaim", "one-gpu", "-n", namespace, "--type=merge",
                        "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip
        cluster.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False)
    for name, path in logs.items():
        assert "Forbidden" not in path.read_text(errors="replace"), f"{name} was refused something"
