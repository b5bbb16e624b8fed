"""Device-plugin style pods (``resources.limits``, no claim) beside nodes that still have a device
plugin: kube-scheduler serves the resource from the node's allocatable where the node advertises
it, and through a DRA claim of the operator's class elsewhere; the operator then says on the pod
which claim serves it (an Event ``kubectl describe pod`` shows)."""

from __future__ import annotations

from typing import Any

from dra_devcluster import LocalCluster
from tests.integration.operator.conftest import Operators, events_for
from tests.integration.operator.objects import add_gpu_node

RESOURCE = "example.com/op-extended-gpu"  # the test's own name: other tests' classes stay unaffected
REASON = "ExtendedResourceClaim"


def limits_pod(name: str, namespace: str, *, node: str, count: int) -> dict[str, Any]:
    """A pod as written for a device plugin, pinned to ``node``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/sleep:1",
                    "command": ["sleep", "infinity"],
                    "resources": {"limits": {RESOURCE: str(count)}},
                }
            ],
        },
    }


def test_dra_serves_the_resource_where_no_device_plugin_advertises_it_and_the_pod_says_which_claim(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    ns = "op-extended"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    # A node whose GPUs only DRA publishes, and one whose device plugin advertises the resource
    # (its Node status has it; it publishes no slice).
    add_gpu_node(local_cluster, scratch, "op-ext-dra", 4)
    local_cluster.add_node(
        "op-ext-plugin", capacity={"cpu": "64", "memory": "512Gi", "pods": "110", RESOURCE: "4"}
    )
    scratch.append(("node", "op-ext-plugin"))
    operators.start(f"--gpu-extended-resource-name={RESOURCE}")
    local_cluster.wait_for(
        lambda: (
            (local_cluster.get_json("deviceclass", operators.gpu_class).get("spec") or {}).get(
                "extendedResourceName"
            )
            == RESOURCE
        ),
        what="the operator's GPU class serving the extended resource",
    )
    local_cluster.apply(
        [
            limits_pod("via-dra", ns, node="op-ext-dra", count=2),
            limits_pod("via-plugin", ns, node="op-ext-plugin", count=2),
        ]
    )

    def bound(name: str) -> dict[str, Any] | None:
        pod: dict[str, Any] = local_cluster.get_json("pod", name, "-n", ns)
        return pod if (pod.get("spec") or {}).get("nodeName") else None

    via_dra = local_cluster.wait_for(lambda: bound("via-dra"), what="pod via-dra bound")
    via_plugin = local_cluster.wait_for(lambda: bound("via-plugin"), what="pod via-plugin bound")

    # The device-plugin node keeps serving the resource itself: no claim for that pod.
    assert not (via_plugin.get("status") or {}).get("extendedResourceClaimStatus"), via_plugin["status"]
    # The DRA node: kube-scheduler made a claim of the operator's class and allocated two GPUs there.
    claim_name = via_dra["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    claim = local_cluster.get_json("resourceclaim", claim_name, "-n", ns)
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == operators.gpu_class
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {(r["driver"], r["pool"]) for r in results} == {("gpu.nvidia.com", "op-ext-dra")}
    assert len(results) == 2
    claims = local_cluster.get_json("resourceclaims", "-n", ns)["items"]
    assert [c["metadata"]["name"] for c in claims] == [claim_name]

    def explained() -> dict[str, Any] | None:
        found = [e for e in events_for(local_cluster, ns, "via-dra") if e["reason"] == REASON]
        return found[0] if found else None

    event = local_cluster.wait_for(explained, timeout=60, what=f"a {REASON} Event on pod via-dra")
    assert event["type"] == "Normal"
    message = event["message"]
    assert f"ResourceClaim {ns}/{claim_name}" in message, message
    assert f"{RESOURCE} (container main)" in message, message
    for r in results:
        assert f"gpu.nvidia.com {r['device']}" in message, message
    described = local_cluster.kubectl("describe", "pod", "via-dra", "-n", ns).stdout
    assert REASON in described, described
    assert claim_name in described, described
    # Nothing is said about the pod the device plugin serves.
    assert not [e for e in events_for(local_cluster, ns, "via-plugin") if e["reason"] == REASON]
