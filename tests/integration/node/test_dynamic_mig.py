"""Dynamic MIG on a real node: the agent (``--dynamic-mig``) publishes every placement of three
MIG-enabled GPUs with a counter set each; the real scheduler picks placements that fit, the agent
creates each pod's MIG device at prepare and destroys it when the kubelet unprepares the claim, and
an agent killed between creating the instance and writing the CDI spec leaves one instance, not two.

The GPU's instances are read where the simulated driver keeps them (the fake NVML's state), as a
test on hardware would ask ``nvidia-smi mig -lgi``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from dra_node_agent.prepare import PAUSE_ENV
from dra_node_agent.simulated.discovery import GPU_STATE_DIR
from dra_node_agent.simulated.fakehw import MIG_INSTANCES_FILE
from tests.integration.agent.agentproc import GPU
from tests.integration.node.conftest import NAMESPACE, NODE, NodeWithAgent, gpu_pod
from tests.integration.node.test_real_node import _registrations, _wait_registered

AGENT_PROFILES = ("mig-dynamic",)
AGENT_ENV = {"DRA_AGENT_DYNAMIC_MIG": "true"}
# The MIG device's UUID as the spec names it (the simulated device's variable; NVIDIA_VISIBLE_DEVICES
# is void, as in NVIDIA's specs), and its capability nodes.
SHOW = (
    "echo visible=$(env | grep ^DRA_SIMULATED_DEVICE_ | cut -d= -f2); "
    "ls /dev/nvidia-caps; echo shown; sleep 3600"
)
_VISIBLE = re.compile(r"^visible=(\S*)$", re.MULTILINE)


def profile_pod(name: str, profile: str) -> list[dict[str, Any]]:
    """``gpu_pod`` asking for one MIG device of ``profile`` (NVIDIA's attribute, as users write it)."""
    objects = gpu_pod(name, command=SHOW)
    request = objects[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    request["selectors"] = [{"cel": {"expression": f'device.attributes["{GPU}"].profile == "{profile}"'}}]
    return objects


def published(setup: NodeWithAgent) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The counter sets and devices of the node's GPU pool."""
    slices = setup.cluster.get_json("resourceslices", f"--field-selector=spec.nodeName={NODE}")["items"]
    ours = [s["spec"] for s in slices if s["spec"]["driver"] == GPU]
    counters = [c for s in ours for c in s.get("sharedCounters") or []]
    devices = [d for s in ours for d in s.get("devices") or []]
    return counters, devices


def instances(setup: NodeWithAgent, gpu_uuid: str) -> list[dict[str, Any]]:
    """The GPU's MIG instances as the simulated driver keeps them."""
    (hardware,) = (setup.agent.dirs.state / "simulated").iterdir()
    path: Path = hardware / GPU_STATE_DIR / gpu_uuid / MIG_INSTANCES_FILE
    return list(json.loads(path.read_text())) if path.exists() else []


def a100_40gb(setup: NodeWithAgent) -> str:
    _, devices = published(setup)
    return next(
        d["attributes"]["parentUUID"]["string"]
        for d in devices
        if d["attributes"]["profile"]["string"] == "3g.20gb"
    )


def visible(log: str) -> str:
    found = _VISIBLE.search(log)
    assert found is not None, log
    return found.group(1)


def delete_pod(setup: NodeWithAgent, name: str) -> None:
    setup.cluster.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=true", "--timeout=60s")


def test_placements_are_published_with_counter_sets(node_with_agent: NodeWithAgent) -> None:
    counters, devices = published(node_with_agent)
    assert sorted(c["name"] for c in counters) == [f"gpu-{i}-counter-set" for i in range(3)]
    assert len(devices) == 75
    three = next(d for d in devices if d["name"] == "gpu-0-mig-3g20gb-9-4")
    (consumed,) = three["consumesCounters"]
    assert consumed["counterSet"] == "gpu-0-counter-set"
    assert sorted(k for k in consumed["counters"] if k.startswith("memory-slice")) == [
        f"memory-slice-{i}" for i in range(4, 8)
    ]


def test_two_placements_fit_a_third_waits_and_each_pods_instance_lives_as_long_as_its_claim(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    gpu = a100_40gb(setup)
    # An A100 40GB holds two 3g.20gb instances (memory slices 0-3 and 4-7); nothing else asks for it.
    cluster.apply(profile_pod("mig-a", "3g.20gb"))
    cluster.apply(profile_pod("mig-b", "3g.20gb"))
    seen = {visible(setup.wait_log(pod, "shown")) for pod in ("mig-a", "mig-b")}
    live = instances(setup, gpu)
    assert sorted(i["start"] for i in live) == [0, 4]
    assert seen == {i["uuid"] for i in live}, (seen, live)
    assert all(u.startswith("MIG-") for u in seen)
    claim = setup.claim_of("mig-a")
    recorded = setup.agent.dirs.checkpoint_claims()[claim["metadata"]["uid"]]
    assert [d.get("migUUID") for d in recorded["devices"]] == [visible(setup.pod_log("mig-a"))]

    # The counters are used up: the scheduler leaves a third such pod pending, and it says why.
    cluster.apply(profile_pod("mig-c", "3g.20gb"))

    def unschedulable() -> str | None:
        pod = cluster.get_json("pod", "mig-c", "-n", NAMESPACE)
        for condition in pod.get("status", {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return str(condition.get("message", ""))
        return None

    message = cluster.wait_for(unschedulable, timeout=60, what="the third pod found unschedulable")
    assert "cannot allocate all claims" in message, message
    assert len(instances(setup, gpu)) == 2

    # One pod goes: its instance is destroyed, and the waiting pod gets that placement.
    delete_pod(setup, "mig-a")
    log = setup.wait_log("mig-c", "shown", timeout=120)
    live = instances(setup, gpu)
    assert len(live) == 2
    assert visible(log) in {i["uuid"] for i in live}
    for pod in ("mig-b", "mig-c"):
        delete_pod(setup, pod)
    cluster.wait_for(lambda: instances(setup, gpu) == [], timeout=60, what="every instance destroyed")


def test_the_agent_killed_between_the_instance_and_the_cdi_spec_leaves_one_instance(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    gpu = a100_40gb(setup)
    marker = setup.agent.dirs.state / GPU / "paused-at-devices-set-up"
    before = _registrations(setup)
    setup.agent.stop()
    setup.agent.start(env={PAUSE_ENV: "devices-set-up"})
    _wait_registered(setup, more_than=before)
    cluster.apply(profile_pod("mig-crash", "4g.20gb"))
    cluster.wait_for(marker.exists, timeout=90, what="the prepare paused after the instance was made")
    (first,) = instances(setup, gpu)
    uid = setup.claim_of("mig-crash")["metadata"]["uid"]
    recorded = setup.agent.dirs.checkpoint_claims()[uid]
    assert recorded["state"] == "PrepareStarted"
    assert [d.get("migUUID") for d in recorded["devices"]] == [first["uuid"]]

    # Killed there: the instance exists, no CDI spec. The kubelet's retry rolls the attempt back
    # (the instance destroyed) and makes it again.
    before = _registrations(setup)
    setup.agent.kill()
    marker.unlink()
    setup.agent.start()
    _wait_registered(setup, more_than=before)
    log = setup.wait_log("mig-crash", "shown", timeout=300)
    (live,) = instances(setup, gpu)
    assert visible(log) == live["uuid"]
    assert live["start"] == 0
    delete_pod(setup, "mig-crash")
    cluster.wait_for(lambda: instances(setup, gpu) == [], timeout=60, what="the instance destroyed")
