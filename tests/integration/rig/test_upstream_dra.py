"""The local control plane runs upstream DRA end to end: claim controller, scheduler, RBAC.

Devices are published as plain ResourceSlices by the test; no product code runs here. This is the
proof that the rig is real: kube-controller-manager generates claims from templates, kube-scheduler
allocates devices and binds pods, and RBAC denies a ServiceAccount without rights.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_devcluster import LocalCluster
from tests.integration.objects import device_class, gpu_devices, pod_spec, resource_slice, tpu_devices

GPU = "gpu.nvidia.com"
TPU = "tpu.google.com"
H100_ONLY = 'device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H100")'


@pytest.fixture
def published(local_cluster: LocalCluster) -> Iterator[list[tuple[str, str]]]:
    """Objects a test publishes, deleted afterwards so tests sharing the cluster stay independent."""
    created: list[tuple[str, str]] = []
    yield created
    for kind, name in reversed(created):
        local_cluster.kubectl("delete", kind, name, "--ignore-not-found", "--wait=false")


def _publish_node(
    cluster: LocalCluster,
    published: list[tuple[str, str]],
    *,
    node: str,
    driver: str,
    devices: list[dict[str, Any]],
    taints: list[dict[str, str]] | None = None,
) -> None:
    cluster.add_node(node, taints=taints or [])
    published.append(("node", node))
    cluster.apply([resource_slice(driver=driver, node=node, devices=devices)])
    published.append(("resourceslice", f"{node}-{driver}"))


def _claim_of_pod(cluster: LocalCluster, namespace: str, pod: str) -> dict[str, Any] | None:
    obj = cluster.get_json("pod", pod, "-n", namespace)
    statuses = obj.get("status", {}).get("resourceClaimStatuses") or []
    if not statuses or not statuses[0].get("resourceClaimName"):
        return None
    claim: dict[str, Any] = cluster.get_json(
        "resourceclaim", statuses[0]["resourceClaimName"], "-n", namespace
    )
    return claim


def _wait_allocated_and_bound(
    cluster: LocalCluster, namespace: str, pod: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    def ready() -> tuple[dict[str, Any], dict[str, Any]] | None:
        pod_obj = cluster.get_json("pod", pod, "-n", namespace)
        claim = _claim_of_pod(cluster, namespace, pod)
        if claim is None or not pod_obj["spec"].get("nodeName"):
            return None
        status = claim.get("status", {})
        if not status.get("allocation") or not status.get("reservedFor"):
            return None
        return pod_obj, claim

    result: tuple[dict[str, Any], dict[str, Any]] = cluster.wait_for(
        ready, timeout=90, what=f"pod {namespace}/{pod} bound with its claim allocated and reserved"
    )
    return result


def _allocated_node(claim: dict[str, Any]) -> str:
    terms = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    fields = terms[0]["matchFields"]
    assert fields[0]["key"] == "metadata.name"
    node: str = fields[0]["values"][0]
    return node


def test_v1beta1_template_with_deployment_is_allocated_and_reserved(
    local_cluster: LocalCluster, published: list[tuple[str, str]]
) -> None:
    ns = "rig-gke-style"
    local_cluster.create_namespace(ns)
    published.append(("namespace", ns))
    local_cluster.apply([device_class(GPU, driver=GPU)])
    published.append(("deviceclass", GPU))
    _publish_node(
        local_cluster,
        published,
        node="rig-gpu-a",
        driver=GPU,
        devices=gpu_devices(8, node="rig-gpu-a"),
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    )

    # As in GKE's DRA guide: a v1beta1 template (flat request) and a Deployment using it.
    local_cluster.apply(f"""
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata: {{name: gpu-claim-template, namespace: {ns}}}
spec:
  spec:
    devices:
      requests:
      - name: single-gpu
        deviceClassName: {GPU}
        allocationMode: ExactCount
        count: 1
""")
    local_cluster.apply(
        [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "dra-gpu-example", "namespace": ns},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "dra-gpu-example"}},
                    "template": {
                        "metadata": {"labels": {"app": "dra-gpu-example"}},
                        "spec": pod_spec(
                            claim_name="single-gpu",
                            template="gpu-claim-template",
                            tolerations=[
                                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                            ],
                        ),
                    },
                },
            }
        ]
    )
    pod = local_cluster.wait_for(
        lambda: [p["metadata"]["name"] for p in local_cluster.get_json("pods", "-n", ns)["items"]],
        what="the Deployment's pod",
    )[0]
    pod_obj, claim = _wait_allocated_and_bound(local_cluster, ns, pod)

    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1
    assert results[0]["driver"] == GPU
    assert results[0]["pool"] == "rig-gpu-a"
    assert results[0]["device"].startswith("gpu-")
    assert _allocated_node(claim) == pod_obj["spec"]["nodeName"] == "rig-gpu-a"
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": pod, "uid": pod_obj["metadata"]["uid"]}
    ]
    # The claim controller made the claim for the pod and the scheduler protected it.
    assert claim["metadata"]["ownerReferences"][0]["uid"] == pod_obj["metadata"]["uid"]
    assert "resource.kubernetes.io/delete-protection" in claim["metadata"]["finalizers"]
    # `kubectl get resourceclaims` shows the state users look for.
    table = local_cluster.kubectl("get", "resourceclaims", "-n", ns).stdout
    assert "allocated,reserved" in table


def test_v1_template_with_bare_pod(local_cluster: LocalCluster, published: list[tuple[str, str]]) -> None:
    ns = "rig-v1"
    local_cluster.create_namespace(ns)
    published.append(("namespace", ns))
    local_cluster.apply([device_class(GPU, driver=GPU)])
    published.append(("deviceclass", GPU))
    _publish_node(
        local_cluster, published, node="rig-gpu-b", driver=GPU, devices=gpu_devices(8, node="rig-gpu-b")
    )
    local_cluster.apply(
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "single-gpu", "namespace": ns},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {
                                        "deviceClassName": GPU,
                                        "allocationMode": "ExactCount",
                                        "count": 2,
                                        "selectors": [{"cel": {"expression": H100_ONLY}}],
                                    },
                                },
                            ]
                        }
                    }
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "pod", "namespace": ns},
                "spec": pod_spec(claim_name="gpu", template="single-gpu"),
            },
        ]
    )
    pod_obj, claim = _wait_allocated_and_bound(local_cluster, ns, "pod")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [r["request"] for r in results] == ["gpu", "gpu"]
    assert len({r["device"] for r in results}) == 2
    assert _allocated_node(claim) == pod_obj["spec"]["nodeName"] == "rig-gpu-b"


def test_tpu_all_mode_takes_every_device_of_the_node(
    local_cluster: LocalCluster, published: list[tuple[str, str]]
) -> None:
    ns = "rig-tpu"
    local_cluster.create_namespace(ns)
    published.append(("namespace", ns))
    local_cluster.apply([device_class(TPU, driver=TPU)])
    published.append(("deviceclass", TPU))
    _publish_node(local_cluster, published, node="rig-tpu-a", driver=TPU, devices=tpu_devices(8))
    local_cluster.apply(f"""
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata: {{name: all-tpus, namespace: {ns}}}
spec:
  spec:
    devices:
      requests:
      - name: tpus
        deviceClassName: {TPU}
        allocationMode: All
""")
    local_cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "tpu-pod", "namespace": ns},
                "spec": pod_spec(claim_name="tpus", template="all-tpus"),
            }
        ]
    )
    pod_obj, claim = _wait_allocated_and_bound(local_cluster, ns, "tpu-pod")
    devices = sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])
    assert devices == sorted(f"accel{i}" for i in range(8))
    assert pod_obj["spec"]["nodeName"] == "rig-tpu-a"


def test_rbac_denies_a_service_account_without_rights(
    local_cluster: LocalCluster, published: list[tuple[str, str]]
) -> None:
    ns = "rig-rbac"
    local_cluster.create_namespace(ns)
    published.append(("namespace", ns))
    local_cluster.kubectl("create", "serviceaccount", "nobody", "-n", ns)
    token = local_cluster.kubectl("create", "token", "nobody", "-n", ns, "--duration=10m").stdout.strip()
    kubeconfig = local_cluster.kubeconfig_for_token(token, name="rig-nobody")

    denied = local_cluster.kubectl("get", "resourceclaims", "-n", ns, kubeconfig=kubeconfig, check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()
    assert "system:serviceaccount:rig-rbac:nobody" in denied.stderr
    can_i = local_cluster.kubectl(
        "auth", "can-i", "create", "resourceslices.resource.k8s.io", kubeconfig=kubeconfig, check=False
    )
    assert can_i.stdout.strip() == "no"

    # The same identity is allowed once a Role grants it: denial came from RBAC, not from a broken token.
    local_cluster.kubectl(
        "create",
        "role",
        "claim-reader",
        "-n",
        ns,
        "--verb=get,list",
        "--resource=resourceclaims.resource.k8s.io",
    )
    local_cluster.kubectl(
        "create",
        "rolebinding",
        "claim-reader",
        "-n",
        ns,
        "--role=claim-reader",
        f"--serviceaccount={ns}:nobody",
    )
    allowed = local_cluster.wait_for(
        lambda: (
            local_cluster.kubectl(
                "get", "resourceclaims", "-n", ns, kubeconfig=kubeconfig, check=False
            ).returncode
            == 0
        ),
        what="the RoleBinding to take effect",
    )
    assert allowed
