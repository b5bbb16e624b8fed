"""Device-plugin style pods served by DRA (KEP-5004, DRAExtendedResource, beta in 1.36) on a real
kubelet: a DeviceClass names an extended resource, a pod asks for it in ``resources.limits`` with no
claim, kube-scheduler makes the pod's special claim, and the agent prepares it like any other."""

from __future__ import annotations

from typing import Any

from tests.integration.agent.agentproc import GPU
from tests.integration.objects import device_class

from .conftest import NAMESPACE, NodeWithAgent, gpu_pod, wait_gone

EXTENDED = "example.com/real-node-gpu"  # the test's own name: other tests' classes stay unaffected
CLASS = "real-node-extended-gpu"


def _pod(name: str, count: int) -> dict[str, Any]:
    """The node tests' GPU pod, asking through ``resources.limits`` instead of a claim."""
    _, pod = gpu_pod(name, command="env | grep ^NVIDIA_VISIBLE_DEVICES=; echo done; sleep 3600")
    del pod["spec"]["resourceClaims"]
    pod["spec"]["containers"][0]["resources"] = {"limits": {EXTENDED: str(count)}}
    return pod


def test_a_pod_asking_for_an_extended_resource_gets_gpus_prepared_by_the_agent(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    extended_class = device_class(CLASS, driver=GPU)
    extended_class["spec"]["extendedResourceName"] = EXTENDED
    cluster.apply([extended_class])
    try:
        cluster.apply([_pod("extended-gpus", 2)])
        log = setup.wait_log("extended-gpus", "done")
        pod = cluster.get_json("pod", "extended-gpus", "-n", NAMESPACE)
        status = pod["status"].get("extendedResourceClaimStatus") or {}
        claim_name = status.get("resourceClaimName")
        assert claim_name, pod["status"]
        claim = cluster.get_json("resourceclaim", claim_name, "-n", NAMESPACE)
        annotations = claim["metadata"].get("annotations") or {}
        assert annotations.get("resource.kubernetes.io/extended-resource-claim") == "true"
        results = claim["status"]["allocation"]["devices"]["results"]
        assert len(results) == 2
        assert {r["driver"] for r in results} == {GPU}
        # The agent prepared the scheduler's claim like any other: two GPUs in the environment.
        (visible,) = [line for line in log.splitlines() if line.startswith("NVIDIA_VISIBLE_DEVICES=")]
        assert len(visible.split("=", 1)[1].split(",")) == 2, log
        uid = claim["metadata"]["uid"]
        assert uid in setup.agent.dirs.checkpoint_claims()
        spec = setup.agent.dirs.cdi_spec(uid)
        assert spec.exists()
        cluster.kubectl("delete", "pod", "extended-gpus", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
        wait_gone(cluster, spec)
        assert uid not in setup.agent.dirs.checkpoint_claims()
    finally:
        cluster.kubectl("delete", "pod", "extended-gpus", "-n", NAMESPACE, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "deviceclass", CLASS, "--ignore-not-found", check=False)
