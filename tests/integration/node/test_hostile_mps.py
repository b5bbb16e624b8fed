"""MPS claims tried as a hostile tenant would, on a real kubelet: each attack ends in a contained
effect, and another claim's container (the bystander, whose client talks to its own daemon and
writes its own /dev/shm every second) works on throughout, its daemon untouched.

- a container filling its /dev/shm gets ENOSPC at the claim's shm size, on a tmpfs: the node's
  disk never sees the bytes;
- a container whose work grows its MPS server past the daemon's memory limit gets that daemon
  OOM-killed in its own cgroup: the agent and the other daemons live, and the claim unprepares;
- a container looks for another claim's MPS folders: it has no path to them, and cannot write its
  own pipe folder;
- a container plants links in its MPS folders (the agent's checkpoint as their target) and its
  daemon is restarted (the agent's container restarted): nothing is written through them.

The agent runs with a 16Mi shm and a 48Mi daemon memory limit here, to keep the attacks short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from dra_node_agent.nvidia.cgroups import MemoryCgroups
from tests import mps_cgroup
from tests.integration.agent.agentproc import GPU
from tests.integration.node.conftest import NAMESPACE, NodeWithAgent, gpu_pod, wait_gone
from tests.integration.node.test_real_node import _registrations, _wait_registered
from tests.integration.node.test_real_node_configs import with_config

AGENT_ENV = {"DRA_AGENT_MPS_SHM_SIZE": "16Mi", "DRA_AGENT_MPS_DAEMON_MEMORY_LIMIT": "48Mi"}
MPS = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
BYSTANDER_LOOP = (
    "i=0; while true; do i=$((i + 1)); "
    "if mps-client >/dev/null 2>&1 && dd if=/dev/zero of=/dev/shm/bystander bs=1M count=1 2>/dev/null; "
    'then echo "ok $i"; else echo "failed $i"; fi; sleep 1; done'
)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


class Claim:
    """One pod's MPS claim as the node holds it: its UID and its folder under the agent's state."""

    def __init__(self, setup: NodeWithAgent, pod: str) -> None:
        self.uid: str = setup.claim_of(pod)["metadata"]["uid"]
        self.folder = setup.agent.dirs.checkpoint().parent / "mps" / self.uid

    def pid(self) -> int:
        return int(json.loads((self.folder / "daemon.json").read_text())["pid"])


class Bystander:
    """Another tenant's pod with an MPS claim of its own, working every second."""

    def __init__(self, setup: NodeWithAgent) -> None:
        self.setup = setup
        setup.cluster.apply(with_config(gpu_pod("bystander", command=BYSTANDER_LOOP), GPU, MPS))
        setup.wait_log("bystander", "ok 2")
        self.claim = Claim(setup, "bystander")
        self.daemon = self.claim.pid()

    def rounds(self) -> list[str]:
        return [line for line in self.setup.pod_log("bystander").splitlines() if line[:3] in ("ok ", "fai")]

    def keeps_working(self) -> None:
        """Its daemon is the one it had, and it has worked twice more since it was asked; it never
        failed."""
        assert alive(self.daemon), "the bystander's MPS daemon died"
        assert self.claim.pid() == self.daemon, "the bystander's MPS daemon was replaced"
        seen = len(self.rounds())
        self.setup.cluster.wait_for(
            lambda: len(self.rounds()) >= seen + 2, timeout=60, interval=0.5, what="two more bystander rounds"
        )
        failed = [line for line in self.rounds() if line.startswith("failed")]
        assert not failed, failed


@pytest.fixture(scope="module")
def bystander(node_with_agent: NodeWithAgent) -> Bystander:
    return Bystander(node_with_agent)  # deleted with the module's namespace


def run_pod(setup: NodeWithAgent, name: str, command: str, *, until: str) -> tuple[Claim, str]:
    setup.cluster.apply(with_config(gpu_pod(name, command=command), GPU, MPS))
    log = setup.wait_log(name, until)
    return Claim(setup, name), log


def delete_pod(setup: NodeWithAgent, name: str, claim: Claim) -> None:
    setup.cluster.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    wait_gone(setup.cluster, claim.folder)
    assert claim.uid not in setup.agent.dirs.checkpoint_claims()
    assert f" {claim.folder}/shm " not in Path("/proc/self/mountinfo").read_text()


def test_a_container_filling_its_shm_gets_enospc_at_the_limit_and_the_nodes_disk_never_sees_it(
    node_with_agent: NodeWithAgent, bystander: Bystander
) -> None:
    setup = node_with_agent
    command = (
        "dd if=/dev/zero of=/dev/shm/fill bs=1M count=64 2>&1; echo size $(stat -c %s /dev/shm/fill); "
        "echo filled; sleep 3600"
    )
    claim, log = run_pod(setup, "filler", command, until="filled")
    assert "No space left on device" in log, log
    size = int(next(line for line in log.splitlines() if line.startswith("size "))[5:])
    assert 0 < size <= 16 << 20, log
    # On the node, the bytes are in the claim's tmpfs (another file system than the agent's state).
    fill = claim.folder / "shm" / "fill"
    assert fill.stat().st_size == size
    assert fill.stat().st_dev != claim.folder.stat().st_dev
    assert f" {claim.folder}/shm " in Path("/proc/self/mountinfo").read_text()
    bystander.keeps_working()
    delete_pod(setup, "filler", claim)
    bystander.keeps_working()


def test_a_daemon_grown_past_its_memory_limit_is_killed_in_its_own_cgroup_and_nothing_else_is(
    node_with_agent: NodeWithAgent, bystander: Bystander
) -> None:
    setup = node_with_agent
    claim, log = run_pod(setup, "greedy", "mps-client host-memory 256; echo asked; sleep 3600", until="asked")
    daemon = claim.pid()
    # The client's work pushed its server past 48Mi: the daemon is killed, and the client told.
    setup.cluster.wait_for(lambda: not alive(daemon), timeout=60, what="the greedy daemon killed")
    assert "mps-client: no answer from the MPS control daemon" in log, log
    cgroups = MemoryCgroups(cgroup_root=mps_cgroup.CGROUP_ROOT, parent=mps_cgroup.PARENT, memory_limit=0)
    assert cgroups.oom_kills(claim.uid) >= 1
    assert cgroups.oom_kills(bystander.claim.uid) == 0
    assert setup.agent.process is not None
    assert setup.agent.process.poll() is None, "the agent died"
    bystander.keeps_working()
    # Its claim still unprepares, and the agent says what ended the daemon.
    delete_pod(setup, "greedy", claim)
    assert not cgroups.path(claim.uid).exists()
    assert f"MPS control daemon of claim {claim.uid} had ended before its stop" in setup.agent.log_text()
    assert "OOM-killed" in setup.agent.log_text()
    bystander.keeps_working()


def test_a_container_finds_no_way_to_another_claims_mps_folders(
    node_with_agent: NodeWithAgent, bystander: Bystander
) -> None:
    setup = node_with_agent
    other = bystander.claim.folder
    command = (
        f"ls {other}/pipe 2>&1; ls {other.parent} 2>&1; echo connect 0 0a > {other}/pipe/control 2>&1; "
        "touch /tmp/nvidia-mps/x 2>&1; ln -s /dev/shm /tmp/nvidia-mps/shm 2>&1; "
        "echo listing: $(ls /dev/shm); cat /tmp/nvidia-mps/settings; mps-client; echo probed; sleep 3600"
    )
    claim, log = run_pod(setup, "prober", command, until="probed")
    lines = log.splitlines()
    # The node's paths of the other claim, and of the claims' parent, do not exist in a container.
    assert f"ls: {other}/pipe: No such file or directory" in lines, log
    assert f"ls: {other.parent}: No such file or directory" in lines, log
    assert any(f"can't create {other}/pipe/control: nonexistent directory" in line for line in lines), log
    # Its own pipe folder takes no file and no link.
    assert "touch: /tmp/nvidia-mps/x: Read-only file system" in lines, log
    assert any("/tmp/nvidia-mps/shm" in line and "Read-only file system" in line for line in lines), log
    # Its /dev/shm is its own (nothing of the bystander's), and its client reaches its own daemon.
    listing = next(line for line in lines if line.startswith("listing:"))
    assert "bystander" not in listing, log
    own = json.loads((claim.folder / "daemon.json").read_text())["uuids"]
    assert f"devices {','.join(own)}" in lines, log
    assert own != json.loads((other / "daemon.json").read_text())["uuids"]
    assert "mps-client: served by the MPS server of user 0 (client user 0, multi-user no)" in log, log
    # On the node, a user other than root cannot list the claims' folders either.
    listed = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "ls", str(other.parent)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert listed.returncode != 0
    assert "Permission denied" in listed.stderr
    bystander.keeps_working()
    delete_pod(setup, "prober", claim)


def test_links_planted_in_the_mps_folders_before_a_daemon_restart_are_never_written_through(
    node_with_agent: NodeWithAgent, bystander: Bystander
) -> None:
    setup = node_with_agent
    victim = setup.agent.dirs.checkpoint()  # what a root daemon must never write: the agent's checkpoint
    command = (
        f"ln -s {victim} /tmp/nvidia-mps/nvidia-cuda-mps-control.pid 2>&1; "
        f"ln -s {victim} /dev/shm/accel-dra-mps-server-0 && echo planted in shm; echo planted; "
        "until [ -e /dev/shm/go ]; do sleep 0.3; done; mps-client; echo reconnected; sleep 3600"
    )
    claim, log = run_pod(setup, "planter", command, until="planted")
    assert "Read-only file system" in log, log
    assert "planted in shm" in log, log
    checkpoint = victim.read_bytes()
    # The agent's container restarts: its daemons die with it (here, the planter's is killed), and
    # the new agent starts them again from what it recorded.
    first = claim.pid()
    os.killpg(first, signal.SIGKILL)
    setup.cluster.wait_for(lambda: not alive(first), timeout=30, what="the planter's daemon gone")
    before = _registrations(setup)
    setup.agent.stop()
    setup.agent.start()
    _wait_registered(setup, more_than=before)
    setup.cluster.wait_for(
        lambda: claim.pid() != first and alive(claim.pid()), timeout=60, what="the planter's daemon restarted"
    )
    (claim.folder / "shm" / "go").touch()
    log = setup.wait_log("planter", "reconnected")
    assert "mps-client: served by the MPS server of user 0" in log, log
    # The server made its segment in place of the link, never through it: the container reads a file
    # of its own /dev/shm (through the link it would find nothing: its target is not in the container).
    uuids = ",".join(json.loads((claim.folder / "daemon.json").read_text())["uuids"])
    assert f"mps-client: /dev/shm is the server's: {uuids}" in log, log
    assert not (claim.folder / "pipe" / "nvidia-cuda-mps-control.pid").is_symlink()
    assert victim.read_bytes() == checkpoint
    assert claim.uid in setup.agent.dirs.checkpoint_claims()
    bystander.keeps_working()
    delete_pod(setup, "planter", claim)
