"""A ComputeDomain end to end on two real nodes: NVIDIA's channel-injection example (its
ComputeDomain for two nodes, its pod twice) on two simulated GB200 trays of one NVLink clique.

Each node runs a kubelet, its containerd and the node agent serving ``compute-domain.nvidia.com``
beside the GPU driver; the operator runs the ComputeDomain controller, whose DaemonSet runs the
product image (imported into each node's containerd) with ``compute-domain-daemon run`` and its
``check`` probes, the IMEX tools coming from the daemon claim's CDI spec as the host driver's files
(the simulated driver root's stand-ins). Checked: the workload's pods land one per node (channel 0
is one claim's per node) and list their channel; the daemon pods run on both nodes, the wrapper in
each joined the clique (indexes 0 and 1, both Ready) and mapped its peer's DNS name in the pod's
own /etc/hosts; the domain is Ready with both nodes. Deleting the domain and its workload leaves no
DaemonSet, claim templates, cliques or node labels.

The local cluster has no kube-proxy: the daemon pods reach the API server through a node's relay,
by a name the server's certificate carries (``hostAliases`` and the two variables, given through
the operator's ``--compute-domain-daemon-overrides``, as a cluster would add what it needs).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_api import computedomains as cd
from dra_devcluster import LocalCluster, RealNode
from dra_devcluster.images import WORKLOAD_IMAGE, ImageArchive
from dra_devcluster.productimage import ensure_product_image
from dra_node_agent.nvidia import imex_config
from tests.integration.agent.agentproc import AgentDirs, AgentProcess, agent_kubeconfig
from tests.integration.operator.conftest import Operators, install_peering

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "manifests" / "examples" / "compute-domains" / "nvidia-imex-channel-injection.yaml"
COMPONENT = REPO / "manifests" / "optional" / "compute-domains"
NODES = ("cd-node-1", "cd-node-2")
TENANT = "cd-node-tenant"
DAEMONS = "cd-node-daemons"
DOMAIN = "imex-channel-injection"
# The gb200-nvl-x4 profile's cluster UUID and clique: both trays are in it.
CLIQUE = "6b9e5f0a-1c2d-4e3f-8a7b-9c0d1e2f3a4b.1"
API_NAME = "kubernetes.default.svc"  # a name the API server's certificate carries


@dataclass
class Domain:
    cluster: LocalCluster
    nodes: list[RealNode]
    agents: list[AgentProcess]
    operators: Operators
    image: str

    def pod_log(self, pod: dict[str, Any], container: str) -> str:
        node = next(n for n in self.nodes if n.name == pod["spec"]["nodeName"])
        return node.container_log(pod["metadata"]["namespace"], pod["metadata"]["name"], container)

    def pod_hosts(self, pod: dict[str, Any]) -> str:
        """The pod's /etc/hosts, which the kubelet keeps in the pod's folder and bind-mounts."""
        node = next(n for n in self.nodes if n.name == pod["spec"]["nodeName"])
        path = node.kubelet_root / "pods" / str(pod["metadata"]["uid"]) / "etc-hosts"
        return path.read_text()


def _rbac_in(path: Path, namespace: str) -> list[dict[str, Any]]:
    """The component's namespaced RBAC, moved from accel-dra into the test's daemon namespace."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        if doc["metadata"].get("namespace") == "accel-dra":
            doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects") or []:
            if subject.get("name") == "compute-domain-daemon":
                subject["namespace"] = namespace
    return docs


@pytest.fixture(scope="module")
def domain_nodes(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Domain]:
    cluster = local_cluster
    image = ensure_product_image(source=REPO)
    cluster.kubectl("apply", "-k", str(REPO / "crds"))
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/computedomaincliques.resource.nvidia.com", "--timeout=60s"
    )
    for namespace in (TENANT, DAEMONS):
        cluster.create_namespace(namespace)
    kubeconfig = agent_kubeconfig(cluster)
    cluster.apply(_rbac_in(COMPONENT / "node-agent-rbac.yaml", DAEMONS))
    cluster.apply(_rbac_in(COMPONENT / "daemon-rbac.yaml", DAEMONS))
    workdir = tmp_path_factory.mktemp("cd-node")
    nodes: list[RealNode] = []
    agents: list[AgentProcess] = []
    install_peering(cluster)
    operators = Operators(cluster=cluster, workdir=workdir, gpu_class="cd-node-gpu", tpu_class="cd-node-tpu")
    try:
        for name in NODES:
            node = cluster.add_real_node(name)
            nodes.append(node)
            node.import_images([ImageArchive(name=image.reference, path=image.path)])
            agent = AgentProcess(
                node=name,
                dirs=AgentDirs.for_node(node),
                kubeconfig=kubeconfig,
                profiles=("gb200-nvl-x4",),
                extra_env={
                    "DRA_AGENT_COMPUTE_DOMAINS": "true",
                    "DRA_AGENT_COMPUTE_DOMAIN_NAMESPACE": DAEMONS,
                },
                wait_kubelet=True,
            )
            agents.append(agent)
            agent.start(wait=False)  # it starts while the next node does
        for agent in agents:
            agent.wait_serving()
        # The daemon pods reach the API server through the first node's relay (no kube-proxy here).
        overrides = workdir / "daemon-overrides.yaml"
        port = cluster.server.rsplit(":", 1)[1]
        overrides.write_text(
            yaml.safe_dump(
                {
                    "hostAliases": [{"ip": nodes[0].gateway, "hostnames": [API_NAME]}],
                    "env": [
                        {"name": "KUBERNETES_SERVICE_HOST", "value": API_NAME},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": port},
                    ],
                }
            )
        )
        operators.start(
            "--compute-domains=true",
            f"--compute-domain-namespace={DAEMONS}",
            f"--compute-domain-daemon-image={image.name}",
            # Only the image imported into the nodes: nothing is pulled.
            "--compute-domain-daemon-image-pull-policy=Never",
            f"--compute-domain-daemon-overrides={overrides}",
            "--compute-domain-resync-seconds=3",
        )
        yield Domain(cluster=cluster, nodes=nodes, agents=agents, operators=operators, image=image.name)
    finally:
        cluster.kubectl("delete", "namespace", TENANT, "--wait=true", "--timeout=90s", check=False)
        operators.stop_all()
        for agent in agents:
            if agent.process is not None:
                agent.stop()
        for node in nodes:
            cluster.remove_real_node(node.name)
        cluster.kubectl("delete", "namespace", DAEMONS, "--wait=false", check=False)
        for cls in ("cd-node-gpu", "cd-node-tpu"):
            cluster.kubectl("delete", "deviceclass", cls, "--ignore-not-found", "--wait=false", check=False)


def _example(workloads: int) -> list[dict[str, Any]]:
    """NVIDIA's example for ``workloads`` nodes: its domain, and its pod once per node (only the
    image is this cluster's: busybox, whose sh runs the example's ``bash -c``)."""
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    domain = next(d for d in docs if d["kind"] == cd.DOMAIN_KIND)
    domain["spec"]["numNodes"] = workloads
    pod = next(d for d in docs if d["kind"] == "Pod")
    pods = []
    for i in range(workloads):
        copy_ = copy.deepcopy(pod)
        copy_["metadata"]["name"] = f"{pod['metadata']['name']}-{i}"
        copy_["spec"]["containers"][0]["image"] = WORKLOAD_IMAGE
        pods.append(copy_)
    for doc in (domain, *pods):
        doc["metadata"]["namespace"] = TENANT
    return [domain, *pods]


def _get(cluster: LocalCluster, *args: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def _items(cluster: LocalCluster, *args: str) -> list[dict[str, Any]]:
    found = _get(cluster, *args)
    return list((found or {}).get("items") or [])


def _ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return status.get("phase") == "Running" and conditions.get("Ready") == "True"


def _describe(cluster: LocalCluster, namespace: str) -> str:
    return cluster.kubectl("describe", "pods", "-n", namespace, check=False).stdout[-6000:]


def test_channel_injection_on_two_nodes_and_nothing_left_after(domain_nodes: Domain) -> None:
    setup = domain_nodes
    cluster = setup.cluster
    domain_doc, *pods = _example(len(NODES))
    cluster.apply([domain_doc])

    def domain() -> dict[str, Any]:
        return _get(cluster, "computedomain", DOMAIN, "-n", TENANT) or {}

    uid = cluster.wait_for(lambda: domain().get("metadata", {}).get("uid"), what="the domain's UID")
    template = domain_doc["spec"]["channel"]["resourceClaimTemplate"]["name"]
    cluster.wait_for(
        lambda: _get(cluster, "resourceclaimtemplate", template, "-n", TENANT) is not None,
        timeout=60,
        what="the workload's claim template",
    )
    cluster.apply(pods)
    names = [p["metadata"]["name"] for p in pods]

    def workloads_ready() -> list[dict[str, Any]] | None:
        found = [_get(cluster, "pod", name, "-n", TENANT) or {} for name in names]
        return found if all(_ready(p) for p in found) else None

    try:
        running = cluster.wait_for(workloads_ready, timeout=150, interval=1, what="the workload pods Running")
    except TimeoutError:
        raise AssertionError(
            f"workload pods:\n{_describe(cluster, TENANT)}\ndaemon pods:\n{_describe(cluster, DAEMONS)}"
        ) from None
    # One per node: channel 0 is one claim's on a node. Each lists its channel device node.
    assert sorted(p["spec"]["nodeName"] for p in running) == sorted(NODES)
    for pod in running:
        log = cluster.wait_for(
            lambda pod=pod: (text := setup.pod_log(pod, "ctr")) and "channel0" in text and text,
            timeout=30,
            what=f"{pod['metadata']['name']} lists its channel",
        )
        # ls -la: a character device named channel0 (the runtime made it from the CDI spec).
        assert any(line.startswith("c") and line.endswith(" channel0") for line in log.splitlines()), log

    # The daemons: one Running and Ready pod per node, the wrapper in each joined the clique.
    # (The pod turns Ready at its next readiness probe, up to 10 s after the clique entry did.)
    def daemons_ready() -> list[dict[str, Any]] | None:
        found = _items(cluster, "pods", "-n", DAEMONS, "-l", f"{cd.DOMAIN_LABEL}={uid}")
        return found if len(found) == len(NODES) and all(_ready(p) for p in found) else None

    try:
        daemons = cluster.wait_for(daemons_ready, timeout=60, interval=1, what="the daemon pods Ready")
    except TimeoutError:
        raise AssertionError(f"daemon pods:\n{_describe(cluster, DAEMONS)}") from None
    assert sorted(p["spec"]["nodeName"] for p in daemons) == sorted(NODES)
    for pod in daemons:
        (container,) = pod["spec"]["containers"]
        assert container["image"] == setup.image
        assert container["command"] == ["compute-domain-daemon", "run"]
        assert pod["metadata"]["labels"][cd.CLIQUE_LABEL] == CLIQUE
    clique = _get(cluster, "computedomainclique", cd.clique_name(uid, CLIQUE), "-n", DAEMONS)
    assert clique is not None
    entries = {d["nodeName"]: d for d in clique.get("daemons") or []}
    assert sorted(entries) == sorted(NODES)
    assert sorted(e["index"] for e in entries.values()) == [0, 1]
    assert all(e["status"] == cd.READY for e in entries.values()), entries
    ips = {p["spec"]["nodeName"]: p["status"]["podIP"] for p in daemons}
    assert {node: e["ipAddress"] for node, e in entries.items()} == ips
    # Each pod's own /etc/hosts maps both daemons' DNS names, its peer's among them.
    for pod in daemons:
        hosts = setup.pod_hosts(pod)
        for node, entry in entries.items():
            assert f"{entry['ipAddress']}\t{imex_config.dns_name(entry['index'])}\n" in hosts, (node, hosts)
        log = setup.pod_log(pod, "compute-domain-daemon")
        assert "joined clique" in log, log

    # The domain is Ready with both nodes.
    def domain_ready() -> dict[str, Any] | None:
        status = domain().get("status") or {}
        return status if status.get("status") == cd.READY else None

    status = cluster.wait_for(domain_ready, timeout=60, what="the domain Ready")
    assert sorted(n["name"] for n in status["nodes"]) == sorted(NODES)
    assert all(n["status"] == cd.READY for n in status["nodes"]), status

    # Deleting the domain and its workload leaves nothing behind.
    daemon_name = cd.daemon_name(uid)
    cluster.kubectl("delete", "computedomain", DOMAIN, "-n", TENANT, "--wait=false")
    cluster.kubectl("delete", "pods", *names, "-n", TENANT, "--wait=false")
    cluster.wait_for(lambda: not domain(), timeout=120, what="the domain gone")

    def leftovers() -> list[str]:
        found = []
        if _get(cluster, "daemonset", daemon_name, "-n", DAEMONS) is not None:
            found.append("DaemonSet")
        for namespace, name in ((TENANT, template), (DAEMONS, daemon_name)):
            if _get(cluster, "resourceclaimtemplate", name, "-n", namespace) is not None:
                found.append(f"template {namespace}/{name}")
        found += [
            f"clique {c['metadata']['name']}"
            for c in _items(cluster, "computedomaincliques", "-n", DAEMONS)
            if c["metadata"]["name"].startswith(uid)
        ]
        for node in NODES:
            labels = ((_get(cluster, "node", node) or {}).get("metadata") or {}).get("labels") or {}
            if cd.DOMAIN_LABEL in labels:
                found.append(f"label on {node}")
        found += [f"pod {p['metadata']['name']}" for p in _items(cluster, "pods", "-n", DAEMONS)]
        return found

    cluster.wait_for(lambda: not leftovers(), timeout=90, what="nothing of the domain left")
