"""GPU time-slicing on a real node: one claim with NVIDIA's GpuConfig TimeSlicing, shared by two
containers of one pod and by a second pod; the GPU holds the interval while any pod runs on it and
is reset once the kubelet unprepares the claim. An admin-access claim on the same GPU observes it:
asked for a time slice, its pod's prepare fails and the kubelet puts the agent's words in its
Events; without one it runs beside the workload, and its unprepare leaves the GPU as it was.

The GPU's state is read where the simulated hardware keeps it (the fake NVML's compute mode, the
time slice the host's nvidia-smi stand-in set), as a test on hardware would ask nvidia-smi.

The node has eight A100s with MIG mode off (a test profile): NVIDIA's quickstart gpu-test6, applied
as written but for its image, picks A100s by productName and an ``index`` attribute (0, 2, 4, 6).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dra_devcluster.images import WORKLOAD_IMAGE
from dra_node_agent.prepare import PAUSE_ENV
from dra_node_agent.simulated.discovery import GPU_STATE_DIR
from dra_node_agent.simulated.fakehw import COMPUTE_MODE_FILE, TIME_SLICE_FILE
from tests.integration.agent.agentproc import GPU
from tests.integration.node import nvidia_examples as examples
from tests.integration.node.conftest import CLASS, NAMESPACE, NODE, NodeWithAgent
from tests.integration.node.test_real_node import _registrations, _wait_registered
from tests.integration.node.test_real_node_configs import warning_with

# Read by the node_with_agent fixture.
AGENT_PROFILES = (str(Path(__file__).parents[2] / "fixtures" / "profiles" / "a100-40gb-x8.yaml"),)
NVIDIA = "resource.nvidia.com/v1beta1"
_UUID = re.compile(r"\(UUID: (GPU-[0-9a-f-]+)\)")


def gpu_state(setup: NodeWithAgent, uuid: str) -> tuple[int, int]:
    """(compute mode, time slice) of the simulated GPU."""
    (hardware,) = (setup.agent.dirs.state / "simulated").iterdir()
    folder: Path = hardware / GPU_STATE_DIR / uuid
    return int((folder / COMPUTE_MODE_FILE).read_text()), int((folder / TIME_SLICE_FILE).read_text())


def uuids_in(log: str) -> set[str]:
    return set(_UUID.findall(log))


def shared_claim(
    name: str, config: dict[str, Any] | None, *, admin: bool = False, selector: str | None = None
) -> dict[str, Any]:
    """A ResourceClaim for one GPU with ``config`` as its opaque config; pods name it directly."""
    exactly: dict[str, Any] = {"deviceClassName": CLASS, "count": 1}
    if admin:
        exactly["adminAccess"] = True
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": exactly}],
                "config": []
                if config is None
                else [{"requests": ["gpu"], "opaque": {"driver": GPU, "parameters": config}}],
            }
        },
    }


def shared_pod(name: str, claim: str, *, containers: tuple[str, ...], command: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": container,
                    "image": WORKLOAD_IMAGE,
                    "command": ["sh", "-c", command],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
                for container in containers
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


def first_gpu_uuid(setup: NodeWithAgent) -> str:
    slices = setup.cluster.get_json("resourceslices", f"--field-selector=spec.nodeName={NODE}")["items"]
    devices = [d for s in slices if s["spec"]["driver"] == GPU for d in s["spec"].get("devices") or []]
    first = min(devices, key=lambda d: int(d["name"].rsplit("-", 1)[1]))
    return str(first["attributes"]["uuid"]["string"])


def time_slicing(interval: str) -> dict[str, Any]:
    return {
        "apiVersion": NVIDIA,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
    }


def test_one_claim_shared_by_two_containers_and_two_pods_holds_the_slice_until_unprepared(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    listing = "nvidia-smi -L; echo listed; sleep 3600"
    cluster.apply([shared_claim("ts-shared", time_slicing("Long"))])
    cluster.apply([shared_pod("ts-a", "ts-shared", containers=("main", "second"), command=listing)])
    cluster.apply([shared_pod("ts-b", "ts-shared", containers=("main",), command=listing)])

    logs = [setup.wait_log("ts-a", "listed"), setup.wait_log("ts-b", "listed")]

    def second_listed() -> str | None:
        text = setup.pod_log("ts-a", "second")
        return text if "listed" in text else None

    second = cluster.wait_for(second_listed, timeout=60, what="the second container's listing")
    seen = [uuids_in(log) for log in [*logs, second]]
    assert all(len(s) == 1 for s in seen), seen
    assert seen[0] == seen[1] == seen[2], f"the containers got different GPUs: {seen}"
    (uuid,) = seen[0]
    assert gpu_state(setup, uuid) == (0, 3), "compute mode DEFAULT and time slice Long (3)"
    claim = cluster.get_json("resourceclaim", "ts-shared", "-n", NAMESPACE)
    recorded = setup.agent.dirs.checkpoint_claims()[claim["metadata"]["uid"]]
    assert [d.get("timeSlice") for d in recorded["devices"]] == ["Long"]

    # One pod goes: the other still runs on the claim, so nothing is unprepared or reset.
    cluster.kubectl("delete", "pod", "ts-a", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    assert gpu_state(setup, uuid) == (0, 3)
    # The last one goes: the kubelet unprepares the claim, and the GPU's slice is back to Default.
    cluster.kubectl("delete", "pod", "ts-b", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    cluster.wait_for(
        lambda: claim["metadata"]["uid"] not in setup.agent.dirs.checkpoint_claims(),
        timeout=60,
        what="the claim unprepared",
    )
    assert gpu_state(setup, uuid) == (0, 0)
    cluster.kubectl("delete", "resourceclaim", "ts-shared", "-n", NAMESPACE, "--wait=true", "--timeout=60s")


def test_an_admin_access_claim_observes_the_gpu_and_never_sets_its_slice(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    # Admin access lets a claim hold a GPU another claim holds (monitoring beside a workload); the
    # namespace must allow it. All three claims name the same GPU.
    cluster.kubectl(
        "label", "namespace", NAMESPACE, "resource.kubernetes.io/admin-access=true", "--overwrite"
    )
    uuid = first_gpu_uuid(setup)
    selector = f'device.attributes["{GPU}"].uuid == "{uuid}"'
    cluster.apply([shared_claim("ts-work", time_slicing("Short"), selector=selector)])
    cluster.apply([shared_claim("ts-admin-asks", time_slicing("Long"), admin=True, selector=selector)])
    cluster.apply([shared_claim("ts-observer", None, admin=True, selector=selector)])
    up = "echo up; sleep 3600"
    cluster.apply([shared_pod("ts-work", "ts-work", containers=("main",), command=up)])
    setup.wait_log("ts-work", "up")
    assert gpu_state(setup, uuid) == (0, 1)

    cluster.apply([shared_pod("ts-admin-asks", "ts-admin-asks", containers=("main",), command=up)])
    message = cluster.wait_for(
        lambda: warning_with(setup, "ts-admin-asks", "admin access observes device"),
        timeout=90,
        what="a Warning Event with the agent's refusal",
    )
    assert f"ResourceClaim {NAMESPACE}/ts-admin-asks" in message, message
    assert (
        "never reconfigures it (other claims may hold it), so GpuConfig sharing.strategy TimeSlicing"
        in message
    )
    assert setup.pod_log("ts-admin-asks") == ""
    asks_uid = cluster.get_json("resourceclaim", "ts-admin-asks", "-n", NAMESPACE)["metadata"]["uid"]
    assert asks_uid not in setup.agent.dirs.checkpoint_claims()
    assert gpu_state(setup, uuid) == (0, 1)

    cluster.apply([shared_pod("ts-observer", "ts-observer", containers=("main",), command=up)])
    setup.wait_log("ts-observer", "up")
    cluster.kubectl("delete", "pod", "ts-observer", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    observer_uid = cluster.get_json("resourceclaim", "ts-observer", "-n", NAMESPACE)["metadata"]["uid"]
    cluster.wait_for(
        lambda: observer_uid not in setup.agent.dirs.checkpoint_claims(),
        timeout=60,
        what="observer unprepared",
    )
    assert gpu_state(setup, uuid) == (0, 1), "the observer's unprepare reset the workload's slice"
    for pod in ("ts-admin-asks", "ts-work"):
        cluster.kubectl("delete", "pod", pod, "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    for name in ("ts-work", "ts-admin-asks", "ts-observer"):
        cluster.kubectl("delete", "resourceclaim", name, "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    cluster.kubectl("label", "namespace", NAMESPACE, "resource.kubernetes.io/admin-access-")


def test_the_agent_killed_after_setting_the_slice_the_kubelets_retry_sets_it_again(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    marker = setup.agent.dirs.state / GPU / "paused-at-devices-set-up"
    before = _registrations(setup)
    setup.agent.stop()
    setup.agent.start(env={PAUSE_ENV: "devices-set-up"})
    _wait_registered(setup, more_than=before)
    uuid = first_gpu_uuid(setup)
    selector = f'device.attributes["{GPU}"].uuid == "{uuid}"'
    cluster.apply([shared_claim("ts-crash", time_slicing("Medium"), selector=selector)])
    cluster.apply([shared_pod("ts-crash", "ts-crash", containers=("main",), command="echo up; sleep 3600")])
    cluster.wait_for(marker.exists, timeout=90, what="the prepare paused after the slice was set")
    assert gpu_state(setup, uuid) == (0, 2)
    uid = cluster.get_json("resourceclaim", "ts-crash", "-n", NAMESPACE)["metadata"]["uid"]
    assert setup.agent.dirs.checkpoint_claims()[uid]["state"] == "PrepareStarted"

    # Killed there: the GPU holds the slice, no CDI spec. The retry resets it and sets it again.
    before = _registrations(setup)
    setup.agent.kill()
    marker.unlink()
    setup.agent.start()
    _wait_registered(setup, more_than=before)
    setup.wait_log("ts-crash", "up", timeout=300)
    assert gpu_state(setup, uuid) == (0, 2)
    assert setup.agent.dirs.checkpoint_claims()[uid]["state"] == "PrepareCompleted"
    cluster.kubectl("delete", "pod", "ts-crash", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    cluster.wait_for(
        lambda: uid not in setup.agent.dirs.checkpoint_claims(), timeout=60, what="the claim unprepared"
    )
    assert gpu_state(setup, uuid) == (0, 0)
    cluster.kubectl("delete", "resourceclaim", "ts-crash", "-n", NAMESPACE, "--wait=true", "--timeout=60s")


def test_nvidias_gpu_test6_selects_a100s_by_an_index_attribute_no_gpu_has(
    node_with_agent: NodeWithAgent,
) -> None:
    """NVIDIA's quickstart gpu-test6 (four replicas, each time-slicing one A100 its CEL selector
    picks by ``productName`` and ``index``) as written: no GPU of driver gpu.nvidia.com has an
    ``index`` attribute (NVIDIA's driver no longer publishes one either), so on an A100, whose
    product name matches, the selector fails and kube-scheduler leaves every replica pending."""
    setup = node_with_agent
    cluster = setup.cluster
    devices = examples.published(setup, GPU)
    assert {d["productName"] for d in devices.values()} == {"NVIDIA A100-SXM4-40GB"}
    assert not any("index" in d for d in devices.values())
    docs = examples.example_docs("gpu-test6")
    no_index = "CEL runtime error: no such key: index"
    with examples.gpu_class(cluster), examples.applied(setup, docs):

        def refused() -> list[str] | None:
            events = cluster.get_json("events", "-n", "gpu-test6")["items"]
            pods = {
                e["involvedObject"]["name"]
                for e in events
                if e["reason"] == "FailedScheduling" and no_index in e["message"]
            }
            return sorted(pods) if len(pods) == 4 else None

        cluster.wait_for(refused, timeout=90, what="all four replicas refused for the missing index")
        pods = cluster.get_json("pods", "-n", "gpu-test6")["items"]
        assert [p["status"]["phase"] for p in pods] == ["Pending"] * 4
        claims = cluster.get_json("resourceclaims", "-n", "gpu-test6")["items"]
        assert len(claims) == 4
        assert not any(c.get("status", {}).get("allocation") for c in claims)
