"""The node agent as a real subprocess, and the node it serves, for tests against the local cluster.

``AgentProcess`` runs ``python -m dra_node_agent.cli run`` with a simulated profile, the kubelet
folders in a short temporary directory (unix socket paths are limited to 107 bytes), and the
agent's own ServiceAccount credentials (the project's ClusterRole, so RBAC is exercised for real).
It can be stopped with SIGTERM or killed with SIGKILL, and started again on the same folders.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from dra_devcluster import LocalCluster, RealNode
from dra_devcluster.cluster import free_port
from tests import mps_cgroup

REPO = Path(__file__).resolve().parents[3]
GPU = "gpu.nvidia.com"
TPU = "tpu.google.com"
NIC = "nic.sim.accel-dra.dev"  # the simulated NIC driver of the nic-* profiles (a test stand-in)
AGENT_NAMESPACE = "accel-dra"
AGENT_SERVICE_ACCOUNT = "accel-dra-node-agent"


@dataclass
class AgentDirs:
    """One node's host folders: kubelet's, CDI, agent state, and a fake /proc for the boot ID. On a
    real node the kubelet's and containerd's folders are the node's (``for_node``)."""

    root: Path
    kubelet_registry: Path | None = None
    kubelet_plugins: Path | None = None
    cdi_dir: Path | None = None

    @classmethod
    def for_node(cls, node: RealNode) -> AgentDirs:
        return cls(
            root=node.root / "agent",
            kubelet_registry=node.registry_dir,
            kubelet_plugins=node.plugins_dir,
            cdi_dir=node.cdi_dir,
        )

    @property
    def registry(self) -> Path:
        return self.kubelet_registry or self.root / "reg"

    @property
    def plugins(self) -> Path:
        return self.kubelet_plugins or self.root / "plg"

    @property
    def cdi(self) -> Path:
        return self.cdi_dir or self.root / "cdi"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def boot_id(self) -> Path:
        return self.proc / "sys/kernel/random/boot_id"

    def checkpoint(self, driver: str = GPU) -> Path:
        return self.state / driver / "checkpoint.json"

    def checkpoint_claims(self, driver: str = GPU) -> dict[str, Any]:
        doc = json.loads(self.checkpoint(driver).read_text())
        claims: dict[str, Any] = doc["data"]["preparedClaims"]
        return claims

    def registration_socket(self, driver: str = GPU) -> Path:
        return self.registry / f"{driver}-reg.sock"

    def cdi_spec(self, claim_uid: str, driver: str = GPU) -> Path:
        return self.cdi / f"k8s.{driver}-claim_{claim_uid}.json"

    def create(self) -> None:
        for folder in (self.registry, self.plugins, self.cdi, self.state, self.boot_id.parent):
            folder.mkdir(parents=True, exist_ok=True)
        if not self.boot_id.exists():
            self.boot_id.write_text("boot-one\n")


def profile_driver(profile: str) -> str:
    """The driver a shipped profile publishes under (the agent's default names)."""
    if profile.startswith("tpu"):
        return TPU
    return NIC if profile.startswith("nic") else GPU


def agent_kubeconfig(cluster: LocalCluster, *, bound_node: str | None = None) -> Path:
    """A kubeconfig with the node agent ServiceAccount's token, bound to the project's ClusterRole.

    With ``bound_node`` the token is bound to that Node, as the agent pod's projected token is to
    its pod and node: the API server then knows the caller's node
    (``authentication.kubernetes.io/node-name``), which the ``associated-node`` verbs of claim
    device status need (DRAResourceClaimGranularStatusAuthorization).
    """
    cluster.kubectl("create", "namespace", AGENT_NAMESPACE, check=False)
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": AGENT_SERVICE_ACCOUNT, "namespace": AGENT_NAMESPACE},
            }
        ]
    )
    # The TPU install's role too: the tests' agents serve simulated TPUs, multi-host slices included.
    for path in ("base/node-agent-clusterrole.yaml", "base/node-agent-clusterrolebinding.yaml",
                 "overlays/tpu/node-agent-tpu-workloads.yaml"):  # fmt: skip
        cluster.apply((REPO / "manifests" / path).read_text())
    binding = ["--bound-object-kind=Node", f"--bound-object-name={bound_node}"] if bound_node else []
    token = cluster.kubectl(
        "create", "token", AGENT_SERVICE_ACCOUNT, "-n", AGENT_NAMESPACE, "--duration=2h", *binding
    ).stdout.strip()
    return cluster.kubeconfig_for_token(token, name="node-agent")


@dataclass
class AgentProcess:
    """One agent subprocess for ``node``; ``start`` may be called again after ``kill``/``stop``."""

    node: str
    dirs: AgentDirs
    kubeconfig: Path
    profiles: Sequence[str] = ("h100-80gb-x8",)
    extra_env: Mapping[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    metrics_port: int = field(default_factory=free_port)
    log_name: str = "agent.log"
    """Two agents on one node's folders (a rolling update) keep separate logs."""
    wait_kubelet: bool = False
    """With a real kubelet: ``start`` also waits until it registered every driver (``/readyz``),
    so a pod created next never meets an unregistered driver (the kubelet retries such a prepare
    only at its next pod sync, a minute later)."""

    @property
    def log_path(self) -> Path:
        return self.dirs.root / self.log_name

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "dra_node_agent.cli",
            "run",
            f"--node-name={self.node}",
            f"--kubeconfig={self.kubeconfig}",
            f"--simulate-profile={','.join(self.profiles)}",
            f"--kubelet-registry-dir={self.dirs.registry}",
            f"--kubelet-plugins-dir={self.dirs.plugins}",
            f"--cdi-dir={self.dirs.cdi}",
            f"--state-dir={self.dirs.state}",
            f"--proc-root={self.dirs.proc}",
            f"--metrics-address=127.0.0.1:{self.metrics_port}",
            "--slice-resync-delay=0.2",
            "--log-level=DEBUG",
        ]

    def start(
        self, *, env: Mapping[str, str] | None = None, wait: bool = True, file_size_limit: int | None = None
    ) -> None:
        """Start the agent; ``file_size_limit`` (bytes, RLIMIT_FSIZE) makes larger writes fail."""
        assert self.process is None or self.process.poll() is not None, "agent already running"
        self.dirs.create()
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_AGENT_")}
        full_env.pop("KUBECONFIG", None)
        full_env.pop("NODE_NAME", None)
        # MPS daemons go under the test session's own cgroup, removed when it ends.
        full_env["DRA_AGENT_MPS_CGROUP_PARENT"] = mps_cgroup.PARENT
        full_env.update(self.extra_env)
        full_env.update(env or {})
        self.starts += 1
        log = self.log_path.open("ab")
        log.write(f"\n===== start #{self.starts} =====\n".encode())
        log.flush()
        if file_size_limit is None:
            self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, env=full_env)
            log.close()
        else:
            # The limit applies to every file the agent writes, so its log goes through a pipe.
            argv = [sys.executable, "-c", _LIMITED.format(limit=file_size_limit), *self.argv()[3:]]
            self.process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env
            )
            assert self.process.stdout is not None
            threading.Thread(target=_drain, args=(self.process.stdout, log), daemon=True).start()
        if wait:
            self.wait_serving()

    def wait_serving(self, *, timeout: float = 60) -> None:
        """Wait until every driver's registration socket accepts connections (the agent's last step)."""
        drivers = [profile_driver(p) for p in self.profiles]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"agent exited with {self.process.returncode}:\n{self.log_tail()}")
            if all(_accepts(self.dirs.registration_socket(d)) for d in drivers) and (
                not self.wait_kubelet or self.registered()
            ):
                return
            time.sleep(0.1)
        raise TimeoutError(f"agent on {self.node} did not serve within {timeout} s:\n{self.log_tail()}")

    def registered(self) -> bool:
        """Whether ``/readyz`` passes: the kubelet registered every driver."""
        try:
            return self.http_get("/readyz") == (200, "ok\n")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no clean-up at all, as after an OOM kill or a node-level crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)
        return int(self.process.returncode)

    def http_get(self, path: str) -> tuple[int, str]:
        """GET on the agent's probe/metrics endpoint: (status, body)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=10) as reply:
                return int(reply.status), reply.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    def metric(self, name: str, **labels: str) -> float | None:
        """One sample from /metrics, None when the agent has not exported it."""
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        prefix = f"{name}{{{wanted}}} " if labels else f"{name} "
        _, text = self.http_get("/metrics")
        for line in text.splitlines():
            if line.startswith(prefix):
                return float(line[len(prefix) :])
        return None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


# Runs the agent's CLI under RLIMIT_FSIZE (Python ignores SIGXFSZ, so writes fail with EFBIG).
_LIMITED = (
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
    "sys.argv = ['dra-node-agent', *sys.argv[1:]]; "
    "runpy.run_module('dra_node_agent.cli', run_name='__main__')"
)


def _drain(source: IO[bytes], log: IO[bytes]) -> None:
    with source, log:
        for line in source:
            log.write(line)
            log.flush()


def _accepts(path: Path) -> bool:
    """Whether something listens on the unix socket (a killed agent leaves a dead socket file)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True
