"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, controller-manager, scheduler.

Used by the tests and by the demo. Nodes are plain Node objects marked Ready (no kubelet), so the
real scheduler binds pods to them; the kubelet's side of the plugin protocol is played elsewhere
(``dra_devcluster.kubelet``).

The API is synchronous on purpose: it manages child processes and is called from pytest fixtures
and CLIs, never from inside an event loop.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from dra_api.kubeletapi.socketpaths import MAX_SOCKET_PATH_BYTES, path_bytes
from dra_devcluster.binaries import Binaries, ensure_binaries, ensure_node_binaries
from dra_devcluster.images import ImageArchive, build_images
from dra_devcluster.node import NodeLayout, NodePorts, RealNode
from dra_devcluster.nodeproxy import NodeProxy, egress_selector_config
from dra_devcluster.pki import CertPair, ClusterPKI, generate_pki
from dra_devcluster.versions import KubernetesVersion, resolve

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

# Feature gates and the controller-manager's disabled controllers differ by Kubernetes version:
# dra_devcluster.versions holds them (KubernetesVersion.feature_gates, .disabled_controllers).

_DEFAULT_NODE_CAPACITY: Mapping[str, str] = {"cpu": "64", "memory": "512Gi", "pods": "110"}


def node_object(
    name: str,
    *,
    kubelet_version: str,
    labels: Mapping[str, str] | None = None,
    capacity: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """A Node without a kubelet, its status marked Ready so that kube-scheduler binds pods to it
    (the node-lifecycle controller, which would mark it NotReady for want of heartbeats, does not
    run in the local cluster). The API server keeps the status of a Node created with one, as of
    a kubelet registering; :meth:`LocalCluster.add_node` writes it separately."""
    all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **dict(labels or {})}
    cap = dict(capacity or _DEFAULT_NODE_CAPACITY)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": {"taints": [dict(t) for t in taints]},
        "status": {
            "capacity": cap,
            "allocatable": cap,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "local cluster node (no kubelet)",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "kubeletVersion": kubelet_version,
                "operatingSystem": "linux",
                "architecture": "amd64",
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
                "kernelVersion": "",
                "osImage": "",
                "containerRuntimeVersion": "",
                "kubeProxyVersion": "",
            },
        },
    }


class ControlPlaneError(RuntimeError):
    """A component failed to start or become ready; the message carries its log tail."""


class PortTaken(ControlPlaneError):
    """A component could not bind a port picked for it: something else took it in between."""


START_ATTEMPTS = 3
"""Start-ups tried when a picked port is taken before its component binds it (outgoing connections
draw their source ports from the same range)."""


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LISTEN_PORTS = 12000
"""How many ports below the kernel's ephemeral range :func:`free_port` draws from."""


def _listen_range() -> range | None:
    """Ports below the ephemeral range: outgoing connections never take their source port there, so a
    port picked from it stays free until the component binds it (a port picked by binding to 0 is
    from the ephemeral range, where any client's connection may take it in between; seen in CI)."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    start = max(1024, low - _LISTEN_PORTS)
    return range(start, low) if low - start >= 1000 else None


def _node_root(root: Path, *, agent_pods: bool = True) -> Path:
    """``root`` if every unix socket of a node there fits the 107 bytes a socket path may have,
    else a short temporary folder (``/tmp/dn*``, 15 bytes) linked from ``root``."""
    if NodeLayout(root).fits(agent_pods=agent_pods):
        return root
    short = Path(tempfile.mkdtemp(prefix="dn", dir="/tmp"))
    if not NodeLayout(short).fits():  # only if the layout grew: say so rather than fail in the kubelet
        short.rmdir()
        longest = NodeLayout(short).longest_socket()
        raise ValueError(
            f"a node's socket {longest} would be {path_bytes(longest)} bytes, more than the "
            f"{MAX_SOCKET_PATH_BYTES} a unix socket path may have"
        )
    root.symlink_to(short)
    return short


def free_port() -> int:
    """A loopback TCP port nobody listens on now, outside the ephemeral range where possible."""
    candidates = _listen_range()
    if candidates is not None:
        for port in random.sample(candidates, 64):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        picked: int = sock.getsockname()[1]
        return picked


def _kubeconfig(*, server: str, ca: Path, user: str, cert: CertPair | None, token: str | None) -> str:
    user_entry: dict[str, str] = {}
    if cert is not None:
        user_entry = {"client-certificate": str(cert.cert), "client-key": str(cert.key)}
    if token is not None:
        user_entry = {"token": token}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": user_entry}],
        "contexts": [{"name": user, "context": {"cluster": "local", "user": user}}],
        "current-context": user,
    }
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class _Component:
    name: str
    argv: list[str]
    log_path: Path
    health_url: str
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    ready_after: float = 0.0


def _check_kubelet_skew(*, kubelet: KubernetesVersion, control_plane: KubernetesVersion) -> None:
    older = int(control_plane.git_minor) - int(kubelet.git_minor)
    if kubelet.git_major != control_plane.git_major or not 0 <= older <= 3:
        raise ValueError(
            f"a kubelet {kubelet.version} cannot join a control plane of {control_plane.version}: "
            "Kubernetes allows kubelets of the same minor or up to three minors older"
        )


@dataclass
class LocalCluster:
    """One control plane. Use as a context manager, or call :meth:`start` and :meth:`stop`."""

    workdir: Path
    binaries: Binaries | None = None
    kubernetes: KubernetesVersion = field(default_factory=resolve)
    """The Kubernetes version it runs (control plane and kubelets); by default the one
    ``DRA_KUBERNETES_VERSION`` names, else the default (:mod:`dra_devcluster.versions`). Given
    ``binaries`` are taken to be of this version."""
    feature_gates: Mapping[str, bool] | None = None
    """``--feature-gates`` of every component and the kubelets; None: the version's own
    (:attr:`KubernetesVersion.feature_gates`)."""
    component_args: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Extra flags per component ("kube-apiserver", "kube-controller-manager", "kube-scheduler"),
    after the cluster's own: a benchmark raising the controller-manager's API rate limits, say."""
    _components: list[_Component] = field(default_factory=list, init=False)
    _pki: ClusterPKI | None = field(default=None, init=False)
    _real_nodes: list[RealNode] = field(default_factory=list, init=False)
    _nodes_started: int = field(default=0, init=False)
    _node_proxy: NodeProxy | None = field(default=None, init=False)
    _images: list[ImageArchive] = field(default_factory=list, init=False)
    _apiserver_port: int = field(default=0, init=False)
    timings: dict[str, float] = field(default_factory=dict, init=False)

    @property
    def gates(self) -> Mapping[str, bool]:
        """The feature gates the components are given (see :attr:`feature_gates`)."""
        return self.feature_gates if self.feature_gates is not None else self.kubernetes.feature_gates

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self._apiserver_port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (client certificate in group system:masters)."""
        return self.workdir / "admin.kubeconfig"

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    def start(self, *, timeout: float = 180.0) -> None:
        began = time.monotonic()
        if self.binaries is None:
            self.binaries = ensure_binaries(kubernetes=self.kubernetes)
        self.timings["binaries_s"] = time.monotonic() - began
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        started = time.monotonic()
        self._pki = generate_pki(self.workdir / "pki")
        for attempt in range(1, START_ATTEMPTS + 1):
            atexit.register(self.stop)  # stop() unregisters it
            try:
                self._start_components(timeout=timeout)
                break
            except BaseException as exc:
                self.stop()
                if not isinstance(exc, PortTaken) or attempt == START_ATTEMPTS:
                    raise
                log.warning("%s; starting again with other ports", str(exc).splitlines()[0])
                # etcd may have written its first data with the old peer URL; the logs of this
                # attempt are kept apart, so that the next one is judged by its own.
                shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
                kept = self.logs_dir / f"attempt-{attempt}"
                kept.mkdir(exist_ok=True)
                for path in self.log_files():
                    path.rename(kept / path.name)
        self.timings["start_s"] = time.monotonic() - started
        log.info(
            "control plane ready at %s in %.1f s (logs in %s)",
            self.server,
            self.timings["start_s"],
            self.logs_dir,
        )

    def stop(self) -> None:
        """Stop every component this cluster started, one at a time in reverse order.

        One at a time because the apiserver shuts down slowly when etcd vanishes under it;
        SIGKILL after a grace period.
        """
        for node in reversed(self._real_nodes):
            self._drain(node)
            node.stop()
            self._release_root(node)
        self._real_nodes.clear()
        for component in reversed(self._components):
            proc = component.process
            if proc is None or proc.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM for 10 s; killing it", component.name)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self._components.clear()
        if self._node_proxy is not None:
            self._node_proxy.stop()
            self._node_proxy = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def spawn(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Path:
        """Start another process (an operator, an agent) that :meth:`stop` ends before the control
        plane; its output goes to ``logs/<name>.log``, whose path is returned."""
        component = _Component(
            name=name, argv=list(argv), log_path=self.logs_dir / f"{name}.log", health_url=""
        )
        self._launch(component, env=env)
        return component.log_path

    def pids(self) -> list[int]:
        return [c.process.pid for c in self._components if c.process is not None]

    # -- components ----------------------------------------------------------------------------

    def _gates_flag(self) -> str:
        return "--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in self.gates.items())

    def _controllers_flag(self) -> str:
        return "--controllers=*," + ",".join(f"-{c}" for c in self.kubernetes.disabled_controllers)

    def _start_components(self, *, timeout: float) -> None:
        assert self.binaries is not None
        assert self._pki is not None
        pki = self._pki
        etcd_client, etcd_peer = free_port(), free_port()
        self._apiserver_port = free_port()
        cm_port, sched_port = free_port(), free_port()

        self.kubeconfig.write_text(
            _kubeconfig(server=self.server, ca=pki.ca.cert, user="admin", cert=pki.admin, token=None)
        )
        cm_kubeconfig = self.workdir / "controller-manager.kubeconfig"
        cm_kubeconfig.write_text(
            _kubeconfig(
                server=self.server, ca=pki.ca.cert, user="cm", cert=pki.controller_manager, token=None
            )
        )
        sched_kubeconfig = self.workdir / "scheduler.kubeconfig"
        sched_kubeconfig.write_text(
            _kubeconfig(server=self.server, ca=pki.ca.cert, user="scheduler", cert=pki.scheduler, token=None)
        )

        self._node_proxy = NodeProxy(self.workdir / "node-proxy.sock")
        self._node_proxy.start()
        for node in self._real_nodes:
            self._node_proxy.add_route(node=node.name, port=node.ports.kubelet)
        egress_config = self.workdir / "egress-selector.yaml"
        egress_config.write_text(egress_selector_config(self._node_proxy.path))

        etcd = _Component(
            name="etcd",
            argv=[
                str(self.binaries.etcd),
                "--name=local",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=local=http://127.0.0.1:{etcd_peer}",
                "--listen-metrics-urls=",
                # Throwaway data: skipping fsync keeps tests fast and does not change API semantics.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            log_path=self.logs_dir / "etcd.log",
            health_url=f"http://127.0.0.1:{etcd_client}/health",
        )
        apiserver = _Component(
            name="kube-apiserver",
            argv=[
                str(self.binaries.kube_apiserver),
                f"--etcd-servers=http://127.0.0.1:{etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self._apiserver_port}",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca.cert}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.sa_public_key}",
                f"--service-account-signing-key-file={pki.sa_private_key}",
                f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                # It taints new Nodes not-ready until the node-lifecycle controller sees a kubelet
                # heartbeat; here there is neither, so Nodes would stay unschedulable.
                "--disable-admission-plugins=TaintNodesByCondition",
                "--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                "--profiling=false",
                # The "kubernetes" Service cannot point at a loopback address; nothing in-cluster uses it.
                "--endpoint-reconciler-type=none",
                # Real nodes: kubelets are reached by node name through the node proxy (nodeproxy.py).
                f"--egress-selector-config-file={egress_config}",
                "--kubelet-preferred-address-types=Hostname",
                f"--kubelet-client-certificate={pki.apiserver_kubelet_client.cert}",
                f"--kubelet-client-key={pki.apiserver_kubelet_client.key}",
                self._gates_flag(),
            ],
            log_path=self.logs_dir / "kube-apiserver.log",
            health_url=f"{self.server}/readyz",
        )
        controller_manager = _Component(
            name="kube-controller-manager",
            argv=[
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={cm_kubeconfig}",
                f"--authentication-kubeconfig={cm_kubeconfig}",
                f"--authorization-kubeconfig={cm_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={cm_port}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.sa_private_key}",
                f"--root-ca-file={pki.ca.cert}",
                self._controllers_flag(),
                self._gates_flag(),
            ],
            log_path=self.logs_dir / "kube-controller-manager.log",
            health_url=f"https://127.0.0.1:{cm_port}/healthz",
        )
        scheduler = _Component(
            name="kube-scheduler",
            argv=[
                str(self.binaries.kube_scheduler),
                f"--kubeconfig={sched_kubeconfig}",
                f"--authentication-kubeconfig={sched_kubeconfig}",
                f"--authorization-kubeconfig={sched_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={sched_port}",
                "--leader-elect=false",
                self._gates_flag(),
            ],
            log_path=self.logs_dir / "kube-scheduler.log",
            health_url=f"https://127.0.0.1:{sched_port}/healthz",
        )
        for component in (apiserver, controller_manager, scheduler):
            component.argv += list(self.component_args.get(component.name, ()))
        deadline = time.monotonic() + timeout
        self._launch(etcd)
        self._wait_ready(etcd, deadline=deadline)
        self._launch(apiserver)
        self._wait_ready(apiserver, deadline=deadline)
        # The two controllers start in parallel; both need only the apiserver.
        self._launch(controller_manager)
        self._launch(scheduler)
        self._wait_ready(controller_manager, deadline=deadline)
        self._wait_ready(scheduler, deadline=deadline)
        self._wait_for_default_service_account("default", deadline=deadline)

    def _launch(self, component: _Component, *, env: Mapping[str, str] | None = None) -> None:
        handle = component.log_path.open("ab")
        component.process = subprocess.Popen(
            component.argv,
            env=None if env is None else {**os.environ, **env},
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
            # Own process group, so stop() can signal the component and anything it spawned.
            start_new_session=True,
        )
        handle.close()
        component.started_at = time.monotonic()
        self._components.append(component)

    def _ssl_context(self, *, verify: bool) -> ssl.SSLContext:
        assert self._pki is not None
        if verify:
            ctx = ssl.create_default_context(cafile=str(self._pki.ca.cert))
            ctx.load_cert_chain(str(self._pki.admin.cert), str(self._pki.admin.key))
            return ctx
        # Controller-manager and scheduler serve /healthz with self-signed certs of their own.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def _wait_ready(self, component: _Component, *, deadline: float) -> None:
        ctx = None
        if component.health_url.startswith("https://"):
            ctx = self._ssl_context(verify=component.name == "kube-apiserver")
        last_error = ""
        while time.monotonic() < deadline:
            assert component.process is not None
            if component.process.poll() is not None:
                tail = self.log_tail(component.name)
                error = PortTaken if "address already in use" in tail else ControlPlaneError
                raise error(
                    f"{component.name} exited with code {component.process.returncode} during start-up; "
                    f"last log lines:\n{tail}"
                )
            try:
                with urllib.request.urlopen(component.health_url, context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        component.ready_after = time.monotonic() - component.started_at
                        self.timings[f"{component.name}_ready_s"] = component.ready_after
                        return
            except (urllib.error.URLError, OSError) as err:
                last_error = str(err)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"{component.name} did not become ready ({component.health_url}): {last_error}; "
            f"last log lines:\n{self.log_tail(component.name)}"
        )

    def _wait_for_default_service_account(self, namespace: str, *, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise ControlPlaneError(
            f"the ServiceAccount controller never created {namespace}/default; controller-manager log:\n"
            f"{self.log_tail('kube-controller-manager')}"
        )

    # -- using the cluster ---------------------------------------------------------------------

    def log_tail(self, name: str, *, lines: int = 40) -> str:
        path = self.logs_dir / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def log_files(self) -> list[Path]:
        return sorted(self.logs_dir.glob("*.log"))

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the cluster's kubectl; raises with stderr when ``check`` and it fails."""
        assert self.binaries is not None
        argv = [str(self.binaries.kubectl), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def apply(self, manifest: str | Sequence[Mapping[str, Any]], *, server_side: bool = False) -> None:
        """``kubectl apply`` YAML text or a list of objects."""
        text = manifest if isinstance(manifest, str) else yaml.safe_dump_all(list(manifest))
        args = ["apply", "-f", "-"] + (["--server-side"] if server_side else [])
        self.kubectl(*args, input=text)

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def create_namespace(
        self, name: str, *, labels: Mapping[str, str] | None = None, timeout: float = 30
    ) -> None:
        """Create a namespace and wait for its default ServiceAccount (pods need it)."""
        self.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": name, "labels": dict(labels or {})},
                }
            ]
        )
        self._wait_for_default_service_account(name, deadline=time.monotonic() + timeout)

    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
    ) -> None:
        """Create a Node object marked Ready, so kube-scheduler binds pods to it."""
        node = node_object(
            name, kubelet_version=self.kubernetes.version, labels=labels, capacity=capacity, taints=taints
        )
        status = node.pop("status")
        self.apply([node])
        patch = json.dumps({"status": status})
        self.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", patch)

    def add_real_node(
        self,
        name: str,
        *,
        timeout: float = 90.0,
        agent_pods: bool = True,
        kubelet: KubernetesVersion | None = None,
        kubelet_gates: Mapping[str, bool] | None = None,
    ) -> RealNode:
        """Start a real node: its own containerd and a kubelet that registers Node ``name``, with
        the local images imported; returns once the Node is Ready. Raises NodeStartError naming the
        part that failed (binaries or packages missing: NodeUnavailable) with its log tail; the
        Node objects of :meth:`add_node` remain for machines that cannot run a kubelet.

        The node's folder is ``nodes/<name>`` in the workdir while all its unix sockets fit there,
        else a short one linked from there; ``agent_pods`` says whether agent pods (whose sockets
        carry their pod UID) will run on it, or only agents run as processes (the demo).

        ``kubelet`` runs a kubelet of another release than the control plane's, within the skew
        Kubernetes allows (the same minor or up to three older), with that release's gates;
        ``kubelet_gates`` are set on top of the kubelet's gates (an alpha gate a test needs)."""
        assert self._pki is not None, "start the control plane first"
        release = kubelet or self.kubernetes
        _check_kubelet_skew(kubelet=release, control_plane=self.kubernetes)
        gates = dict(self.gates if kubelet is None else release.feature_gates)
        gates.update(kubelet_gates or {})
        binaries = ensure_node_binaries(kubernetes=release)
        if not self._images:
            self._images = build_images(self.workdir / "images")
        if any(n.name == name for n in self._real_nodes):
            raise ValueError(f"a real node named {name} is already running")
        (self.workdir / "nodes").mkdir(exist_ok=True)
        root = self.workdir / "nodes" / name
        if root.is_symlink() or root.exists():
            # A node of this name ran before and was removed: the new one starts afresh.
            root.rename(root.with_name(f"{name}.removed-{self._nodes_started}"))
        root = _node_root(root, agent_pods=agent_pods)
        # Never reused, so a node added after a removal gets a subnet and bridge of its own.
        self._nodes_started += 1
        node = RealNode(
            name=name,
            index=self._nodes_started,
            root=root,
            binaries=binaries,
            ca=self._pki.ca,
            server=self.server,
            ports=NodePorts(kubelet=free_port(), healthz=free_port()),
            feature_gates=gates,
        )
        self._real_nodes.append(node)
        if self._node_proxy is not None:
            self._node_proxy.add_route(node=name, port=node.ports.kubelet)
        node.start(images=self._images, timeout=timeout)
        node.wait_healthy(timeout=timeout)

        def ready() -> bool:
            if not node.running("kubelet"):
                raise node.start_error("kubelet", "it exited")
            result = self.kubectl(
                "get",
                "node",
                name,
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                check=False,
            )
            return result.stdout.strip() == "True"

        try:
            self.wait_for(ready, timeout=timeout, interval=0.3, what=f"node {name} Ready")
        except TimeoutError as exc:
            raise node.start_error("kubelet", str(exc)) from None
        log.info("real node %s ready (kubelet %s, containerd in %s)", name, node.ports.kubelet, root)
        return node

    @property
    def real_nodes(self) -> list[RealNode]:
        return list(self._real_nodes)

    def _drain(self, node: RealNode, *, timeout: float = 30.0) -> None:
        """Delete the node's pods and let its kubelet stop them: it tears down their sandboxes and
        networks, which killing the processes would leave behind."""
        if not node.running("kubelet") or not self._components:
            return
        self.kubectl(
            "delete", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={node.name}",
            "--grace-period=0", "--force", "--wait=false", check=False,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while node.tasks() and time.monotonic() < deadline:
            time.sleep(0.5)

    def remove_real_node(self, name: str) -> None:
        """Stop a real node (kubelet, containerd, its containers) and delete its Node object."""
        for node in [n for n in self._real_nodes if n.name == name]:
            self._drain(node)
            node.stop()
            self._release_root(node)
            self._real_nodes.remove(node)
        if self._node_proxy is not None:
            self._node_proxy.remove_routes(name)
        self.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)

    def _release_root(self, node: RealNode) -> None:
        """A stopped node's folder outside the workdir (a short temporary one, see
        :meth:`add_real_node`) is removed, its logs copied into the workdir first, so that
        removing the workdir leaves nothing behind."""
        link = self.workdir / "nodes" / node.name
        if not link.is_symlink() or link.resolve() != node.root.resolve():
            return
        link.unlink()
        link.mkdir()
        for part in (node.logs_dir, node.pod_logs_dir):
            with contextlib.suppress(OSError):
                shutil.copytree(part, link / part.name, symlinks=True)
        if node.mounts():
            log.warning("node %s: %s stays, something is still mounted in it", node.name, node.root)
            return
        shutil.rmtree(node.root, ignore_errors=True)

    def delete_node(self, name: str) -> None:
        self.kubectl("delete", "node", name, "--wait=true")

    def kubeconfig_for_token(self, token: str, *, name: str) -> Path:
        """Write a kubeconfig that authenticates with a bearer token (e.g. from TokenRequest)."""
        assert self._pki is not None
        path = self.workdir / f"{name}.kubeconfig"
        path.write_text(
            _kubeconfig(server=self.server, ca=self._pki.ca.cert, user=name, cert=None, token=token)
        )
        path.chmod(0o600)
        return path

    def wait_for(
        self, predicate: Any, *, timeout: float = 60, interval: float = 0.3, what: str = "condition"
    ) -> Any:
        """Poll ``predicate()`` until it returns a truthy value; raise TimeoutError naming ``what``."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


@contextlib.contextmanager
def temporary_cluster(*, keep: bool = False, **kwargs: Any) -> Any:
    """A cluster in a fresh temporary directory, removed afterwards unless ``keep``."""
    workdir = Path(tempfile.mkdtemp(prefix="accel-dra-cluster-"))
    cluster = LocalCluster(workdir=workdir, **kwargs)
    try:
        with cluster:
            yield cluster
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
