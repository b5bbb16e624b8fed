"""`helm install`, `helm upgrade` and `helm uninstall` of the chart on the real local control plane.

helm is the pinned release built from its Go module (dra_devcluster.binaries.ensure_helm), so this
never skips: without a Go toolchain it fails saying how to provide helm. The nodes are Node objects
without a kubelet (the product image does not run yet): the DaemonSet controller still places agent
pods on them, and the API server admits every object of the release.

After `helm uninstall` nothing of the release is left but the CRDs: Helm never deletes what it
installed from a chart's crds/ folder (its documented rule, so that custom resources survive an
uninstall). The test then removes them itself, as it found the cluster without them.

Helm refuses to take over objects it did not create (as it would for a user who installed with
kubectl apply -k first). Other tests of the session apply some of the same cluster-wide objects (the
agent's ClusterRole, for one), so the fixture sets those aside before the install and puts them
back afterwards, leaving the cluster as it found it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_devcluster import LocalCluster
from dra_devcluster.binaries import ensure_helm
from tests.integration.deploy.agentwrites import (
    SERVER_DEVICES,
    allocated_claim,
    device_entry,
    expected_claim_refusal,
    node_selector,
    pod_bound_kubeconfig,
    refused_once_in_effect,
    resource_slice,
)
from tests.unit.deploy.helm_render import CHART_DIR, helm_template

pytestmark = pytest.mark.cluster

NAMESPACE = "accel-dra-helm"
RELEASE = "accel-dra"
NODES = ("helm-node-a", "helm-node-b")
TENANT = "helm-tenant"
POLICIES = ("accel-dra-resourceslices-own-node", "accel-dra-resourceclaims-own-node")
CRDS = ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")
# Every kind the chart renders with backend simulated (the monitoring kinds need the Prometheus
# Operator's CRDs, which this cluster does not have), and whether it is namespaced.
RELEASE_KINDS = {
    "serviceaccounts": True,
    "deployments.apps": True,
    "daemonsets.apps": True,
    "poddisruptionbudgets.policy": True,
    "clusterroles.rbac.authorization.k8s.io": False,
    "clusterrolebindings.rbac.authorization.k8s.io": False,
    "validatingadmissionpolicies.admissionregistration.k8s.io": False,
    "validatingadmissionpolicybindings.admissionregistration.k8s.io": False,
    "deviceclasses.resource.k8s.io": False,
    "clusterkopfpeerings.kopf.dev": False,
}


class Helm:
    def __init__(self, binary: Path, cluster: LocalCluster, home: Path) -> None:
        self.binary = binary
        # Helm's cache, config and data in the test's own folder, not the user's.
        self.env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), HELM_CACHE_HOME=str(home / "cache"),
                        HELM_CONFIG_HOME=str(home / "config"), HELM_DATA_HOME=str(home / "data"))  # fmt: skip

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(self.binary), *args], env=self.env, capture_output=True, text=True,
                                timeout=180, check=False)  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result


def _release_objects(cluster: LocalCluster) -> list[str]:
    """kind/name of every object labelled as the release's, in the namespace and cluster-wide."""
    found = []
    for kind, namespaced in RELEASE_KINDS.items():
        scope = ["-n", NAMESPACE] if namespaced else []
        result = cluster.kubectl("get", kind, *scope, "-l", f"app.kubernetes.io/instance={RELEASE}", "-o",
                                 "name", check=False)  # fmt: skip
        if result.returncode != 0 and "the server doesn't have a resource type" in result.stderr:
            continue  # e.g. the peering CRD is gone
        assert result.returncode == 0, result.stderr
        found += result.stdout.split()
    return found


def _force_delete_pods(cluster: LocalCluster) -> None:
    # Pods bound to nodes without a kubelet never finish terminating on their own.
    cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--force", "--grace-period=0",
                    "--ignore-not-found", "--wait=false", check=False)  # fmt: skip


# metadata the API server owns; a saved object is re-created without it.
_SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


def _set_aside(cluster: LocalCluster, helm_binary: Path) -> list[dict[str, Any]]:
    """Delete and return the cluster-wide objects of other tests that the chart would create."""
    # Every cluster-wide object any install of this module renders, ComputeDomains' roles included.
    values = {
        "backend": "simulated",
        "simulated": {"profiles": ["h100-80gb-x8"]},
        "resources": {"computeDomains": {"enabled": True}},
    }
    saved = []
    for obj in helm_template(helm_binary, values=values, namespace=NAMESPACE, release=RELEASE):
        if obj["kind"] == "CustomResourceDefinition" or obj["metadata"].get("namespace"):
            continue
        ref = f"{obj['kind'].lower()}.{obj['apiVersion'].split('/')[0]}/{obj['metadata']['name']}"
        if "/" not in obj["apiVersion"]:
            ref = f"{obj['kind'].lower()}/{obj['metadata']['name']}"
        found = cluster.kubectl("get", ref, "-o", "json", "--ignore-not-found", check=False)
        if found.returncode != 0 or not found.stdout.strip():
            continue
        existing = json.loads(found.stdout)
        for key in _SERVER_FIELDS:
            existing["metadata"].pop(key, None)
        existing.pop("status", None)
        saved.append(existing)
        cluster.kubectl("delete", ref, "--wait=true")
    return saved


def _policies_deny_the_release_agent(cluster: LocalCluster) -> None:
    """The agent of a release in a namespace of its own, with the token of its pod on node a: its
    writes for node b are refused (the admission policies match it there too)."""
    node_a, node_b = NODES

    def agent_pod_on_a() -> str | None:
        pods = cluster.get_json("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=accel-dra-node-agent")
        on_a = [p["metadata"]["name"] for p in pods["items"] if p["spec"].get("nodeName") == node_a]
        return on_a[0] if on_a else None

    pod = cluster.wait_for(agent_pod_on_a, timeout=60, what=f"the agent pod bound to {node_a}")
    kubeconfig = pod_bound_kubeconfig(
        cluster, account="accel-dra-node-agent", namespace=NAMESPACE, pod=pod, name="helm-agent-on-a"
    )
    create = ["create", "-f", "-"]
    own_node_only = f'denied: it belongs to node "{node_b}"'
    denied = refused_once_in_effect(
        cluster, kubeconfig, create, resource_slice(f"{node_b}-gpu", node=node_b), says=own_node_only
    )
    assert "ValidatingAdmissionPolicy 'accel-dra-resourceslices-own-node'" in denied.stderr, denied.stderr
    gpu = ("gpu", "gpu.nvidia.com", node_b, "gpu-0")
    claim = allocated_claim(
        cluster, namespace=TENANT, name="on-b", results=[gpu], selector=node_selector(node_b)
    )
    claim["status"]["devices"] = [device_entry("gpu.nvidia.com", node_b, "gpu-0")]
    says = expected_claim_refusal(
        cluster, server=SERVER_DEVICES, policy=f'it is allocated to node "{node_b}"'
    )
    status = ["replace", "--subresource=status", "-f", "-"]
    denied = refused_once_in_effect(cluster, kubeconfig, status, claim, says=says)
    assert denied.returncode != 0
    assert "devices" not in cluster.get_json("resourceclaim", "on-b", "-n", TENANT)["status"]


def _container(cluster: LocalCluster, kind: str, name: str) -> Any:
    obj = cluster.get_json(kind, name, "-n", NAMESPACE)
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    return obj, container


@pytest.fixture(scope="module")
def helm(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helm]:
    cluster = local_cluster
    crds_before = {c for c in CRDS if cluster.kubectl("get", "crd", c, check=False).returncode == 0}
    for node in NODES:
        cluster.add_node(node)
        # As in test_install.py: no node-lifecycle controller lifts the not-ready taint.
        cluster.kubectl("taint", "node", node, "node.kubernetes.io/not-ready:NoSchedule-", check=False)
    # The namespace as the chart's README says: Pod Security "privileged" for the agent's hostPaths.
    cluster.create_namespace(NAMESPACE, labels={"pod-security.kubernetes.io/enforce": "privileged"})
    cluster.create_namespace(TENANT)
    tool = Helm(ensure_helm(), cluster, tmp_path_factory.mktemp("helm-home"))
    saved = _set_aside(cluster, tool.binary)
    try:
        yield tool
    finally:
        tool("uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", check=False)
        _force_delete_pods(cluster)
        cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", TENANT, "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "resourceslices", "-l", "accel-dra-test=deploy", "--ignore-not-found",
                        check=False)  # fmt: skip

        def namespace_gone() -> bool:
            _force_delete_pods(cluster)
            return cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0

        cluster.wait_for(namespace_gone, timeout=120, interval=2, what=f"namespace {NAMESPACE} to be deleted")
        for crd in set(CRDS) - crds_before:
            cluster.kubectl("delete", "crd", crd, "--ignore-not-found", check=False)
        for node in NODES:
            cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false", check=False)
        if saved:
            cluster.apply(saved)


def test_install_upgrade_uninstall(local_cluster: LocalCluster, helm: Helm) -> None:
    cluster = local_cluster
    assert not _release_objects(cluster), "a previous install was left behind"

    # install
    # No uninstall hook: its Job could not run on these nodes (test_helm_on_real_node.py runs it).
    helm("install", RELEASE, str(CHART_DIR), "-n", NAMESPACE, "--set", "backend=simulated",
         "--set", "simulated.profiles={h100-80gb-x8}", "--set", "uninstall.hook.enabled=false")  # fmt: skip
    status = helm("status", RELEASE, "-n", NAMESPACE, "-o", "json").stdout
    assert '"status":"deployed"' in status.replace(" ", "")
    for crd in CRDS:
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}")
    installed = _release_objects(cluster)
    for expected in (
        "serviceaccount/accel-dra-operator",
        "serviceaccount/accel-dra-node-agent",
        "deployment.apps/accel-dra-operator",
        "daemonset.apps/accel-dra-node-agent",
        "poddisruptionbudget.policy/accel-dra-operator",
        "clusterrole.rbac.authorization.k8s.io/accel-dra-operator",
        "clusterrolebinding.rbac.authorization.k8s.io/accel-dra-node-agent",
        "validatingadmissionpolicy.admissionregistration.k8s.io/accel-dra-resourceslices-own-node",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/accel-dra-resourceslices-own-node",
        "validatingadmissionpolicy.admissionregistration.k8s.io/accel-dra-resourceclaims-own-node",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/accel-dra-resourceclaims-own-node",
        "deviceclass.resource.k8s.io/gpu.nvidia.com",
        "deviceclass.resource.k8s.io/mig.nvidia.com",
        "deviceclass.resource.k8s.io/tpu.google.com",
        "clusterkopfpeering.kopf.dev/accel-dra-operator",
    ):
        assert expected in installed, f"{expected} not installed; found {installed}"
    deployment, operator = _container(cluster, "deployment", "accel-dra-operator")
    assert deployment["spec"]["replicas"] == 2
    assert "--ownership=standalone" in operator["args"]
    daemonset, agent = _container(cluster, "daemonset", "accel-dra-node-agent")
    assert "--simulate-profile=h100-80gb-x8" in agent["args"]
    assert "--health-poll-interval=10" in agent["args"]
    assert not agent["securityContext"]["privileged"]
    for name in POLICIES:
        policy = cluster.get_json("validatingadmissionpolicy", name)
        (condition,) = policy["spec"]["matchConditions"]
        assert '.contains("accel-dra-node-agent")' in condition["expression"], name
    binding = cluster.get_json("clusterrolebinding", "accel-dra-operator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "accel-dra-operator", "namespace": NAMESPACE}
    ]
    # The DaemonSet controller places an agent pod on each of the test's nodes.
    cluster.wait_for(
        lambda: {p["spec"].get("nodeName") or p["spec"]["affinity"]["nodeAffinity"]
                 ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"][0]
                 ["values"][0]
                 for p in cluster.get_json("pods", "-n", NAMESPACE, "-l",
                                           "app.kubernetes.io/name=accel-dra-node-agent")["items"]}
        >= set(NODES),
        timeout=60, what="agent pods on the test's nodes",
    )  # fmt: skip
    _policies_deny_the_release_agent(cluster)

    # upgrade: a value of each workload changes, the rest is kept
    helm("upgrade", RELEASE, str(CHART_DIR), "-n", NAMESPACE, "--reuse-values", "--set",
         "kubeletPlugin.health.pollIntervalSeconds=3", "--set", "controller.ownership=all")  # fmt: skip
    upgraded, operator = _container(cluster, "deployment", "accel-dra-operator")
    assert "--ownership=all" in operator["args"]
    assert "--ownership=standalone" not in operator["args"]
    assert upgraded["metadata"]["generation"] > deployment["metadata"]["generation"]
    upgraded_ds, agent = _container(cluster, "daemonset", "accel-dra-node-agent")
    assert "--health-poll-interval=3" in agent["args"]
    assert "--simulate-profile=h100-80gb-x8" in agent["args"]  # --reuse-values kept it
    assert upgraded_ds["metadata"]["generation"] > daemonset["metadata"]["generation"]
    history = helm("history", RELEASE, "-n", NAMESPACE, "-o", "json").stdout
    assert history.count('"revision"') == 2

    # uninstall: nothing of the release is left but the CRDs, which Helm keeps
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=120s")
    assert helm("status", RELEASE, "-n", NAMESPACE, check=False).returncode != 0
    assert _release_objects(cluster) == []
    secrets = cluster.get_json("secrets", "-n", NAMESPACE, "-l", f"owner=helm,name={RELEASE}")["items"]
    assert secrets == [], "Helm's release records were left"
    # The agent and operator pods go with their workloads (garbage collector); forced here
    # because these nodes have no kubelet to confirm.
    _force_delete_pods(cluster)
    cluster.wait_for(lambda: not cluster.get_json("pods", "-n", NAMESPACE)["items"], timeout=60,
                     what="the release's pods to be gone")  # fmt: skip
    for crd in CRDS:
        assert cluster.kubectl("get", "crd", crd, check=False).returncode == 0, f"Helm deleted CRD {crd}"


def _daemon_claim(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "imex-daemon", "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "d", "exactly": {
            "deviceClassName": "compute-domain-daemon.nvidia.com"}}]}},
    }  # fmt: skip


def test_compute_domains_keep_tenants_off_the_daemon_class(local_cluster: LocalCluster, helm: Helm) -> None:
    """With resources.computeDomains.enabled the chart's daemon claim policy, which selects the
    release namespace by name, denies a tenant's claim for the daemons' class and admits the
    release namespace's own."""
    cluster = local_cluster
    helm("install", RELEASE, str(CHART_DIR), "-n", NAMESPACE, "--set", "backend=simulated",
         "--set", "uninstall.hook.enabled=false",
         "--set", "resources.computeDomains.enabled=true")  # fmt: skip
    try:
        denied: list[str] = []

        def refused() -> bool:
            # The API server applies a new policy once its informer has it: retry until then.
            result = cluster.kubectl(
                "create", "-f", "-", input=json.dumps(_daemon_claim(TENANT)), check=False
            )
            if result.returncode == 0:
                cluster.kubectl("delete", "resourceclaim", "imex-daemon", "-n", TENANT, "--wait=false")
                return False
            denied.append(result.stderr)
            return True

        cluster.wait_for(refused, timeout=60, interval=1, what="the daemon claim policy to deny a tenant")
        assert "the class compute-domain-daemon.nvidia.com is for the IMEX daemons" in denied[-1], denied[-1]
        cluster.kubectl("create", "-f", "-", input=json.dumps(_daemon_claim(NAMESPACE)))
        cluster.kubectl("delete", "resourceclaim", "imex-daemon", "-n", NAMESPACE)
    finally:
        helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=120s", check=False)
        _force_delete_pods(cluster)
