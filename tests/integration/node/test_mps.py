"""MPS on a real node: a pod whose claim asks NVIDIA's GpuConfig for MPS with limits gets the claim's
control daemon (started by the agent before the prepare returned) through its pipe and shm folders,
and the limits in its environment; the daemon stops when the kubelet unprepares the claim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dra_node_agent.prepare import PAUSE_ENV
from tests.integration.agent.agentproc import GPU
from tests.integration.node.conftest import NAMESPACE, NodeWithAgent, gpu_pod
from tests.integration.node.test_real_node import _registrations, _wait_registered
from tests.integration.node.test_real_node_configs import with_config

NVIDIA = "resource.nvidia.com/v1beta1"
SHOW = (
    "env | grep ^CUDA_MPS_ | sort; ls /tmp/nvidia-mps; cat /tmp/nvidia-mps/settings; "
    "echo shm: $(cat /dev/shm/accel-dra-mps-daemon); echo shown; sleep 3600"
)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_an_mps_claims_container_talks_to_its_daemon_with_the_limits_it_asked_for(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    mps: dict[str, Any] = {
        "apiVersion": NVIDIA,
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {"defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "8Gi"},
        },
    }
    cluster.apply(with_config(gpu_pod("gpu-mps-limits", command=SHOW, count=2), GPU, mps))
    log = setup.wait_log("gpu-mps-limits", "shown")
    claim = setup.claim_of("gpu-mps-limits")
    uid = claim["metadata"]["uid"]
    folder = setup.agent.dirs.checkpoint().parent / "mps" / uid
    record = json.loads((folder / "daemon.json").read_text())
    uuids = record["uuids"]
    assert len(uuids) == 2
    assert alive(int(record["pid"]))

    lines = log.splitlines()
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in lines, log
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40" in lines, log
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M,1=8192M" in lines, log
    # The daemon's control FIFO and what it was told, seen from inside the container.
    assert "control" in lines, log
    assert "set_default_active_thread_percentage 40" in lines, log
    for uuid in uuids:
        assert f"set_default_device_pinned_mem_limit {uuid} 8192M" in lines, log
    # The container's /dev/shm is the daemon's.
    assert f"shm: {','.join(uuids)}" in lines, log
    entry = setup.agent.dirs.checkpoint_claims()[uid]
    assert [d.get("mps") for d in entry["devices"]] == [True, True]

    cluster.kubectl("delete", "pod", "gpu-mps-limits", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    cluster.wait_for(lambda: not folder.exists(), timeout=60, what="the claim's MPS folder removed")
    assert not alive(int(record["pid"]))
    assert uid not in setup.agent.dirs.checkpoint_claims()


def test_the_agent_killed_between_the_daemon_and_the_cdi_spec_the_kubelets_retry_starts_a_new_one(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    marker = setup.agent.dirs.state / GPU / "paused-at-devices-set-up"
    before = _registrations(setup)
    setup.agent.stop()
    setup.agent.start(env={PAUSE_ENV: "devices-set-up"})
    _wait_registered(setup, more_than=before)
    mps = {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    cluster.apply(with_config(gpu_pod("gpu-mps-crash", command=SHOW), GPU, mps))
    cluster.wait_for(marker.exists, timeout=90, what="the prepare paused after the daemon started")
    uid = setup.claim_of("gpu-mps-crash")["metadata"]["uid"]
    folder = setup.agent.dirs.checkpoint().parent / "mps" / uid
    first = int(json.loads((folder / "daemon.json").read_text())["pid"])
    assert alive(first)

    # Killed there: the daemon runs, no CDI spec, the claim recorded as PrepareStarted.
    before = _registrations(setup)
    setup.agent.kill()
    marker.unlink()
    setup.agent.start()
    _wait_registered(setup, more_than=before)
    # The kubelet retries the failed prepare with its pod-sync back-off (10 s, 20 s, 40 s, ...): the
    # call the kill broke and those made before the new agent registered fail first.
    log = setup.wait_log("gpu-mps-crash", "shown", timeout=300)
    second = int(json.loads((folder / "daemon.json").read_text())["pid"])
    assert second != first
    assert not alive(first), "the interrupted attempt's daemon was left running"
    assert alive(second)
    assert "control" in log.splitlines(), log

    cluster.kubectl("delete", "pod", "gpu-mps-crash", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    cluster.wait_for(lambda: not folder.exists(), timeout=60, what="the claim's MPS folder removed")
    assert not alive(second)
