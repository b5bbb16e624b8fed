"""Real nodes for the local cluster: a kubelet and its own containerd per node, on this machine.

Each node has its own directory (``<cluster workdir>/nodes/<name>``) holding containerd's root,
state and socket, the kubelet's root dir (plugin registry, plugin sockets, its DRA checkpoint), the
pod logs, a CNI configuration (a bridge of its own with a /24 of its own) and the directory the
node's CDI specs go to (the agent's ``--cdi-dir``). Settings without which a node does not start on
this machine class (cgroup v1, no CAP_SYS_RESOURCE) are explained where they are set.

The kubelet authenticates as ``system:node:<name>`` with a client certificate from the cluster CA,
so the Node authorizer and NodeRestriction apply to it as in a real cluster. Images come from
:mod:`dra_devcluster.images`, imported into every node's containerd: no registry is contacted.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dra_api.kubeletapi.socketpaths import (
    MAX_SOCKET_PATH_BYTES,
    POD_UID_BYTES,
    longest_socket_path,
    path_bytes,
)
from dra_api.names import GPU_DRIVER, TPU_DRIVER
from dra_devcluster.apirelay import ApiRelay
from dra_devcluster.binaries import NodeBinaries
from dra_devcluster.images import SANDBOX_IMAGE, ImageArchive
from dra_devcluster.pki import CertPair, issue_client_cert

log = logging.getLogger(__name__)

_MNT_DETACH = 2  # linux/fs.h; lazy, so a mount still in use goes as soon as it is not


def mounts_under(folder: Path) -> list[str]:
    """This process's mount points at or below ``folder`` (symbolic links in it resolved)."""
    root = str(folder.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # Field 5 is the mount point, with space, tab, newline and backslash octal-escaped.
        point = line.split()[4].encode().decode("unicode_escape")
        if point == root or point.startswith(root + "/"):
            found.append(point)
    return found


@dataclass(frozen=True)
class NodeLayout:
    """Where a node laid out at ``root`` keeps what the kubelet and containerd need a path for."""

    root: Path

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def registry_dir(self) -> Path:
        """Where the kubelet's plugin watcher looks for registration sockets."""
        return self.kubelet_root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        """Where DRA drivers put their service sockets (``<dir>/<driver>/dra.sock``)."""
        return self.kubelet_root / "plugins"

    def longest_socket(self, *, agent_pods: bool = True) -> Path:
        """The longest unix socket path the node holds: containerd's, the kubelet's own, and those of
        an agent serving both drivers; with ``agent_pods``, with per-pod names (a DaemonSet's agent
        adds its pod UID), else with the fixed names an agent run as a process uses."""
        return max(
            (
                self.containerd_socket.with_name(self.containerd_socket.name + ".ttrpc"),
                self.kubelet_root / "pod-resources" / "kubelet.sock",
                self.kubelet_root / "device-plugins" / "kubelet.sock",
                longest_socket_path(
                    drivers=(GPU_DRIVER, TPU_DRIVER),
                    registry_dir=self.registry_dir,
                    plugins_dir=self.plugins_dir,
                    instance="u" * POD_UID_BYTES if agent_pods else None,
                ),
            ),
            key=path_bytes,
        )

    def fits(self, *, agent_pods: bool = True) -> bool:
        """Whether every socket of the node fits a unix socket path."""
        return path_bytes(self.longest_socket(agent_pods=agent_pods)) <= MAX_SOCKET_PATH_BYTES


class NodeStartError(RuntimeError):
    """A real node did not start; the message names the part, why, and its log tail."""


@dataclass
class NodePorts:
    kubelet: int
    healthz: int


@dataclass
class RealNode:
    """One node: call :meth:`start` (after the control plane is up) and :meth:`stop`."""

    name: str
    index: int
    """Small number that keeps the node's bridge name and pod subnet apart from the others'."""
    root: Path
    binaries: NodeBinaries
    ca: CertPair
    server: str
    ports: NodePorts
    feature_gates: Mapping[str, bool]
    _processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, init=False)
    _api_relay: ApiRelay | None = field(default=None, init=False)

    # -- where things are ------------------------------------------------------------------------

    @property
    def layout(self) -> NodeLayout:
        return NodeLayout(self.root)

    @property
    def containerd_socket(self) -> Path:
        return self.layout.containerd_socket

    @property
    def kubelet_root(self) -> Path:
        return self.layout.kubelet_root

    @property
    def registry_dir(self) -> Path:
        return self.layout.registry_dir

    @property
    def plugins_dir(self) -> Path:
        return self.layout.plugins_dir

    @property
    def pod_logs_dir(self) -> Path:
        return self.root / "pod-logs"

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """What a container of a pod on this node printed so far, from the kubelet's CRI log files
        (each line ``<time> <stream> <P|F> <text>``)."""
        lines = []
        for path in sorted(self.pod_logs_dir.glob(f"{namespace}_{pod}_*/{container}/*.log")):
            for line in path.read_text(errors="replace").splitlines():
                parts = line.split(" ", 3)
                lines.append(parts[3] if len(parts) == 4 else line)
        return "\n".join(lines)

    @property
    def cdi_dir(self) -> Path:
        """The CDI spec directory containerd reads for this node."""
        return self.root / "cdi"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def pod_subnet(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def gateway(self) -> str:
        """The bridge's own address, the pods' default gateway (host-local's first address)."""
        return f"10.244.{self.index}.1"

    @property
    def pod_api_endpoint(self) -> tuple[str, int]:
        """Where this node's pods reach the API server (:mod:`dra_devcluster.apirelay`)."""
        return self.gateway, int(self.server.rsplit(":", 1)[1])

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, *, images: list[ImageArchive], timeout: float = 90.0) -> None:
        for directory in (self.root, self.logs_dir, self.pod_logs_dir, self.cdi_dir, self.kubelet_root):
            directory.mkdir(parents=True, exist_ok=True)
        self._start_containerd(timeout=timeout)
        self._import_images(images)
        self._api_relay = ApiRelay(
            listen=self.pod_api_endpoint, upstream=("127.0.0.1", self.pod_api_endpoint[1])
        )
        self._api_relay.start()
        self._start_kubelet()

    def tasks(self) -> list[str]:
        """IDs of the containers (sandboxes included) running on this node, from containerd."""
        if not self.running("containerd"):
            return []
        result = self._ctr("tasks", "ls", "-q", check=False)
        return result.stdout.split() if result.returncode == 0 else []

    def tag_image(self, source: str, target: str) -> None:
        """Give an imported image a second reference (a new version of the same content)."""
        self._ctr("images", "tag", "--force", source, target)

    def kill_container(self, container_id: str) -> None:
        """SIGKILL one container's process through containerd, as a crash would end it."""
        self._ctr("tasks", "kill", "--signal=SIGKILL", container_id)

    def stop(self) -> None:
        """Stop the kubelet, kill what still runs (best after the pods were deleted, so that the
        kubelet tore their sandboxes and networks down), stop containerd, remove the bridge."""
        self._stop_process("kubelet")
        for task in self.tasks():
            self._ctr("tasks", "kill", "--signal=SIGKILL", task, check=False)
        for task in self.tasks():
            self._ctr("tasks", "delete", "--force", task, check=False)
        self._stop_process("containerd")
        self._kill_leftovers()
        self._unmount_all()
        # Images and container layers (about 1 GB a node); logs and configuration stay for reading.
        shutil.rmtree(self.root / "containerd", ignore_errors=True)
        if self._api_relay is not None:
            self._api_relay.stop()
            self._api_relay = None
        if shutil.which("ip"):
            subprocess.run(["ip", "link", "delete", f"dra-br{self.index}"], capture_output=True, check=False)

    def _stop_process(self, part: str) -> None:
        proc = self._processes.pop(part, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)

    def restart_kubelet(self) -> None:
        """Stop the kubelet (SIGTERM, as a service manager does) and start it again on the same
        root dir; containers keep running under containerd meanwhile."""
        self._stop_process("kubelet")
        self._start_kubelet()

    def running(self, part: str) -> bool:
        proc = self._processes.get(part)
        return proc is not None and proc.poll() is None

    def log_tail(self, part: str, lines: int = 30) -> str:
        try:
            text = (self.logs_dir / f"{part}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def start_error(self, part: str, why: str) -> NodeStartError:
        return NodeStartError(
            f"node {self.name}: {part} did not start: {why}\n"
            f"--- last lines of {self.logs_dir / (part + '.log')}:\n{self.log_tail(part)}"
        )

    def _spawn(self, part: str, argv: list[str]) -> None:
        with (self.logs_dir / f"{part}.log").open("ab") as out:
            self._processes[part] = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )

    # -- containerd ------------------------------------------------------------------------------

    def containerd_config(self) -> str:
        base = self.root / "containerd"
        runtime = "io.containerd.cri.v1.runtime"
        images = "io.containerd.cri.v1.images"
        lines = [
            "version = 3",
            f'root = "{base / "root"}"',
            f'state = "{base / "state"}"',
            # NRI listens on one machine-wide socket by default: two containerds would fight over it.
            'disabled_plugins = ["io.containerd.nri.v1.nri"]',
            "[grpc]",
            f'  address = "{self.containerd_socket}"',
            "[ttrpc]",
            f'  address = "{self.containerd_socket}.ttrpc"',  # as NodeLayout.longest_socket says
            f'[plugins."{images}"]',
            # No overlay assumptions about the machine's filesystems.
            '  snapshotter = "native"',
            f'[plugins."{images}".pinned_images]',
            f'  sandbox = "{SANDBOX_IMAGE}"',
            f'[plugins."{runtime}"]',
            "  enable_cdi = true",
            f'  cdi_spec_dirs = ["{self.cdi_dir}"]',
            # Without CAP_SYS_RESOURCE the sandbox's negative oom_score_adj fails every pod start
            # ("can't get final child's PID from pipe: EOF").
            "  restrict_oom_score_adj = true",
            f'[plugins."{runtime}".containerd]',
            '  default_runtime_name = "runc"',
            f'[plugins."{runtime}".containerd.runtimes.runc]',
            '  runtime_type = "io.containerd.runc.v2"',
            f'[plugins."{runtime}".containerd.runtimes.runc.options]',
            f'  BinaryName = "{self.binaries.runc}"',
            "  SystemdCgroup = false",
            f'[plugins."{runtime}".cni]',
            f'  bin_dirs = ["{self.binaries.cni_dir}"]',
            f'  conf_dir = "{self.root / "cni"}"',
            "  max_conf_num = 1",
        ]
        return "\n".join(lines) + "\n"

    def cni_config(self) -> dict[str, object]:
        # A bridge of the node's own: a loopback-only network makes every sandbox fail with
        # "failed to find network info for sandbox". The default route through the host lets a
        # pod reach the host's addresses, other nodes' API relays and pods among them, as pods of
        # a cluster reach each other's nodes (a ComputeDomain's IMEX daemons, one per node, talk
        # to the API server by one name). No masquerading: pods reach nothing outside the host.
        return {
            "cniVersion": "1.0.0",
            "name": f"accel-dra-{self.name}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": f"dra-br{self.index}",
                    "isGateway": True,
                    "isDefaultGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_subnet}]],
                        "dataDir": str(self.root / "cni-ipam"),
                    },
                }
            ],
        }

    def _start_containerd(self, *, timeout: float) -> None:
        config = self.root / "containerd.toml"
        config.write_text(self.containerd_config())
        (self.root / "cni").mkdir(exist_ok=True)
        (self.root / "cni" / "10-accel-dra.conflist").write_text(json.dumps(self.cni_config(), indent=1))
        self.containerd_socket.parent.mkdir(parents=True, exist_ok=True)
        env_path = f"{self.binaries.containerd.parent}:{os.environ.get('PATH', '')}"
        argv = [str(self.binaries.containerd), f"--config={config}", "--log-level=info"]
        with (self.logs_dir / "containerd.log").open("ab") as out:
            # The shim binary is found on PATH, next to containerd.
            self._processes["containerd"] = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PATH": env_path},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running("containerd"):
                raise self.start_error("containerd", "it exited")
            if self.containerd_socket.exists() and self._ctr("version", check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise self.start_error("containerd", f"its socket did not answer within {timeout:.0f} s")

    def _ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binaries.ctr), f"--address={self.containerd_socket}", "--namespace=k8s.io", *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if check and result.returncode != 0:
            raise self.start_error("containerd", f"`ctr {' '.join(args)}` failed: {result.stderr.strip()}")
        return result

    def import_images(self, images: list[ImageArchive]) -> None:
        """Import more OCI archives into this running node's containerd (the product image)."""
        self._import_images(images)

    def _import_images(self, images: list[ImageArchive]) -> None:
        for image in images:
            self._ctr(
                "images",
                "import",
                "--local",
                "--snapshotter=native",
                "--platform=linux/amd64",
                str(image.path),
            )

    # -- kubelet ---------------------------------------------------------------------------------

    def kubelet_config(self) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": self.ports.kubelet,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.ports.healthz,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.ca.cert)},
            },
            # Only holders of a certificate from the cluster CA get this far.
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "podLogsDir": str(self.pod_logs_dir),
            # This machine class mounts cgroup v1 hierarchies; 1.35+ refuses them unless told.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "registerNode": True,
            "serializeImagePulls": False,
            # Several kubelets share one disk: no one of them should evict for it.
            "evictionHard": {"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%"},
            "imageGCHighThresholdPercent": 100,
            # A pod whose NodePrepareResources failed is tried again only at the kubelet's next
            # periodic sync of it (1 min by default): 10 s lets a test of a restarted agent see the
            # retry without waiting a minute for it.
            "syncFrequency": "10s",
            "featureGates": dict(self.feature_gates),
        }

    def _start_kubelet(self) -> None:
        client = issue_client_cert(
            ca=self.ca,
            directory=self.root / "pki",
            stem="kubelet-client",
            common_name=f"system:node:{self.name}",
            organization="system:nodes",
        )
        kubeconfig = self.root / "kubelet.kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "local",
                            "cluster": {"server": self.server, "certificate-authority": str(self.ca.cert)},
                        }
                    ],
                    "users": [
                        {
                            "name": self.name,
                            "user": {"client-certificate": str(client.cert), "client-key": str(client.key)},
                        }
                    ],
                    "contexts": [{"name": "local", "context": {"cluster": "local", "user": self.name}}],
                    "current-context": "local",
                }
            )
        )
        config = self.root / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self.kubelet_config()))
        self._spawn(
            "kubelet",
            [
                str(self.binaries.kubelet),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.kubelet_root}",
                f"--cert-dir={self.root / 'kubelet-pki'}",
                f"--hostname-override={self.name}",
                "--v=2",
            ],
        )

    def wait_healthy(self, *, timeout: float = 90.0) -> None:
        """Until the kubelet's healthz answers (the Node's Ready condition is the caller's to wait for)."""
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.ports.healthz}/healthz"
        while time.monotonic() < deadline:
            if not self.running("kubelet"):
                raise self.start_error("kubelet", "it exited")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise self.start_error("kubelet", f"its healthz did not answer within {timeout:.0f} s")

    # -- cleanup ---------------------------------------------------------------------------------

    def mounts(self) -> list[str]:
        """Mount points under the node's folder: the kubelet bind-mounts its root dir onto itself
        (to make it shared), and pod volumes the kubelet did not tear down stay mounted."""
        return mounts_under(self.root)

    def _unmount_all(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        for _ in range(8):  # stacked mounts on one point come off one at a time
            points = self.mounts()
            if not points:
                return
            for point in sorted(points, key=len, reverse=True):
                if libc.umount2(point.encode(), _MNT_DETACH) != 0:
                    log.warning(
                        "node %s: cannot unmount %s: %s", self.name, point, os.strerror(ctypes.get_errno())
                    )
        log.warning("node %s: still mounted under %s: %s", self.name, self.root, self.mounts())

    def _kill_leftovers(self) -> None:
        """Shims and containers outlive containerd by design; a stopped test node must not."""
        marker = str(self.root)
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "containerd-shim" in cmdline and marker in cmdline:
                with contextlib.suppress(OSError):
                    os.killpg(int(pid_dir.name), signal.SIGKILL)
