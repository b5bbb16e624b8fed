"""Device-plugin style pods served by DRA (KEP-5004, DRAExtendedResource, beta in 1.36) on a real
kubelet: a DeviceClass names an extended resource, a pod asks for it in ``resources.limits`` with no
claim, kube-scheduler makes the pod's special claim, and the agent prepares it like any other."""

from __future__ import annotations

import json
from typing import Any

import yaml

from dra_devcluster.images import VECTOR_ADD_IMAGE
from tests.integration.agent.agentproc import GPU, TPU
from tests.integration.objects import device_class

from .conftest import NAMESPACE, NODE, NodeWithAgent, gpu_pod, wait_gone

EXTENDED = "example.com/real-node-gpu"  # the test's own name: other tests' classes stay unaffected
CLASS = "real-node-extended-gpu"


def _pod(name: str, count: int) -> dict[str, Any]:
    """The node tests' GPU pod, asking through ``resources.limits`` instead of a claim."""
    _, pod = gpu_pod(name, command="nvidia-smi -L; echo done; sleep 3600")
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
        # The agent prepared the scheduler's claim like any other: the container lists two GPUs.
        assert len([line for line in log.splitlines() if line.startswith("GPU ")]) == 2, log
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


TPU_EXTENDED = "example.com/real-node-tpu"
TPU_CLASS = "real-node-extended-tpu"


def test_a_pod_asking_for_tpu_chips_as_for_the_device_plugin_gets_them_from_the_agent(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    # The node also serves a simulated TPU host (four v4 chips) for this test.
    setup.agent.stop()
    setup.agent.profiles = ("h100-80gb-x8", "tpu-v4-2x2x1")
    setup.agent.start()
    tpu_class = device_class(TPU_CLASS, driver=TPU)
    tpu_class["spec"]["extendedResourceName"] = TPU_EXTENDED
    try:
        cluster.apply([tpu_class])
        pod = _pod("extended-tpus", 4)
        main = pod["spec"]["containers"][0]
        main["command"] = [
            "sh",
            "-c",
            "env | grep ^TPU_ | sort; ls /dev | grep -c ^accel; echo done; sleep 3600",
        ]
        main["resources"] = {"limits": {TPU_EXTENDED: "4"}}
        cluster.apply([pod])
        log = setup.wait_log("extended-tpus", "done")
        status = cluster.get_json("pod", "extended-tpus", "-n", NAMESPACE)["status"]
        claim_name = status["extendedResourceClaimStatus"]["resourceClaimName"]
        claim = cluster.get_json("resourceclaim", claim_name, "-n", NAMESPACE)
        results = claim["status"]["allocation"]["devices"]["results"]
        assert {(r["driver"], r["pool"]) for r in results} == {(TPU, NODE)}
        assert len(results) == 4
        lines = log.splitlines()
        # All four chips of the host: the single-host environment and the four device files.
        assert "TPU_TOPOLOGY=2x2x1" in lines, log
        assert "TPU_CHIPS_PER_HOST_BOUNDS=2,2,1" in lines, log
        assert "4" in lines, log
        uid = claim["metadata"]["uid"]
        spec = setup.agent.dirs.cdi_spec(uid, driver=TPU)
        assert spec.exists()
        cluster.kubectl("delete", "pod", "extended-tpus", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
        wait_gone(cluster, spec)
        assert uid not in setup.agent.dirs.checkpoint_claims(TPU)
    finally:
        cluster.kubectl("delete", "pod", "extended-tpus", "-n", NAMESPACE, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "deviceclass", TPU_CLASS, "--ignore-not-found", check=False)
        setup.agent.stop()
        setup.agent.profiles = ("h100-80gb-x8",)
        setup.agent.start()


PLUGIN_NODE = "real-node-plugin"


def test_a_node_whose_device_plugin_advertises_the_resource_keeps_serving_it(
    node_with_agent: NodeWithAgent,
) -> None:
    """Two real nodes side by side: one whose GPUs only the agent publishes, one that advertises the
    extended resource in its status as a device plugin's kubelet does (no agent there). Each pod
    asking for the resource runs; only the one on the DRA node gets a claim and the agent's devices."""
    setup = node_with_agent
    cluster = setup.cluster
    extended_class = device_class(CLASS, driver=GPU)
    extended_class["spec"]["extendedResourceName"] = EXTENDED
    cluster.add_real_node(PLUGIN_NODE)
    try:
        patch = [{"op": "add", "path": "/status/capacity/" + EXTENDED.replace("/", "~1"), "value": "2"}]
        cluster.kubectl(
            "patch", "node", PLUGIN_NODE, "--subresource=status", "--type=json", "-p", json.dumps(patch)
        )
        cluster.wait_for(
            lambda: (
                (cluster.get_json("node", PLUGIN_NODE)["status"].get("allocatable") or {}).get(EXTENDED)
                == "2"
            ),
            what=f"{EXTENDED} in the allocatable of {PLUGIN_NODE}",
        )
        cluster.apply([extended_class])
        on_plugin = _pod("via-plugin", 1)
        on_plugin["spec"]["nodeSelector"] = {"kubernetes.io/hostname": PLUGIN_NODE}
        on_plugin["spec"]["containers"][0]["command"] = [
            "sh",
            "-c",
            "echo visible=${NVIDIA_VISIBLE_DEVICES:-none}; echo done; sleep 3600",
        ]
        cluster.apply([_pod("via-dra", 1), on_plugin])
        log = setup.wait_log("via-dra", "done")
        assert len([line for line in log.splitlines() if line.startswith("GPU ")]) == 1, log

        def plugin_log() -> str | None:
            # Read through the API server (the node is not the fixture's, whose log folder it reads).
            result = cluster.kubectl("logs", "via-plugin", "-n", NAMESPACE, check=False)
            return result.stdout if "done" in result.stdout else None

        plugin_output = cluster.wait_for(plugin_log, timeout=90, what="via-plugin's log")
        # Served by the node's own advertisement: no claim, no device from the agent.
        assert "visible=none" in plugin_output.splitlines(), plugin_output
        via_plugin = cluster.get_json("pod", "via-plugin", "-n", NAMESPACE)
        assert via_plugin["spec"]["nodeName"] == PLUGIN_NODE
        assert not via_plugin["status"].get("extendedResourceClaimStatus"), via_plugin["status"]
        via_dra = cluster.get_json("pod", "via-dra", "-n", NAMESPACE)
        claim_name = via_dra["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        claims = cluster.get_json("resourceclaims", "-n", NAMESPACE)["items"]
        assert [c["metadata"]["name"] for c in claims] == [claim_name]
    finally:
        cluster.kubectl(
            "delete", "pod", "via-dra", "via-plugin", "-n", NAMESPACE, "--ignore-not-found", check=False
        )
        cluster.kubectl("delete", "deviceclass", CLASS, "--ignore-not-found", check=False)
        cluster.remove_real_node(PLUGIN_NODE)


# The device plugin guide's example pod (Kubernetes docs, "Schedule GPUs"), as written there; only
# its image is replaced (no registry is reachable), by a stand-in that lists its GPUs by default.
SEED_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: example-vector-add
spec:
  restartPolicy: OnFailure
  containers:
    - name: example-vector-add
      image: "registry.example/example-vector-add:v42"
      resources:
        limits:
          gpu-vendor.example/example-gpu: 1 # requesting 1 GPU
"""
SEED_RESOURCE = "gpu-vendor.example/example-gpu"
SEED_CLASS = "real-node-seed-gpu"


def test_the_device_plugin_guides_example_pod_runs_as_written_on_gpus_the_agent_prepares(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    pod = yaml.safe_load(SEED_POD)
    assert pod["spec"]["containers"][0]["image"] == "registry.example/example-vector-add:v42"
    pod["spec"]["containers"][0]["image"] = VECTOR_ADD_IMAGE
    pod["metadata"]["namespace"] = NAMESPACE
    # The pod names no node: the class (the test's own) takes only this node's GPUs, by UUID, so
    # kube-scheduler cannot pick a Node object of another test that has no kubelet.
    uuids = [
        d["attributes"]["uuid"]["string"]
        for s in cluster.get_json("resourceslices")["items"]
        if s["spec"].get("nodeName") == NODE and s["spec"]["driver"] == GPU
        for d in s["spec"].get("devices") or []
    ]
    assert uuids
    seed_class = device_class(
        SEED_CLASS, driver=GPU, extra_cel=[f'device.attributes["{GPU}"].uuid in {json.dumps(uuids)}']
    )
    seed_class["spec"]["extendedResourceName"] = SEED_RESOURCE
    cluster.apply([seed_class])
    try:
        cluster.apply([pod])
        done = cluster.wait_for(
            lambda: (
                (p := cluster.get_json("pod", "example-vector-add", "-n", NAMESPACE))["status"].get("phase")
                == "Succeeded"
                and p
            ),
            timeout=120,
            what="example-vector-add Succeeded",
        )
        assert done["spec"]["nodeName"] == NODE
        assert done["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        log = setup.pod_log("example-vector-add", container="example-vector-add")
        gpus = [line for line in log.splitlines() if line.startswith("GPU ")]
        assert len(gpus) == 1, log
        assert "(UUID: GPU-" in gpus[0], log
        assert "Test PASSED" in log.splitlines(), log
    finally:
        cluster.kubectl(
            "delete", "pod", "example-vector-add", "-n", NAMESPACE, "--ignore-not-found", check=False
        )
        cluster.kubectl("delete", "deviceclass", SEED_CLASS, "--ignore-not-found", check=False)
