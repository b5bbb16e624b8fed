"""KEP-4817 device status on a real kubelet: the agent writes its entry in the claim's
``status.devices`` when the kubelet prepares the claim of a running pod (Ready, and the GPU's UUID
and PCI bus ID in its data), turns Ready False with the XID when the GPU reports one and True again
once it recovers, and the entry is gone once the pod is deleted and the kubelet unprepared the claim.

The agent's token is bound to its Node, as the agent pod's projected token is to its pod and node,
so the API server's granular authorization of status.devices (DRAResourceClaimGranularStatusAuthorization,
beta and on in 1.36) takes the ``associated-node:update`` path that the project's ClusterRole grants.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from dra_devcluster.images import WORKLOAD_IMAGE
from tests.integration.agent.agentproc import GPU
from tests.integration.node.conftest import CLASS, NAMESPACE, NODE, NodeWithAgent

AGENT_TOKEN_BOUND_TO_NODE = True

CLAIM = "gpu-status"
POD = "gpu-status"
KUBECTL_DRA = Path(sys.executable).parent / "kubectl-dra"


def claim_and_pod() -> list[dict[str, Any]]:
    """A standalone claim (it outlives the pod) and a pod on the real node that uses it."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": CLAIM, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": WORKLOAD_IMAGE,
                    "command": ["sh", "-c", "echo up; sleep 3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": CLAIM}],
        },
    }
    return [claim, pod]


def our_entries(setup: NodeWithAgent) -> list[dict[str, Any]] | None:
    """The agent's entries in the claim's status.devices; None once the claim is gone."""
    found = setup.cluster.kubectl("get", "resourceclaim", CLAIM, "-n", NAMESPACE, "-o", "json", check=False)
    if found.returncode != 0:
        return None
    devices: list[dict[str, Any]] = (json.loads(found.stdout).get("status") or {}).get("devices") or []
    return [e for e in devices if e["driver"] == GPU]


def ready(entry: dict[str, Any]) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in entry.get("conditions") or [] if c["type"] == "Ready"]
    assert len(found) == 1, entry
    return found[0]


def wait_ready(setup: NodeWithAgent, status: str, what: str) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        entries = our_entries(setup) or []
        if len(entries) == 1 and ready(entries[0])["status"] == status:
            return entries[0]
        return None

    entry: dict[str, Any] = setup.cluster.wait_for(seen, timeout=60, interval=0.5, what=what)
    return entry


def slice_device(setup: NodeWithAgent, name: str) -> dict[str, Any]:
    slices = setup.cluster.get_json("resourceslices", f"--field-selector=spec.nodeName={NODE}")["items"]
    for item in slices:
        for device in item["spec"].get("devices") or []:
            if device["name"] == name:
                found: dict[str, Any] = device
                return found
    raise AssertionError(f"device {name} is in no ResourceSlice of {NODE}")


def test_the_claim_shows_the_agents_device_status_while_the_pod_runs(node_with_agent: NodeWithAgent) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    cluster.apply(claim_and_pod())
    setup.wait_log(POD, "up")
    claim = cluster.get_json("resourceclaim", CLAIM, "-n", NAMESPACE)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    device = result["device"]

    # Prepared: one entry, Ready and healthy, with the GPU's UUID and PCI bus ID that the slice publishes.
    entry = wait_ready(setup, "True", f"the agent's Ready entry for {device} in the claim")
    assert (entry["pool"], entry["device"]) == (NODE, device)
    assert "shareID" not in entry
    assert ready(entry)["reason"] == "Healthy"
    attributes = slice_device(setup, device)["attributes"]
    assert entry["data"]["uuid"] == attributes["uuid"]["string"]
    assert entry["data"]["uuid"].startswith("GPU-")
    assert entry["data"]["pciBusID"] == attributes["resource.kubernetes.io/pciBusID"]["string"]
    healthy_since = ready(entry)["lastTransitionTime"]

    # kubectl dra claims shows it.
    listed = subprocess.run(
        [str(KUBECTL_DRA), "claims", "-n", NAMESPACE, "-o", "json", f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (row,) = [i for i in json.loads(listed.stdout)["items"] if i["name"] == CLAIM]
    (status,) = row["deviceStatus"]
    assert (status["device"], status["ready"], status["data"]["uuid"]) == (
        device,
        "True",
        entry["data"]["uuid"],
    )

    # XID 79 on the claim's GPU (the simulated NVML's fault folder): Ready False, with the XID.
    (setup.faults_dir() / f"xid-{device.removeprefix('gpu-')}-79").touch()
    unhealthy = wait_ready(setup, "False", f"Ready False for {device} after XID 79")
    assert ready(unhealthy)["reason"] == "XID"
    assert "79" in ready(unhealthy)["message"]
    assert ready(unhealthy)["lastTransitionTime"] >= healthy_since
    assert unhealthy["data"] == entry["data"]
    # No new fault for the recovery period (8 s here): Ready again, the pod untouched.
    wait_ready(setup, "True", f"Ready True again for {device} after the recovery period")
    assert cluster.get_json("pod", POD, "-n", NAMESPACE)["status"]["phase"] == "Running"

    # The pod goes: the kubelet unprepares the claim and the agent's entry goes with it (removed by
    # the agent, or dropped by the API server when the claim controller deallocates the claim).
    uid = claim["metadata"]["uid"]
    cluster.kubectl("delete", "pod", POD, "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    cluster.wait_for(
        lambda: uid not in setup.agent.dirs.checkpoint_claims(), timeout=60, what="the claim unprepared"
    )
    cluster.wait_for(lambda: not our_entries(setup), timeout=60, what="the agent's entry gone from the claim")
    log = setup.agent.log_text()
    assert "refuses status.devices" not in log, setup.agent.log_tail(40)
    assert "drops ResourceClaim status.devices" not in log, setup.agent.log_tail(40)
    assert "rejected the device status" not in log, setup.agent.log_tail(40)
    assert (
        setup.agent.metric("dra_agent_device_status_writes_total", driver=GPU, result="written") or 0
    ) >= 3
    cluster.kubectl("delete", "resourceclaim", CLAIM, "-n", NAMESPACE, "--wait=false", check=False)
