"""The claim lifecycle with the operator, kube-scheduler and kube-controller-manager all running."""

from __future__ import annotations

from typing import Any

from dra_devcluster import LocalCluster
from tests.integration.objects import gpu_devices, resource_slice
from tests.integration.operator.conftest import (
    Operators,
    assert_no_double_booking,
    claims_json,
    device_ids,
    events_for,
)
from tests.integration.operator.objects import (
    OPERATOR_FINALIZER,
    add_gpu_node,
    allocated_node,
    claim,
    claim_template,
    pod,
    ungate,
)
from tests.integration.pace import let_pass


def _claim(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = cluster.get_json("resourceclaim", name, "-n", ns)
    return obj


def _wait_allocated(cluster: LocalCluster, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    result: dict[str, Any] = cluster.wait_for(
        lambda: (c := _claim(cluster, ns, name)).get("status", {}).get("allocation") and c,
        timeout=timeout,
        what=f"claim {ns}/{name} allocated",
    )
    return result


def test_standalone_claim_is_allocated_by_the_operator_and_used_by_a_pod(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    ns = "op-standalone"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-sa-a", 1)
    add_gpu_node(local_cluster, scratch, "op-sa-b", 4)
    op = operators.start()
    # The operator created its DeviceClass, labelled as its own.
    cls = local_cluster.wait_for(
        lambda: (
            local_cluster.kubectl(
                "get", "deviceclass", operators.gpu_class, "-o", "json", check=False
            ).returncode
            == 0
        ),
        what="managed DeviceClass created",
    )
    assert cls
    managed = local_cluster.get_json("deviceclass", operators.gpu_class)
    assert managed["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "accel-dra-operator"

    local_cluster.apply([claim("two-gpus", ns, cls=operators.gpu_class, count=2)])
    allocated = _wait_allocated(local_cluster, ns, "two-gpus")
    assert OPERATOR_FINALIZER in allocated["metadata"]["finalizers"]
    assert "resource.kubernetes.io/delete-protection" not in allocated["metadata"].get("finalizers", [])
    assert allocated_node(allocated) == "op-sa-b"  # the only node with two GPUs
    assert len(set(device_ids(allocated))) == 2
    # Events go out after the writes (when the claim worker is idle), so the Event may follow the
    # allocation by a moment.
    local_cluster.wait_for(
        lambda: "Allocated" in {e["reason"] for e in events_for(local_cluster, ns, "two-gpus")},
        timeout=30,
        what="the Allocated Event",
    )

    # kube-scheduler honours the allocation: the pod lands on the allocation's node.
    local_cluster.apply([pod("user", ns, claim_name="two-gpus")])
    bound = local_cluster.wait_for(
        lambda: local_cluster.get_json("pod", "user", "-n", ns)["spec"].get("nodeName"),
        timeout=60,
        what="pod bound",
    )
    assert bound == "op-sa-b"
    reserved = _claim(local_cluster, ns, "two-gpus")["status"]["reservedFor"]
    assert [r["name"] for r in reserved] == ["user"]
    # The scheduler did not allocate it again: same devices, still our finalizer only.
    after = _claim(local_cluster, ns, "two-gpus")
    assert device_ids(after) == device_ids(allocated)

    # Metrics and liveness.
    assert op.metric("dra_operator_allocations_total") >= 1
    status, text = op.get("/healthz")
    assert status == 200, text


def _generated_claim(cluster: LocalCluster, ns: str) -> dict[str, Any] | None:
    items = claims_json(cluster, ns)
    return items[0] if items else None


def test_template_claims_stay_with_the_scheduler_in_standalone_mode(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    ns = "op-template-sa"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-tsa", 2)
    op = operators.start()
    local_cluster.wait_for(
        lambda: local_cluster.kubectl("get", "deviceclass", operators.gpu_class, check=False).returncode == 0,
        what="DeviceClass",
    )
    local_cluster.apply(
        [claim_template("tpl", ns, cls=operators.gpu_class), pod("p", ns, template="tpl", gated=True)]
    )
    generated = local_cluster.wait_for(lambda: _generated_claim(local_cluster, ns), what="generated claim")
    # The operator saw the claim (it counts it) and left it alone while the pod was gated.
    local_cluster.wait_for(
        lambda: op.metric("dra_operator_claims", 'state="pending"') >= 1, what="operator sees the claim"
    )
    let_pass(3)
    assert not (_generated_claim(local_cluster, ns) or {}).get("status", {}).get("allocation")

    ungate(local_cluster, ns, "p")
    obj = local_cluster.wait_for(
        lambda: (c := _generated_claim(local_cluster, ns)) and c.get("status", {}).get("allocation") and c,
        timeout=60,
        what="template claim allocated by the scheduler",
    )
    assert obj["metadata"]["name"] == generated["metadata"]["name"]
    assert "resource.kubernetes.io/delete-protection" in obj["metadata"]["finalizers"]
    assert OPERATOR_FINALIZER not in obj["metadata"]["finalizers"]


def test_all_mode_allocates_template_claims(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    ns = "op-template-all"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-tall-a", 1)
    add_gpu_node(local_cluster, scratch, "op-tall-b", 1)
    operators.start("--ownership=all")
    local_cluster.wait_for(
        lambda: local_cluster.kubectl("get", "deviceclass", operators.gpu_class, check=False).returncode == 0,
        what="DeviceClass",
    )
    local_cluster.apply(
        [claim_template("tpl", ns, cls=operators.gpu_class), pod("p", ns, template="tpl", gated=True)]
    )
    obj = local_cluster.wait_for(
        lambda: (c := _generated_claim(local_cluster, ns)) and c.get("status", {}).get("allocation") and c,
        timeout=60,
        what="template claim allocated by the operator while the pod is gated",
    )
    assert OPERATOR_FINALIZER in obj["metadata"]["finalizers"]
    assert "resource.kubernetes.io/delete-protection" not in obj["metadata"]["finalizers"]
    node = allocated_node(obj)
    name = obj["metadata"]["name"]

    ungate(local_cluster, ns, "p")
    bound = local_cluster.wait_for(
        lambda: local_cluster.get_json("pod", "p", "-n", ns)["spec"].get("nodeName"),
        timeout=60,
        what="pod bound",
    )
    assert bound == node
    reserved = _claim(local_cluster, ns, name)
    assert device_ids(reserved) == device_ids(obj)
    assert [r["name"] for r in reserved["status"]["reservedFor"]] == ["p"]

    # Deleting the pod ends the claim's use: the operator deallocates it and lets it go.
    local_cluster.kubectl("delete", "pod", "p", "-n", ns, "--grace-period=0", "--force")
    local_cluster.wait_for(
        lambda: local_cluster.kubectl("get", "resourceclaim", name, "-n", ns, check=False).returncode != 0,
        timeout=90,
        what="generated claim gone after its pod",
    )


def test_deletion_releases_devices_but_never_under_a_pod(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    ns = "op-delete"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-del", 1)
    operators.start()
    local_cluster.apply([claim("first", ns, cls=operators.gpu_class)])
    first = _wait_allocated(local_cluster, ns, "first")
    local_cluster.apply([claim("second", ns, cls=operators.gpu_class)])

    # Only one GPU: the second claim waits with an explanation.
    def explained() -> bool:
        return any(e["type"] == "Warning" for e in events_for(local_cluster, ns, "second"))

    local_cluster.wait_for(explained, timeout=60, what="Warning event on the second claim")
    assert not _claim(local_cluster, ns, "second").get("status", {}).get("allocation")

    # A pod uses the first claim; deleting the claim must not pull the device from under it.
    local_cluster.apply([pod("user", ns, claim_name="first")])
    local_cluster.wait_for(
        lambda: _claim(local_cluster, ns, "first").get("status", {}).get("reservedFor"),
        timeout=60,
        what="first claim reserved by the pod",
    )
    local_cluster.kubectl("delete", "resourceclaim", "first", "-n", ns, "--wait=false")
    terminating = local_cluster.wait_for(
        lambda: (c := _claim(local_cluster, ns, "first"))["metadata"].get("deletionTimestamp") and c,
        what="first claim terminating",
    )
    let_pass(3)
    still = _claim(local_cluster, ns, "first")
    assert device_ids(still) == device_ids(first), "deallocated while a pod still used it"
    assert terminating
    assert not _claim(local_cluster, ns, "second").get("status", {}).get("allocation")

    # The pod goes: the first claim is released and vanishes; the freed GPU goes to the second claim.
    local_cluster.kubectl("delete", "pod", "user", "-n", ns, "--grace-period=0", "--force")
    local_cluster.wait_for(
        lambda: local_cluster.kubectl("get", "resourceclaim", "first", "-n", ns, check=False).returncode != 0,
        timeout=90,
        what="first claim released and deleted",
    )
    second = _wait_allocated(local_cluster, ns, "second", timeout=60)
    assert device_ids(second) == device_ids(first)
    assert_no_double_booking(claims_json(local_cluster, ns))


def test_slices_of_vanished_nodes_are_removed(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    add_gpu_node(local_cluster, scratch, "op-gone", 2)
    add_gpu_node(local_cluster, scratch, "op-stays", 2)
    # Another driver's slice on the same node: not the operator's to delete, however orphaned.
    foreign = resource_slice(
        driver="other.example.com", node="op-gone", devices=gpu_devices(1, node="op-gone")
    )
    local_cluster.apply([foreign])
    scratch.append(("resourceslice", foreign["metadata"]["name"]))
    operators.start()

    def gone(name: str) -> bool:
        return local_cluster.kubectl("get", "resourceslice", name, check=False).returncode != 0

    local_cluster.delete_node("op-gone")
    local_cluster.wait_for(
        lambda: gone("op-gone-gpu.nvidia.com"), timeout=60, what="slice of the deleted node removed"
    )
    assert not gone("op-stays-gpu.nvidia.com")
    # A later sweep (the second node's slice goes only after its own grace period) has had every
    # chance to take the foreign slice as well.
    local_cluster.delete_node("op-stays")
    local_cluster.wait_for(
        lambda: gone("op-stays-gpu.nvidia.com"), timeout=60, what="second node's slice removed"
    )
    assert not gone(foreign["metadata"]["name"]), "the operator deleted another driver's slice"
