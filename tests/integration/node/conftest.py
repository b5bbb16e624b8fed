"""A real node for the tests of this folder: a kubelet and its own containerd in the session's
cluster, with the node agent serving the kubelet's plugin folders (simulated H100s whose device
nodes are real character devices) and a DeviceClass of the test's own.

Pods are pinned to the node and run the local busybox image; their logs are read from the node's
pod-log folder (``kubectl logs`` needs the API server to reach the kubelet, which this cluster does
not wire up yet).
"""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dra_devcluster import LocalCluster, RealNode, resolve_kubernetes_version
from dra_devcluster.images import WORKLOAD_IMAGE
from dra_devcluster.pki import CertPair, issue_client_cert
from dra_node_agent.simulated.health_probe import FAULTS_FOLDER
from tests.integration.agent.agentproc import GPU, AgentDirs, AgentProcess, agent_kubeconfig
from tests.integration.objects import device_class

NODE = "real-node-1"
CLASS = "real-node-gpu"
NAMESPACE = "real-node"


@dataclass
class NodeWithAgent:
    cluster: LocalCluster
    node: RealNode
    agent: AgentProcess
    _kubelet_client: CertPair | None = field(default=None, init=False)

    def pod_log(self, pod: str, container: str = "main", *, namespace: str = NAMESPACE) -> str:
        """What the container printed so far (the kubelet's CRI log, one line per write)."""
        return self.node.container_log(namespace, pod, container)

    def wait_log(self, pod: str, text: str, *, timeout: float = 90) -> str:
        def seen() -> str | None:
            log = self.pod_log(pod)
            return log if text in log else None

        try:
            found: str = self.cluster.wait_for(
                seen, timeout=timeout, interval=0.3, what=f"{text!r} in {pod}'s log"
            )
        except TimeoutError:
            describe = self.cluster.kubectl("describe", "pod", pod, "-n", NAMESPACE, check=False).stdout
            raise AssertionError(
                f"{text!r} not in the log of {pod}:\n{self.pod_log(pod)}\n{describe[-3000:]}"
            ) from None
        return found

    def faults_dir(self) -> Path:
        """Where the simulated GPUs take faults from (``xid-<minor>-<code>``: one XID)."""
        # <state dir>/simulated/<index>-<profile>: the fake hardware of the agent's one profile
        (hardware,) = (self.agent.dirs.state / "simulated").iterdir()
        faults = hardware / FAULTS_FOLDER
        faults.mkdir(exist_ok=True)
        return faults

    def resource_health(self, pod: str) -> list[dict[str, Any]]:
        """The kubelet's allocatedResourcesStatus entries of the pod's container."""
        status = self.cluster.get_json("pod", pod, "-n", NAMESPACE).get("status") or {}
        out: list[dict[str, Any]] = []
        for container in status.get("containerStatuses") or []:
            for entry in container.get("allocatedResourcesStatus") or []:
                out.extend(entry.get("resources") or [])
        return out

    def kubelet_goroutines(self) -> str:
        """The kubelet's goroutine dump, from its pprof endpoint on loopback (the API server's node
        proxy cannot resolve node names here), with a client certificate from the cluster CA."""
        if self._kubelet_client is None:
            self._kubelet_client = issue_client_cert(
                ca=self.node.ca, directory=self.node.root / "test-pki", stem="test-client", common_name="test"
            )
        # The kubelet serves with a self-signed certificate issued for its node name.
        context = ssl.create_default_context(cafile=str(self.node.root / "kubelet-pki" / "kubelet.crt"))
        context.check_hostname = False
        context.load_cert_chain(str(self._kubelet_client.cert), str(self._kubelet_client.key))
        url = f"https://127.0.0.1:{self.node.ports.kubelet}/debug/pprof/goroutine?debug=2"
        with urllib.request.urlopen(url, context=context, timeout=10) as reply:
            text: str = reply.read().decode(errors="replace")
        return text

    def claim_of(self, pod: str) -> dict[str, Any]:
        items: list[dict[str, Any]] = self.cluster.get_json("resourceclaims", "-n", NAMESPACE)["items"]
        for claim in items:
            owners = claim["metadata"].get("ownerReferences") or []
            if any(o.get("kind") == "Pod" and o.get("name") == pod for o in owners):
                return claim
        raise AssertionError(f"no claim of pod {pod}")


def gpu_pod(name: str, *, command: str, count: int = 1) -> list[dict[str, Any]]:
    """A claim template and a pod on the real node that runs ``command`` in the busybox image."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS, "count": count}}]
                }
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": WORKLOAD_IMAGE,
                    "command": ["sh", "-c", command],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
        },
    }
    return [template, pod]


@pytest.fixture(scope="module")
def node_with_agent(
    local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[NodeWithAgent]:
    # A module may run a kubelet of an older release (KUBELET_RELEASE, e.g. "1.34") with gates of
    # its own on top of that release's (KUBELET_GATES).
    release = getattr(request.module, "KUBELET_RELEASE", None)
    node = local_cluster.add_real_node(
        NODE,
        kubelet=resolve_kubernetes_version(release) if release else None,
        kubelet_gates=getattr(request.module, "KUBELET_GATES", None),
    )
    agent = AgentProcess(
        node=NODE,
        dirs=AgentDirs.for_node(node),
        # A module may bind the agent's token to the node (AGENT_TOKEN_BOUND_TO_NODE), as a pod's is.
        kubeconfig=agent_kubeconfig(
            local_cluster,
            bound_node=NODE if getattr(request.module, "AGENT_TOKEN_BOUND_TO_NODE", False) else None,
        ),
        # A test module may name the agent's simulated profiles (AGENT_PROFILES); else the H100s.
        profiles=getattr(request.module, "AGENT_PROFILES", ("h100-80gb-x8",)),
        # Faults are polled every second and a device recovers after 8 s without a new one.
        # A module may add settings of its own (AGENT_ENV).
        extra_env={
            "DRA_AGENT_HEALTH_POLL_INTERVAL": "1",
            "DRA_AGENT_HEALTH_RECOVERY_PERIOD": "8",
            **getattr(request.module, "AGENT_ENV", {}),
        },
        wait_kubelet=True,
    )
    try:
        local_cluster.create_namespace(NAMESPACE)
        local_cluster.apply([device_class(CLASS, driver=GPU)])
        agent.start()
        yield NodeWithAgent(cluster=local_cluster, node=node, agent=agent)
    finally:
        # Waited for, while the agent still unprepares the pods' claims: the next module's node
        # starts in a namespace of the same name.
        local_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s", check=False)
        if agent.process is not None:
            agent.stop()
        local_cluster.kubectl("delete", "deviceclass", CLASS, "--ignore-not-found", check=False)
        local_cluster.remove_real_node(NODE)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        setup = getattr(item, "funcargs", {}).get("node_with_agent")
        if setup is not None:
            for part in ("kubelet", "containerd"):
                report.sections.append((f"{part} log", setup.node.log_tail(part, 80)))
            report.sections.append(("agent log", setup.agent.log_tail(80)))
    return report


def wait_gone(cluster: LocalCluster, path: Path, *, timeout: float = 60) -> None:
    cluster.wait_for(lambda: not path.exists(), timeout=timeout, interval=0.3, what=f"{path} removed")
