"""Device health with a kubelet of the oldest supported release, 1.34, which knows the health service
only as ``v1alpha1`` (``test_real_node.py`` has the default release's kubelet take ``v1``).

The kubelet joins the session's control plane, as Kubernetes' version skew allows (a kubelet up to
three minors older than the API server). Its gate for device health in pod status,
ResourceHealthStatus, is alpha and off in 1.34, so this node's kubelet gets it switched on; the API
server's release has it on, so the pod status keeps what the kubelet reports.

The pod uses a standalone claim named as the pod's entry for it: a 1.34 kubelet matches the
container's claims against the ResourceClaim's own name (``UpdateAllocatedResourcesStatus`` in
``pkg/kubelet/cm/dra/manager.go``), so a claim made from a template, named after the pod, never
gets its health into the pod status there.
"""

from __future__ import annotations

from typing import Any

from dra_devcluster import resolve_kubernetes_version
from tests.integration.agent.agentproc import GPU
from tests.integration.node.conftest import NAMESPACE, NODE, NodeWithAgent, gpu_pod

KUBELET_RELEASE = "1.34"
KUBELET_GATES = {"ResourceHealthStatus": True}


def test_a_1_34_kubelet_reads_health_v1alpha1_and_the_pod_status_shows_it(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    node = setup.cluster.get_json("node", NODE)
    assert node["status"]["nodeInfo"]["kubeletVersion"] == resolve_kubernetes_version(KUBELET_RELEASE).version
    setup.cluster.apply(
        _pod_with_claim("gpu-health-old", claim="gpu-old", command="echo started; sleep 3600")
    )
    setup.wait_log("gpu-health-old", "started")
    claim = setup.cluster.get_json("resourceclaim", "gpu-old", "-n", NAMESPACE)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    resource = f"k8s.{GPU}/claim={claim['metadata']['uid']}-{result['device']}"

    def health(state: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = setup.cluster.wait_for(
            lambda: [
                r
                for r in setup.resource_health("gpu-health-old")
                if r["resourceID"] == resource and r["health"] == state
            ],
            timeout=60,
            what=f"{resource} {state} in the pod's status",
        )
        return found[0]

    health("Healthy")
    # The agent offers both versions; this kubelet asked for the only one it knows.
    log = setup.agent.log_text()
    assert f"kubelet opened the health stream of driver {GPU} (v1alpha1)" in log, log[-3000:]
    assert f"kubelet opened the health stream of driver {GPU} (v1)" not in log
    # A change reaches the pod status over v1alpha1 too: XID 79 on the pod's GPU.
    (setup.faults_dir() / f"xid-{result['device'].removeprefix('gpu-')}-79").touch()
    health("Unhealthy")
    setup.cluster.kubectl("delete", "pod", "gpu-health-old", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    setup.cluster.kubectl(
        "delete", "resourceclaim", "gpu-old", "-n", NAMESPACE, "--wait=true", "--timeout=60s"
    )


def _pod_with_claim(name: str, *, claim: str, command: str) -> list[dict[str, Any]]:
    """:func:`gpu_pod`'s pod with a standalone claim ``claim`` instead of a template, under the
    same name in the pod."""
    template, pod = gpu_pod(name, command=command)
    standalone = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim, "namespace": NAMESPACE},
        "spec": template["spec"]["spec"],
    }
    pod["spec"]["resourceClaims"] = [{"name": claim, "resourceClaimName": claim}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": claim}]
    return [standalone, pod]
