"""The node agent under a real kubelet, with a real container runtime: registration through the
kubelet's plugin watcher, the health stream it opens, a pod whose container receives what the CDI
spec says, clean-up when the pod goes, and a kubelet restarted while the agent holds its call."""

from __future__ import annotations

import contextlib
import json
import time
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dra_node_agent.plugin.registration import FAIL_GETINFO_ENV
from dra_node_agent.prepare import PAUSE_ENV
from tests.integration.agent.agentproc import GPU, AgentDirs
from tests.integration.node.conftest import NAMESPACE, NODE, NodeWithAgent, gpu_pod, wait_gone

REGISTERED = f"kubelet registered DRA driver {GPU}"


def test_the_kubelet_registers_the_agent_and_opens_its_health_stream(node_with_agent: NodeWithAgent) -> None:
    setup = node_with_agent
    agent_log = setup.cluster.wait_for(
        lambda: (log := setup.agent.log_text()) and "kubelet opened the health stream" in log and log,
        timeout=60,
        what="the kubelet's registration and health stream",
    )
    assert f"kubelet registered DRA driver {GPU}" in agent_log
    # The agent offers health v1 and v1alpha1; a 1.37 kubelet takes v1 (the 1.34 kubelet's choice:
    # test_health_older_kubelet.py).
    assert f"kubelet opened the health stream of driver {GPU} (v1)" in agent_log
    assert f"kubelet opened the health stream of driver {GPU} (v1alpha1)" not in agent_log
    node = setup.cluster.get_json("node", NODE)
    assert node["status"]["nodeInfo"]["kubeletVersion"] == setup.cluster.kubernetes.version
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.2")
    slices = setup.cluster.get_json("resourceslices", f"--field-selector=spec.nodeName={NODE}")["items"]
    assert sum(len(s["spec"].get("devices") or []) for s in slices) == 8


def test_a_pod_gets_its_gpu_from_the_cdi_spec_and_gives_it_back(node_with_agent: NodeWithAgent) -> None:
    setup = node_with_agent
    setup.cluster.apply(
        gpu_pod(
            "gpu-env",
            command="env | grep ^NVIDIA_ | sort; ls -l /dev/nvidia*; echo done; sleep 3600",
        )
    )
    log = setup.wait_log("gpu-env", "done")
    claim = setup.claim_of("gpu-env")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == NODE
    # The environment and the device nodes come from the agent's CDI spec, applied by containerd.
    assert "NVIDIA_VISIBLE_DEVICES=void" in log
    device_lines = [line for line in log.splitlines() if line.startswith("c") and "/dev/nvidia" in line]
    assert any("195," in line and "/dev/nvidiactl" in line for line in device_lines), log
    assert any(
        line.rstrip().endswith(f"/dev/nvidia{result['device'].removeprefix('gpu-')}") for line in device_lines
    ), log
    spec = setup.agent.dirs.cdi_spec(claim["metadata"]["uid"])
    assert spec.exists()
    assert claim["metadata"]["uid"] in setup.agent.dirs.checkpoint_claims()
    pod = setup.cluster.get_json("pod", "gpu-env", "-n", NAMESPACE)
    assert pod["status"]["phase"] == "Running"

    # Deleting the pod: the kubelet unprepares, the agent removes the CDI spec and the checkpoint entry.
    setup.cluster.kubectl("delete", "pod", "gpu-env", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    wait_gone(setup.cluster, spec)
    assert claim["metadata"]["uid"] not in setup.agent.dirs.checkpoint_claims()


def test_kubectl_logs_and_exec_reach_the_kubelet_through_the_api_server(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    setup.cluster.apply(gpu_pod("gpu-logs", command="echo hello from $(hostname); sleep 3600"))
    setup.wait_log("gpu-logs", "hello from gpu-logs")
    # The API server reaches the kubelet by node name through the cluster's node proxy.
    logs = setup.cluster.kubectl("logs", "gpu-logs", "-n", NAMESPACE).stdout
    assert logs.strip() == "hello from gpu-logs"
    listing = setup.cluster.kubectl("exec", "gpu-logs", "-n", NAMESPACE, "--", "ls", "-l", "/dev/").stdout
    assert any(line.startswith("c") and "nvidiactl" in line for line in listing.splitlines()), listing
    setup.cluster.kubectl("delete", "pod", "gpu-logs", "-n", NAMESPACE, "--wait=true", "--timeout=60s")


def test_an_xid_shows_in_the_containers_resource_status_and_recovers(node_with_agent: NodeWithAgent) -> None:
    setup = node_with_agent
    setup.cluster.apply(gpu_pod("gpu-health", command="echo started; sleep 3600"))
    setup.wait_log("gpu-health", "started")
    claim = setup.claim_of("gpu-health")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    # The kubelet names the device by the CDI device ID the agent returned for it.
    resource = f"k8s.{GPU}/claim={claim['metadata']['uid']}-{result['device']}"

    def health(state: str, what: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = setup.cluster.wait_for(
            lambda: [
                r
                for r in setup.resource_health("gpu-health")
                if r["resourceID"] == resource and r["health"] == state
            ],
            timeout=60,
            what=f"{resource} {what} in the pod's status",
        )
        return found[0]

    health("Healthy", "Healthy")
    # XID 79 (the GPU fell off the bus) on the pod's GPU, through the simulated NVML's fault folder.
    (setup.faults_dir() / f"xid-{result['device'].removeprefix('gpu-')}-79").touch()
    unhealthy = health("Unhealthy", "Unhealthy")
    assert "79" in unhealthy.get("message", ""), unhealthy
    # No new fault for the recovery period (8 s here): Healthy again, the pod untouched.
    health("Healthy", "Healthy again")
    assert setup.cluster.get_json("pod", "gpu-health", "-n", NAMESPACE)["status"]["phase"] == "Running"
    setup.cluster.kubectl("delete", "pod", "gpu-health", "-n", NAMESPACE, "--wait=true", "--timeout=60s")


def test_n15_fifty_pods_created_and_deleted_in_quick_succession_leave_nothing(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    names = [f"churn-{i}" for i in range(50)]
    # 50 pods for 8 GPUs: some run, some wait for a device, some are deleted mid-start.
    setup.cluster.apply([obj for name in names for obj in gpu_pod(name, command="sleep 3600")])
    setup.cluster.wait_for(
        lambda: (
            sum(
                1
                for p in setup.cluster.get_json("pods", "-n", NAMESPACE)["items"]
                if (p.get("status") or {}).get("phase") == "Running"
            )
            >= 4
        ),
        timeout=90,
        what="some of the pods running",
    )
    setup.cluster.kubectl("delete", "pods", *names, "-n", NAMESPACE, "--wait=false")
    setup.cluster.wait_for(
        lambda: not setup.cluster.get_json("pods", "-n", NAMESPACE)["items"],
        timeout=120,
        what="every pod gone",
    )
    setup.cluster.wait_for(
        lambda: not setup.cluster.get_json("resourceclaims", "-n", NAMESPACE)["items"],
        timeout=60,
        what="every generated claim gone",
    )
    setup.cluster.wait_for(lambda: not setup.node.tasks(), timeout=60, what="no container left on the node")
    setup.cluster.wait_for(
        lambda: not setup.agent.dirs.checkpoint_claims() and not list(setup.agent.dirs.cdi.glob("*.json")),
        timeout=60,
        what="no checkpoint entry and no CDI spec left",
    )
    slices = setup.cluster.get_json("resourceslices", f"--field-selector=spec.nodeName={NODE}")["items"]
    assert sum(len(s["spec"].get("devices") or []) for s in slices) == 8  # the pool is unchanged
    setup.cluster.kubectl(
        "delete", "resourceclaimtemplates", *names, "-n", NAMESPACE, "--wait=false", check=False
    )


def test_n6_agent_restart_with_a_running_pod_then_pod_deletion(node_with_agent: NodeWithAgent) -> None:
    setup = node_with_agent
    setup.cluster.apply(gpu_pod("gpu-n6", command="echo up; sleep 3600"))
    setup.wait_log("gpu-n6", "up")
    uid = setup.claim_of("gpu-n6")["metadata"]["uid"]
    spec = setup.agent.dirs.cdi_spec(uid)
    assert spec.exists()
    setup.agent.kill()  # SIGKILL: no clean-up
    setup.agent.start()
    setup.cluster.wait_for(
        lambda: setup.agent.log_text().count(f"kubelet registered DRA driver {GPU}") >= 2,
        timeout=60,
        what="the kubelet registering the restarted agent",
    )
    assert setup.cluster.get_json("pod", "gpu-n6", "-n", NAMESPACE)["status"]["phase"] == "Running"
    # N13 on a real kubelet: the killed agent's stale socket was replaced, not duplicated.
    assert sorted(p.name for p in setup.node.registry_dir.iterdir()) == [f"{GPU}-reg.sock"]
    # The restarted agent unprepares from its checkpoint when the kubelet asks.
    setup.cluster.kubectl("delete", "pod", "gpu-n6", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    wait_gone(setup.cluster, spec)
    assert uid not in setup.agent.dirs.checkpoint_claims()


def test_a_kubelet_restart_with_a_running_pod_changes_nothing(node_with_agent: NodeWithAgent) -> None:
    setup = node_with_agent
    setup.cluster.apply(gpu_pod("gpu-kr", command="echo up; sleep 3600"))
    setup.wait_log("gpu-kr", "up")
    uid = setup.claim_of("gpu-kr")["metadata"]["uid"]
    spec = setup.agent.dirs.cdi_spec(uid)
    before = (spec.read_bytes(), setup.agent.dirs.checkpoint_claims()[uid])
    registrations = setup.agent.log_text().count(f"kubelet registered DRA driver {GPU}")
    setup.node.restart_kubelet()
    setup.node.wait_healthy()
    setup.cluster.wait_for(
        lambda: setup.agent.log_text().count(f"kubelet registered DRA driver {GPU}") > registrations,
        timeout=60,
        what="the restarted kubelet registering the agent again",
    )
    pod = setup.cluster.wait_for(
        lambda: (
            (p := setup.cluster.get_json("pod", "gpu-kr", "-n", NAMESPACE))["status"]["phase"] == "Running"
            and p
        ),
        timeout=60,
        what="the pod running after the kubelet restart",
    )
    # The container went on running; the claim stayed prepared exactly as it was.
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert (spec.read_bytes(), setup.agent.dirs.checkpoint_claims()[uid]) == before
    assert not [line for line in setup.agent.log_text().splitlines() if "unprepared" in line and uid in line]
    setup.cluster.kubectl("delete", "pod", "gpu-kr", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    wait_gone(setup.cluster, spec)


def _slices(setup: NodeWithAgent) -> dict[str, str]:
    """This node's ResourceSlices of the GPU driver: name -> uid/pool generation."""
    items = setup.cluster.get_json("resourceslices", f"--field-selector=spec.nodeName={NODE}")["items"]
    return {
        s["metadata"]["name"]: f"{s['metadata']['uid']}/{s['spec']['pool']['generation']}"
        for s in items
        if s["spec"]["driver"] == GPU
    }


def test_n12_agent_down_shorter_and_longer_than_the_kubelets_grace_period(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    before = _slices(setup)
    assert before
    # Down for a few seconds: the kubelet keeps the driver's slices; the agent, registered again,
    # finds them unchanged.
    registrations = _registrations(setup)
    setup.agent.stop()
    down_since = time.monotonic()
    time.sleep(2)
    setup.agent.start()
    _wait_registered(setup, more_than=registrations)
    down_s = time.monotonic() - down_since
    # The scenario's premise, not a bound on the product: back well within the kubelet's 30 s.
    assert down_s < 25, f"the agent took {down_s:.0f} s to stop, start and register: no short outage"
    assert _slices(setup) == before
    # Down for longer than the kubelet's 30 s: it wipes the slices; the agent republishes on return.
    setup.agent.stop()
    setup.cluster.wait_for(
        lambda: not _slices(setup), timeout=60, interval=1, what="the kubelet wiping the slices"
    )
    setup.agent.start()
    after = setup.cluster.wait_for(
        lambda: _slices(setup), timeout=60, what="the agent republishing its slices"
    )
    assert after != before  # new objects
    devices = setup.cluster.get_json("resourceslices", f"--field-selector=spec.nodeName={NODE}")["items"]
    assert sum(len(s["spec"].get("devices") or []) for s in devices) == 8


def test_a_cdi_spec_the_runtime_cannot_use_fails_the_container_start_and_leaves_nothing(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    # The agent writes its specs where containerd does not look (a --cdi-dir that does not match
    # the runtime's cdi_spec_dirs): every CDI device ID it returns is unknown to the runtime.
    good = setup.agent.dirs
    setup.agent.stop()
    setup.agent.dirs = AgentDirs(
        root=good.root,
        kubelet_registry=good.registry,
        kubelet_plugins=good.plugins,
        cdi_dir=good.root / "elsewhere",
    )
    setup.agent.start()
    try:
        setup.cluster.apply(gpu_pod("gpu-bad-cdi", command="echo should not run"))

        def failed_start() -> str | None:
            events = setup.cluster.get_json(
                "events", "-n", NAMESPACE, "--field-selector=involvedObject.name=gpu-bad-cdi"
            )
            messages = [e.get("message", "") for e in events["items"] if e.get("type") == "Warning"]
            return next((m for m in messages if "CDI" in m), None)

        message = setup.cluster.wait_for(
            failed_start, timeout=90, what="a Warning Event about the CDI devices"
        )
        assert "unresolvable CDI devices" in message, message
        uid = setup.claim_of("gpu-bad-cdi")["metadata"]["uid"]
        assert setup.pod_log("gpu-bad-cdi") == ""
        setup.cluster.kubectl("delete", "pod", "gpu-bad-cdi", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
        wait_gone(setup.cluster, setup.agent.dirs.cdi_spec(uid))
        assert uid not in setup.agent.dirs.checkpoint_claims()
    finally:
        setup.agent.stop()
        setup.agent.dirs = good
        setup.agent.start()


# --- kubelet restarts and registration failures (N7, N13) --------------------------------------


def _registrations(setup: NodeWithAgent) -> int:
    return setup.agent.log_text().count(REGISTERED)


def _wait_registered(setup: NodeWithAgent, *, more_than: int) -> None:
    setup.cluster.wait_for(
        lambda: _registrations(setup) > more_than, timeout=90, what="the kubelet registering the agent"
    )


def _this_start_log(setup: NodeWithAgent) -> str:
    """The agent's log since its latest start."""
    return setup.agent.log_text().rsplit(f"===== start #{setup.agent.starts} =====", 1)[-1]


def _kubelet_log_from(setup: NodeWithAgent, offset: int) -> str:
    with (setup.node.logs_dir / "kubelet.log").open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def _kubelet_log_size(setup: NodeWithAgent) -> int:
    return (setup.node.logs_dir / "kubelet.log").stat().st_size


@contextlib.contextmanager
def _agent_started_with(setup: NodeWithAgent, env: Mapping[str, str]) -> Iterator[None]:
    """The agent restarted with ``env``, registered; afterwards restarted without it."""
    before = _registrations(setup)
    setup.agent.stop()
    setup.agent.start(env=env)
    try:
        _wait_registered(setup, more_than=before)
        yield
    finally:
        # A call still paused would hold the agent's shutdown for its whole grace period.
        for marker in (setup.agent.dirs.state / GPU).glob("paused-at-*"):
            marker.unlink()
        setup.agent.stop()
        again = _registrations(setup)
        setup.agent.start()
        _wait_registered(setup, more_than=again)


def _kubelet_calls_in_flight(setup: NodeWithAgent, rpc: str) -> int:
    """How many ``rpc`` calls to DRA plugins the kubelet is waiting on (the kubelet logs nothing
    when it issues one, so its goroutines tell)."""
    try:
        dump = setup.kubelet_goroutines()
    except OSError:
        return 0  # a kubelet that has just started may not serve yet
    return dump.count(f"dra/plugin.(*DRAPlugin).{rpc}(")


def _restart_kubelet_while_paused(setup: NodeWithAgent, *, rpc: str) -> None:
    """Restart the kubelet while the agent holds its ``rpc`` call, and wait until the restarted
    kubelet has issued that call again (it then waits behind the paused one)."""
    registrations = _registrations(setup)
    setup.node.restart_kubelet()
    setup.node.wait_healthy()
    _wait_registered(setup, more_than=registrations)
    setup.cluster.wait_for(
        lambda: _kubelet_calls_in_flight(setup, rpc) > 0,
        timeout=120,
        interval=0.5,
        what=f"the restarted kubelet issuing {rpc} again",
    )


def _kubelet_claims(setup: NodeWithAgent) -> dict[str, dict[str, Any]]:
    """The claims in the kubelet's own DRA checkpoint (``<kubelet root>/dra_manager_state``), by
    UID, after checking the checksum it keeps beside them (CRC-32 of the data)."""
    path = setup.node.kubelet_root / "dra_manager_state"
    if not path.exists():
        return {}
    outer = json.loads(path.read_text())
    assert zlib.crc32(outer["Data"].encode()) == outer["Checksum"], f"{path}: checksum does not match"
    data = json.loads(outer["Data"])
    return {c["ClaimUID"]: c for c in data.get("ClaimInfoStateList") or []}


def _kubelet_devices(setup: NodeWithAgent, uid: str) -> list[tuple[str, str, list[str]]]:
    """What the kubelet recorded as prepared for the claim by this driver: pool, device, CDI IDs."""
    claim = _kubelet_claims(setup).get(uid) or {}
    devices = ((claim.get("DriverState") or {}).get(GPU) or {}).get("Devices") or []
    return [(d["PoolName"], d["DeviceName"], list(d.get("CDIDeviceIDs") or [])) for d in devices]


def _agent_devices(setup: NodeWithAgent, uid: str) -> list[tuple[str, str, list[str]]]:
    """The same, as the agent's checkpoint records it."""
    entry = setup.agent.dirs.checkpoint_claims()[uid]
    return [(d["pool"], d["device"], list(d.get("cdiDeviceIDs") or [])) for d in entry["devices"]]


def _claim_specs(setup: NodeWithAgent, uid: str) -> list[Path]:
    return sorted(p for p in setup.agent.dirs.cdi.glob("*.json") if uid in p.name)


def _claim_exists(setup: NodeWithAgent, uid: str) -> bool:
    items = setup.cluster.get_json("resourceclaims", "-n", NAMESPACE)["items"]
    return any(c["metadata"]["uid"] == uid for c in items)


def _pod_exists(setup: NodeWithAgent, pod: str) -> bool:
    found = setup.cluster.kubectl("get", "pod", pod, "-n", NAMESPACE, "--ignore-not-found", "-o", "name")
    return bool(found.stdout.strip())


def test_n7_kubelet_restart_during_prepare_the_reissued_call_completes_and_the_pod_runs(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    marker = setup.agent.dirs.state / GPU / "paused-at-prepare-started"
    with _agent_started_with(setup, {PAUSE_ENV: "prepare-started"}):
        setup.cluster.apply(gpu_pod("gpu-n7-prepare", command="echo up; sleep 3600"))
        setup.cluster.wait_for(marker.exists, timeout=90, what="the agent pausing the kubelet's prepare")
        uid = setup.claim_of("gpu-n7-prepare")["metadata"]["uid"]
        assert setup.agent.dirs.checkpoint_claims()[uid]["state"] == "PrepareStarted"
        assert _claim_specs(setup, uid) == []

        _restart_kubelet_while_paused(setup, rpc="NodePrepareResources")
        marker.unlink()  # the paused call goes on; the queued ones answer from the checkpoint
        setup.wait_log("gpu-n7-prepare", "up")
        pod = setup.cluster.get_json("pod", "gpu-n7-prepare", "-n", NAMESPACE)
        assert pod["status"]["phase"] == "Running"
        spec = setup.agent.dirs.cdi_spec(uid)
        assert _claim_specs(setup, uid) == [spec]
        assert setup.agent.dirs.checkpoint_claims()[uid]["state"] == "PrepareCompleted"
        log = _this_start_log(setup)
        # Set up once, by the paused call; every later call got the recorded answer.
        assert (
            len([line for line in log.splitlines() if "prepared ResourceClaim" in line and uid in line]) == 1
        )
        assert any(
            "already prepared; answering from the checkpoint" in line and uid in line
            for line in log.splitlines()
        )
        # The two checkpoints agree: the restarted kubelet recorded the claim prepared with the one
        # device and the CDI ID the agent set up and recorded, once.
        agent_devices = _agent_devices(setup, uid)
        (device,) = agent_devices
        assert device[0] == NODE, agent_devices
        assert len(device[2]) == 1, agent_devices
        assert _kubelet_devices(setup, uid) == agent_devices

        setup.cluster.kubectl(
            "delete", "pod", "gpu-n7-prepare", "-n", NAMESPACE, "--wait=true", "--timeout=90s"
        )
        wait_gone(setup.cluster, spec)
        assert uid not in setup.agent.dirs.checkpoint_claims()
        setup.cluster.wait_for(lambda: not _claim_exists(setup, uid), timeout=60, what="the claim deleted")
        setup.cluster.wait_for(
            lambda: uid not in _kubelet_claims(setup),
            timeout=60,
            what="the claim gone from the kubelet's checkpoint",
        )


def test_n7_kubelet_restart_during_unprepare_the_reissued_call_finishes_the_teardown(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    marker = setup.agent.dirs.state / GPU / "paused-at-unprepare-started"
    with _agent_started_with(setup, {PAUSE_ENV: "unprepare-started"}):
        setup.cluster.apply(gpu_pod("gpu-n7-unprepare", command="echo up; sleep 3600"))
        setup.wait_log("gpu-n7-unprepare", "up")
        uid = setup.claim_of("gpu-n7-unprepare")["metadata"]["uid"]
        spec = setup.agent.dirs.cdi_spec(uid)
        assert _claim_specs(setup, uid) == [spec]
        assert setup.agent.dirs.checkpoint_claims()[uid]["state"] == "PrepareCompleted"

        setup.cluster.kubectl("delete", "pod", "gpu-n7-unprepare", "-n", NAMESPACE, "--wait=false")
        setup.cluster.wait_for(marker.exists, timeout=90, what="the agent pausing the kubelet's unprepare")
        # Paused before anything was torn down; the pod waits for its resources to be released,
        # and both checkpoints still hold the claim as prepared, alike.
        assert _claim_specs(setup, uid) == [spec]
        assert setup.agent.dirs.checkpoint_claims()[uid]["state"] == "PrepareCompleted"
        assert _kubelet_devices(setup, uid) == _agent_devices(setup, uid)
        assert _pod_exists(setup, "gpu-n7-unprepare")

        _restart_kubelet_while_paused(setup, rpc="NodeUnprepareResources")
        marker.unlink()
        setup.cluster.wait_for(
            lambda: not _pod_exists(setup, "gpu-n7-unprepare"), timeout=120, what="the pod deleted"
        )
        wait_gone(setup.cluster, spec)
        assert uid not in setup.agent.dirs.checkpoint_claims()
        assert not list(setup.agent.dirs.cdi.glob("*.json"))
        # The restarted kubelet drops it from its checkpoint once the reissued call has answered.
        setup.cluster.wait_for(
            lambda: uid not in _kubelet_claims(setup),
            timeout=60,
            what="the claim gone from the kubelet's checkpoint",
        )
        # Deallocated and unreserved: the resourceclaim controller deletes the pod's claim only then.
        setup.cluster.wait_for(lambda: not _claim_exists(setup, uid), timeout=60, what="the claim deleted")
        log = _this_start_log(setup)
        # Torn down once; the calls queued behind it found nothing left to do.
        assert (
            len([line for line in log.splitlines() if "unprepared ResourceClaim" in line and uid in line])
            == 1
        )
        assert any("unprepare is a no-op" in line and uid in line for line in log.splitlines())


def test_n13_getinfo_failing_twice_the_kubelet_retries_and_the_agent_ends_registered(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    registrations = _registrations(setup)
    offset = _kubelet_log_size(setup)
    setup.agent.kill()  # SIGKILL: its registration socket stays behind, stale
    assert setup.agent.dirs.registration_socket().exists()
    try:
        setup.agent.start(env={FAIL_GETINFO_ENV: "2"})
        _wait_registered(setup, more_than=registrations)
        log = _this_start_log(setup)
        assert "replaced a stale file at plugin socket path" in log
        lines = log.splitlines()
        failed = [i for i, line in enumerate(lines) if "injected GetInfo failure" in line]
        assert [lines[i].split("injected GetInfo failure ", 1)[1][:6] for i in failed] == ["1 of 2", "2 of 2"]
        # Registered only after both failures: the kubelet's plugin watcher tried again on its own.
        assert min(i for i, line in enumerate(lines) if REGISTERED in line) > failed[-1]
        kubelet_log = _kubelet_log_from(setup, offset)
        assert "injected GetInfo failure 1 of 2" in kubelet_log
        assert "injected GetInfo failure 2 of 2" in kubelet_log
        assert sorted(p.name for p in setup.node.registry_dir.iterdir()) == [f"{GPU}-reg.sock"]

        setup.cluster.apply(gpu_pod("gpu-n13", command="echo up; sleep 3600"))
        setup.wait_log("gpu-n13", "up")
        uid = setup.claim_of("gpu-n13")["metadata"]["uid"]
        spec = setup.agent.dirs.cdi_spec(uid)
        assert _claim_specs(setup, uid) == [spec]
        setup.cluster.kubectl("delete", "pod", "gpu-n13", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
        wait_gone(setup.cluster, spec)
        assert uid not in setup.agent.dirs.checkpoint_claims()
    finally:
        setup.agent.stop()
        again = _registrations(setup)
        setup.agent.start()
        _wait_registered(setup, more_than=again)
