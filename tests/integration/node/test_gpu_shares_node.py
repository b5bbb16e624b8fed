"""GPU shares on a real kubelet: the agent publishes its simulated H100s with
``--consumable-shares=memory``; pods of two namespaces each ask for a share of one GPU by memory,
kube-scheduler places both on it, the kubelet prepares both through the agent, and each container
sees its own share (``DRA_SHARE_<DEVICE>_ID``, ``_MEMORY``); each claim's ``status.devices`` entry
is keyed by its share ID. A third share that would pass the GPU's memory is not scheduled. Deleting
one pod unprepares its share only.
"""

from __future__ import annotations

from typing import Any

from dra_devcluster.images import WORKLOAD_IMAGE
from tests.integration.agent.agentproc import GPU
from tests.integration.node.conftest import CLASS, NAMESPACE, NODE, NodeWithAgent, wait_gone
from tests.integration.node.test_time_slicing import first_gpu_uuid

AGENT_ENV = {"DRA_AGENT_CONSUMABLE_SHARES": "memory"}
AGENT_TOKEN_BOUND_TO_NODE = True
OTHER = "real-node-shares-b"


def share_pod(name: str, namespace: str, *, memory: str, uuid: str) -> list[dict[str, Any]]:
    """A template asking for a ``memory`` share of the GPU ``uuid``, and a pod on the real node."""
    exactly = {
        "deviceClassName": CLASS,
        "capacity": {"requests": {"memory": memory}},
        "selectors": [{"cel": {"expression": f'device.attributes["{GPU}"].uuid == "{uuid}"'}}],
    }
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": WORKLOAD_IMAGE,
                    "command": ["sh", "-c", "env | grep ^DRA_SHARE_ | sort; echo up; sleep 3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
        },
    }
    return [template, pod]


def claim_of(setup: NodeWithAgent, namespace: str, pod: str) -> dict[str, Any]:
    for claim in setup.cluster.get_json("resourceclaims", "-n", namespace)["items"]:
        if any(o.get("name") == pod for o in claim["metadata"].get("ownerReferences") or []):
            found: dict[str, Any] = claim
            return found
    raise AssertionError(f"no claim of pod {namespace}/{pod}")


def wait_running(setup: NodeWithAgent, namespace: str, pod: str) -> None:
    setup.cluster.wait_for(
        lambda: "up" in setup.pod_log(pod, namespace=namespace),
        timeout=120,
        what=f"{namespace}/{pod} running",
    )


def device_status(setup: NodeWithAgent, namespace: str, claim: str) -> list[dict[str, Any]]:
    def written() -> list[dict[str, Any]] | None:
        status = setup.cluster.get_json("resourceclaim", claim, "-n", namespace).get("status") or {}
        entries: list[dict[str, Any]] | None = status.get("devices")
        return entries

    found: list[dict[str, Any]] = setup.cluster.wait_for(
        written, timeout=60, what=f"the device status of {namespace}/{claim}"
    )
    return found


def unscheduled(setup: NodeWithAgent, namespace: str, pod: str) -> bool:
    conditions = (setup.cluster.get_json("pod", pod, "-n", namespace).get("status") or {}).get("conditions")
    return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions or [])


def test_two_namespaces_pods_share_one_gpu_by_memory_on_a_real_kubelet(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    cluster.create_namespace(OTHER)
    try:
        uuid = first_gpu_uuid(setup)
        cluster.apply(share_pod("share-a", NAMESPACE, memory="30Gi", uuid=uuid))
        cluster.apply(share_pod("share-b", OTHER, memory="40Gi", uuid=uuid))
        wait_running(setup, NAMESPACE, "share-a")
        wait_running(setup, OTHER, "share-b")

        results = {}
        for namespace, pod, memory in ((NAMESPACE, "share-a", "30Gi"), (OTHER, "share-b", "40Gi")):
            claim = claim_of(setup, namespace, pod)
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert result["consumedCapacity"] == {"memory": memory}, result
            results[pod] = result
            # The container sees its own share.
            key = result["device"].replace("-", "_").upper()
            log = setup.pod_log(pod, namespace=namespace)
            assert f"DRA_SHARE_{key}_ID={result['shareID']}" in log, log
            assert f"DRA_SHARE_{key}_MEMORY={memory}" in log, log
            # The agent's device status entry is keyed by the share ID.
            entries = device_status(setup, namespace, claim["metadata"]["name"])
            assert [(e["device"], e.get("shareID")) for e in entries] == [
                (result["device"], result["shareID"])
            ]
        a, b = results["share-a"], results["share-b"]
        assert (a["pool"], a["device"]) == (b["pool"], b["device"]) == (NODE, a["device"])
        assert a["shareID"] != b["shareID"]
        assert a["shareID"] not in setup.pod_log("share-b", namespace=OTHER)

        # 30 + 40 + 20 Gi is more than the GPU's memory: kube-scheduler does not place the third.
        cluster.apply(share_pod("share-c", NAMESPACE, memory="20Gi", uuid=uuid))
        cluster.wait_for(
            lambda: unscheduled(setup, NAMESPACE, "share-c"), timeout=60, what="share-c unscheduled"
        )
        cluster.kubectl("delete", "pod", "share-c", "-n", NAMESPACE, "--wait=false")

        # One share goes: its pod and its preparation; the other pod runs on, its share untouched.
        uid_a = claim_of(setup, NAMESPACE, "share-a")["metadata"]["uid"]
        uid_b = claim_of(setup, OTHER, "share-b")["metadata"]["uid"]
        cluster.kubectl("delete", "pod", "share-a", "-n", NAMESPACE, "--wait=true", "--timeout=90s")
        wait_gone(cluster, setup.agent.dirs.cdi_spec(uid_a))
        assert setup.agent.dirs.cdi_spec(uid_b).exists()
        assert cluster.get_json("pod", "share-b", "-n", OTHER)["status"]["phase"] == "Running"
        assert claim_of(setup, OTHER, "share-b")["status"]["allocation"]["devices"]["results"] == [b]
    finally:
        cluster.kubectl("delete", "namespace", OTHER, "--wait=true", "--timeout=120s", check=False)
