"""MPS on a real node: a pod whose claim asks NVIDIA's GpuConfig for MPS with limits gets the claim's
control daemon (started by the agent before the prepare returned) through its pipe folder
(read-only) and shm tmpfs, and the limits in its environment; the daemon stops when the kubelet
unprepares the claim. Two containers of different users share one claim's daemon with
``multiUser``, and without it the second user is turned away (the simulated daemon models that).
NVIDIA's quickstart examples gpu-test-mps and gpu-test5 run here as written (but for the image and
the nbody sample, see ``nvidia_examples``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dra_devcluster.images import WORKLOAD_IMAGE
from dra_node_agent.prepare import PAUSE_ENV
from tests.integration.agent.agentproc import GPU
from tests.integration.node import nvidia_examples as examples
from tests.integration.node.conftest import CLASS, NAMESPACE, NODE, NodeWithAgent, gpu_pod, wait_gone
from tests.integration.node.test_real_node import _registrations, _wait_registered
from tests.integration.node.test_real_node_configs import with_config
from tests.integration.node.test_time_slicing import gpu_state

NVIDIA = "resource.nvidia.com/v1beta1"
SHOW = (
    "env | grep ^CUDA_MPS_ | sort; ls /tmp/nvidia-mps; cat /tmp/nvidia-mps/settings; mps-client; "
    "grep -E ' /dev/shm | /tmp/nvidia-mps ' /proc/mounts; touch /tmp/nvidia-mps/planted 2>&1; "
    "echo shown; sleep 3600"
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
    # The container's /dev/shm is the daemon's, a tmpfs of the claim's size (the agent's default
    # 1Gi), mounted noexec as the pipe folder is; the pipe folder is read-only.
    assert f"mps-client: /dev/shm is the server's: {','.join(uuids)}" in lines, log
    mounts = {
        line.split()[1]: line.split() for line in lines if line.startswith("tmpfs ") or " /tmp/" in line
    }
    assert mounts["/dev/shm"][2] == "tmpfs", log
    assert "size=1048576k" in mounts["/dev/shm"][3], log
    assert {"rw", "nosuid", "nodev", "noexec"} <= set(mounts["/dev/shm"][3].split(",")), log
    assert {"ro", "nosuid", "nodev", "noexec"} <= set(mounts["/tmp/nvidia-mps"][3].split(",")), log
    assert "touch: /tmp/nvidia-mps/planted: Read-only file system" in lines, log
    assert not (folder / "pipe" / "planted").exists()
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


def shared_claim_pod(name: str, *, multi_user: bool) -> list[dict[str, Any]]:
    """A claim for one GPU with MPS, and a pod whose two containers share it, as users 1000 and
    2000: each connects to the claim's daemon and stays connected."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS, "count": 1}}],
                "config": [
                    {
                        "requests": ["gpu"],
                        "opaque": {
                            "driver": GPU,
                            "parameters": {
                                "apiVersion": NVIDIA,
                                "kind": "GpuConfig",
                                "sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": multi_user}},
                            },
                        },
                    }
                ],
            }
        },
    }
    containers = [
        {
            "name": container,
            "image": WORKLOAD_IMAGE,
            "command": ["sh", "-c", "mps-client hold 3600; echo ended"],
            "securityContext": {"runAsUser": user, "runAsGroup": user},
            "resources": {"claims": [{"name": "gpu"}]},
        }
        for container, user in (("a", 1000), ("b", 2000))
    ]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "containers": containers,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }
    return [claim, pod]


def test_two_containers_of_different_users_share_one_claims_daemon_only_with_multi_user(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    cluster.apply(
        shared_claim_pod("mps-multi", multi_user=True) + shared_claim_pod("mps-single", multi_user=False)
    )

    def answered(pod: str) -> dict[str, str] | None:
        logs = {c: setup.pod_log(pod, c) for c in ("a", "b")}
        # Served: it says so, then whether its /dev/shm is the server's; turned away: it exits.
        done = all("mps-client: /dev/shm is" in log or "ended" in log for log in logs.values())
        return logs if done else None

    multi = cluster.wait_for(lambda: answered("mps-multi"), timeout=120, what="both users answered (multi)")
    single = cluster.wait_for(
        lambda: answered("mps-single"), timeout=120, what="both users answered (single)"
    )

    # Multi-user: one server (the daemon's user) serves both, and both share its /dev/shm.
    for container, user in (("a", 1000), ("b", 2000)):
        assert (
            f"served by the MPS server of user 0 (client user {user}, multi-user yes)" in multi[container]
        ), multi
        assert "mps-client: /dev/shm is the server's:" in multi[container], multi
    # Single-user: the first user's server serves it; the other user is turned away.
    served = [c for c in ("a", "b") if "served by the MPS server" in single[c]]
    refused = [c for c in ("a", "b") if "refused: the MPS server of user" in single[c]]
    assert len(served) == 1, single
    assert len(refused) == 1, single
    assert "(the daemon is not multi-user)" in single[refused[0]]
    claims = {
        c["metadata"]["name"]: c["metadata"]["uid"]
        for c in cluster.get_json("resourceclaims", "-n", NAMESPACE)["items"]
    }
    root = setup.agent.dirs.checkpoint().parent / "mps"
    assert json.loads((root / claims["mps-multi"] / "daemon.json").read_text())["multiUser"] is True
    assert json.loads((root / claims["mps-single"] / "daemon.json").read_text())["multiUser"] is False

    for name in ("mps-multi", "mps-single"):
        cluster.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=true", "--timeout=60s")
        wait_gone(cluster, root / claims[name])
        cluster.kubectl("delete", "resourceclaim", name, "-n", NAMESPACE, "--wait=true", "--timeout=60s")


MPS_SHOW = "env | grep ^CUDA_MPS_ | sort; mps-client; nvidia-smi -L"
NVIDIA_MPS_ENV = [
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
    "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
]


def mps_daemon_uuids(setup: NodeWithAgent, claim: dict[str, Any]) -> list[str]:
    folder = setup.agent.dirs.checkpoint().parent / "mps" / claim["metadata"]["uid"]
    record = json.loads((folder / "daemon.json").read_text())
    assert alive(int(record["pid"]))
    return list(record["uuids"])


def test_nvidias_gpu_test_mps_two_containers_share_one_gpus_daemon_with_its_limits(
    node_with_agent: NodeWithAgent,
) -> None:
    """NVIDIA's quickstart gpu-test-mps: one GPU with MPS (50 % of the threads, 10Gi pinned) for
    both containers of one pod."""
    setup = node_with_agent
    cluster = setup.cluster
    docs = examples.example_docs("gpu-test-mps")
    (template,) = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    asked = template["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    with examples.gpu_class(cluster), examples.applied(setup, docs):
        (pod,) = examples.running_pods(cluster, "gpu-test-mps", count=1)
        claim = examples.claim_of(cluster, pod)
        (device,) = examples.results(claim)["mps-gpu"]
        assert examples.allocated_configs(claim) == {"mps-gpu": asked}
        uuid = examples.published(setup, GPU)[device["device"]]["uuid"]
        assert mps_daemon_uuids(setup, claim) == [uuid]
        for container in ("mps-ctr0", "mps-ctr1"):
            shown = examples.in_container(cluster, pod, container, MPS_SHOW).splitlines()
            assert [line for line in shown if line.startswith("CUDA_MPS_")] == NVIDIA_MPS_ENV, shown
            assert f"mps-client: /dev/shm is the server's: {uuid}" in shown, shown
            assert (
                [line for line in shown if line.startswith("GPU ")]
                == [line for line in shown if uuid in line and line.startswith("GPU ")]
                != []
            ), shown
        entry = setup.agent.dirs.checkpoint_claims()[claim["metadata"]["uid"]]
        assert [d.get("mps") for d in entry["devices"]] == [True]
    # Unprepared with the example's namespace: the claim's daemon and its folder are gone.
    assert not (setup.agent.dirs.checkpoint().parent / "mps" / claim["metadata"]["uid"]).exists()


def test_nvidias_gpu_test5_one_claim_time_slices_one_gpu_and_runs_mps_on_another(
    node_with_agent: NodeWithAgent,
) -> None:
    """NVIDIA's quickstart gpu-test5: one claim, two GPUs, one time-sliced (Long) for two
    containers and one with MPS for the other two."""
    setup = node_with_agent
    cluster = setup.cluster
    docs = examples.example_docs("gpu-test5")
    (template,) = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    asked = {
        c["requests"][0]: c["opaque"]["parameters"] for c in template["spec"]["spec"]["devices"]["config"]
    }
    with examples.gpu_class(cluster), examples.applied(setup, docs):
        (pod,) = examples.running_pods(cluster, "gpu-test5", count=1)
        claim = examples.claim_of(cluster, pod)
        by_request = examples.results(claim)
        assert examples.allocated_configs(claim) == asked
        devices = examples.published(setup, GPU)
        (ts,) = [devices[r["device"]]["uuid"] for r in by_request["ts-gpu"]]
        (mps,) = [devices[r["device"]]["uuid"] for r in by_request["mps-gpu"]]
        assert ts != mps
        assert gpu_state(setup, ts) == (0, 3), "compute mode DEFAULT and time slice Long (3)"
        assert mps_daemon_uuids(setup, claim) == [mps]
        for container, uuid in (("ts-ctr0", ts), ("ts-ctr1", ts), ("mps-ctr0", mps), ("mps-ctr1", mps)):
            shown = examples.in_container(cluster, pod, container, MPS_SHOW).splitlines()
            listed = [line for line in shown if line.startswith("GPU ")]
            assert len(listed) == 1, (container, shown)
            assert uuid in listed[0], (container, shown)
            env = [line for line in shown if line.startswith("CUDA_MPS_")]
            assert env == (NVIDIA_MPS_ENV if uuid == mps else []), (container, shown)
        recorded = {
            d["request"]: (d.get("timeSlice"), d.get("mps"))
            for d in setup.agent.dirs.checkpoint_claims()[claim["metadata"]["uid"]]["devices"]
        }
        assert recorded == {"ts-gpu": ("Long", None), "mps-gpu": (None, True)}
    # Unprepared with the namespace: the time-sliced GPU is back to the default slice.
    assert gpu_state(setup, ts) == (0, 0)
