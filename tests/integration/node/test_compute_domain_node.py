"""A ComputeDomain end to end on two real nodes: NVIDIA's channel-injection example (its
ComputeDomain for two nodes, its pod twice) on two simulated GB200 trays of one NVLink clique.

Each node runs a kubelet, its containerd and the node agent serving ``compute-domain.nvidia.com``
beside the GPU driver; the operator runs the ComputeDomain controller, whose DaemonSet runs the
product image (imported into each node's containerd) with ``compute-domain-daemon run`` and its
``check`` probes, the IMEX tools coming from the daemon claim's CDI spec as the host driver's files
(the simulated driver root's stand-ins). Checked: the workload's pods land one per node (channel 0
is one claim's per node) and list their channel; the daemon pods run on both nodes, the wrapper in
each joined the clique (indexes 0 and 1, both Ready) and mapped its peer's DNS name in the pod's
own /etc/hosts; the domain is Ready with both nodes. Deleting the domain while its workload runs
keeps the daemons (an Event says why) and the workload running; once the workload's pods are gone,
no DaemonSet, claim templates, cliques or node labels are left.

Beside them: a third node, an H100 host whose NVSwitches join its own GPUs only (no multi-node
clique), runs NVIDIA's example for one node as it is written: the daemon runs idle, the domain turns
Ready with that node, and the container gets no channel device. And a pod of another namespace whose
claim names a domain's UID (UIDs are no secret: they label the nodes) is refused by the node agent,
with the reason in the pod's Events, nothing prepared and no node labelled.

The local cluster has no kube-proxy: the daemon pods reach the API server through a node's relay,
by a name the server's certificate carries (``hostAliases`` and the two variables, given through
the operator's ``--compute-domain-daemon-overrides``, as a cluster would add what it needs).
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator, Sequence
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
NO_FABRIC_NODE = "cd-node-3"  # an H100 host: NVLink within the node only, no clique
TENANT = "cd-node-tenant"
NO_FABRIC_TENANT = "cd-node-no-fabric"
INTRUDER = "cd-node-intruder"
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
    for namespace in (TENANT, NO_FABRIC_TENANT, DAEMONS, INTRUDER):
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
        for name in (*NODES, NO_FABRIC_NODE):
            node = cluster.add_real_node(name)
            nodes.append(node)
            # Each workload test decides where its pods may go (a cordon leaves the daemons alone:
            # a DaemonSet's pods tolerate it).
            cluster.kubectl("cordon", name)
            node.import_images([ImageArchive(name=image.reference, path=image.path)])
            agent = AgentProcess(
                node=name,
                dirs=AgentDirs.for_node(node),
                kubeconfig=kubeconfig,
                profiles=("h100-80gb-x8",) if name == NO_FABRIC_NODE else ("gb200-nvl-x4",),
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
        cluster.kubectl(
            "delete",
            "namespace",
            TENANT,
            NO_FABRIC_TENANT,
            INTRUDER,
            "--wait=true",
            "--timeout=90s",
            check=False,
        )
        operators.stop_all()
        for agent in agents:
            if agent.process is not None:
                agent.stop()
        for node in nodes:
            cluster.remove_real_node(node.name)
        cluster.kubectl("delete", "namespace", DAEMONS, "--wait=false", check=False)
        for cls in ("cd-node-gpu", "cd-node-tpu"):
            cluster.kubectl("delete", "deviceclass", cls, "--ignore-not-found", "--wait=false", check=False)


def _example(workloads: int, *, namespace: str = TENANT) -> list[dict[str, Any]]:
    """NVIDIA's example for ``workloads`` nodes: its domain, and its pod once per node (only the
    image is this cluster's: busybox, whose sh runs the example's ``bash -c``), in ``namespace``."""
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
        doc["metadata"]["namespace"] = namespace
    return [domain, *pods]


@contextlib.contextmanager
def _schedulable(cluster: LocalCluster, *nodes: str) -> Iterator[None]:
    """Workload pods may go to ``nodes`` (and to no other node of the module) for the block."""
    cluster.kubectl("uncordon", *nodes)
    try:
        yield
    finally:
        cluster.kubectl("cordon", *nodes, check=False)


def _warning(cluster: LocalCluster, namespace: str, name: str, text: str) -> str | None:
    """The message of a Warning Event about ``name`` that contains ``text``, if any."""
    events = _items(cluster, "events", "-n", namespace, f"--field-selector=involvedObject.name={name}")
    return next(
        (m for e in events if e.get("type") == "Warning" and text in (m := str(e.get("message") or ""))),
        None,
    )


def _event(cluster: LocalCluster, namespace: str, name: str, reason: str) -> str | None:
    """The message of the Event about ``name`` with ``reason``, if any."""
    events = _items(cluster, "events", "-n", namespace, f"--field-selector=involvedObject.name={name}")
    return next((str(e.get("message") or "") for e in events if e.get("reason") == reason), None)


def _leftovers(
    cluster: LocalCluster, *, uid: str, namespace: str, template: str, nodes: Sequence[str]
) -> list[str]:
    """What is left of the domain ``uid``: its DaemonSet, claim templates, cliques, node labels and
    daemon pods."""
    daemon_name = cd.daemon_name(uid)
    found = []
    if _get(cluster, "daemonset", daemon_name, "-n", DAEMONS) is not None:
        found.append("DaemonSet")
    for ns, name in ((namespace, template), (DAEMONS, daemon_name)):
        if _get(cluster, "resourceclaimtemplate", name, "-n", ns) is not None:
            found.append(f"template {ns}/{name}")
    found += [
        f"clique {c['metadata']['name']}"
        for c in _items(cluster, "computedomaincliques", "-n", DAEMONS)
        if c["metadata"]["name"].startswith(uid)
    ]
    for node in nodes:
        labels = _node_labels(cluster, node)
        if labels.get(cd.DOMAIN_LABEL) == uid:
            found.append(f"label on {node}")
    found += [
        f"pod {p['metadata']['name']}"
        for p in _items(cluster, "pods", "-n", DAEMONS, "-l", f"{cd.DOMAIN_LABEL}={uid}")
    ]
    return found


def _get(cluster: LocalCluster, *args: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def _items(cluster: LocalCluster, *args: str) -> list[dict[str, Any]]:
    found = _get(cluster, *args)
    return list((found or {}).get("items") or [])


def _node_labels(cluster: LocalCluster, node: str) -> dict[str, str]:
    return dict(((_get(cluster, "node", node) or {}).get("metadata") or {}).get("labels") or {})


def _ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return status.get("phase") == "Running" and conditions.get("Ready") == "True"


def _describe(cluster: LocalCluster, namespace: str) -> str:
    return cluster.kubectl("describe", "pods", "-n", namespace, check=False).stdout[-6000:]


def test_channel_injection_on_two_nodes_and_nothing_left_after(domain_nodes: Domain) -> None:
    with _schedulable(domain_nodes.cluster, *NODES):
        _channel_injection_on_two_nodes(domain_nodes)


def _channel_injection_on_two_nodes(setup: Domain) -> None:
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

    # Deleting the domain while its workload runs: the workload's template goes at once (no new pod
    # joins), the daemons stay while the pods hold channels, and an Event on the domain says why.
    daemon_name = cd.daemon_name(uid)
    cluster.kubectl("delete", "computedomain", DOMAIN, "-n", TENANT, "--wait=false")
    waiting = cluster.wait_for(
        lambda: _event(cluster, TENANT, DOMAIN, "WaitingForWorkload"),
        timeout=60,
        what="the domain's WaitingForWorkload Event",
    )
    assert "until the workload's pods end" in waiting, waiting
    cluster.wait_for(
        lambda: _get(cluster, "resourceclaimtemplate", template, "-n", TENANT) is None,
        timeout=30,
        what="the workload's claim template removed",
    )
    assert domain().get("metadata", {}).get("deletionTimestamp"), domain()
    assert _get(cluster, "daemonset", daemon_name, "-n", DAEMONS) is not None
    assert daemons_ready() is not None, _describe(cluster, DAEMONS)
    for name in names:
        pod = _get(cluster, "pod", name, "-n", TENANT) or {}
        assert _ready(pod), pod.get("status")
        assert [c["restartCount"] for c in pod["status"]["containerStatuses"]] == [0]

    # Once the workload's pods are gone, so is everything of the domain.
    cluster.kubectl("delete", "pods", *names, "-n", TENANT, "--wait=false")
    cluster.wait_for(lambda: not domain(), timeout=120, what="the domain gone")
    cluster.wait_for(
        lambda: not _leftovers(cluster, uid=uid, namespace=TENANT, template=template, nodes=NODES),
        timeout=90,
        what="nothing of the domain left",
    )
    for node in NODES:
        labels = _node_labels(cluster, node)
        assert cd.DOMAIN_LABEL not in labels, (node, labels)


def test_without_nvlink_fabric_the_example_runs_with_no_channel_device(domain_nodes: Domain) -> None:
    """NVIDIA's example as written (one node) on the H100 host: prepared with no device."""
    setup = domain_nodes
    cluster = setup.cluster
    domain_doc, pod_doc = _example(1, namespace=NO_FABRIC_TENANT)
    name = pod_doc["metadata"]["name"]
    template = domain_doc["spec"]["channel"]["resourceClaimTemplate"]["name"]
    with _schedulable(cluster, NO_FABRIC_NODE):
        cluster.apply([domain_doc])

        def domain() -> dict[str, Any]:
            return _get(cluster, "computedomain", DOMAIN, "-n", NO_FABRIC_TENANT) or {}

        uid = cluster.wait_for(lambda: domain().get("metadata", {}).get("uid"), what="the domain's UID")
        cluster.wait_for(
            lambda: _get(cluster, "resourceclaimtemplate", template, "-n", NO_FABRIC_TENANT) is not None,
            timeout=60,
            what="the workload's claim template",
        )
        cluster.apply([pod_doc])
        try:
            pod = cluster.wait_for(
                lambda: (
                    (found := _get(cluster, "pod", name, "-n", NO_FABRIC_TENANT) or {})
                    and _ready(found)
                    and found
                ),
                timeout=150,
                interval=1,
                what="the workload pod Running",
            )
        except TimeoutError:
            raise AssertionError(
                f"workload:\n{_describe(cluster, NO_FABRIC_TENANT)}\ndaemons:\n{_describe(cluster, DAEMONS)}"
            ) from None
        assert pod["spec"]["nodeName"] == NO_FABRIC_NODE
        log = cluster.wait_for(
            lambda: setup.pod_log(pod, "ctr"), timeout=30, what="the workload's listing of its channels"
        )
        # The claim was prepared with no device: the folder is not there at all.
        assert "No such file or directory" in log, log
        assert "channel0" not in log, log

        # The daemon runs idle on the node (Ready: nothing to wait for), no clique is made, and
        # the domain is Ready with the node.
        def daemon_ready() -> list[dict[str, Any]] | None:
            found = _items(cluster, "pods", "-n", DAEMONS, "-l", f"{cd.DOMAIN_LABEL}={uid}")
            return found if len(found) == 1 and _ready(found[0]) else None

        (daemon,) = cluster.wait_for(daemon_ready, timeout=60, interval=1, what="the daemon pod Ready")
        assert daemon["spec"]["nodeName"] == NO_FABRIC_NODE
        assert "no NVLink clique here" in setup.pod_log(daemon, "compute-domain-daemon")

        def domain_ready() -> dict[str, Any] | None:
            status = domain().get("status") or {}
            return status if status.get("status") == cd.READY else None

        status = cluster.wait_for(domain_ready, timeout=60, what="the domain Ready")
        assert [n["name"] for n in status["nodes"]] == [NO_FABRIC_NODE], status
        assert not [
            c
            for c in _items(cluster, "computedomaincliques", "-n", DAEMONS)
            if c["metadata"]["name"].startswith(uid)
        ]

        cluster.kubectl("delete", "computedomain", DOMAIN, "-n", NO_FABRIC_TENANT, "--wait=false")
        cluster.kubectl("delete", "pod", name, "-n", NO_FABRIC_TENANT, "--wait=false")
        cluster.wait_for(lambda: not domain(), timeout=120, what="the domain gone")
        cluster.wait_for(
            lambda: (
                not _leftovers(
                    cluster, uid=uid, namespace=NO_FABRIC_TENANT, template=template, nodes=[NO_FABRIC_NODE]
                )
            ),
            timeout=90,
            what="nothing of the domain left",
        )


def test_a_claim_of_another_namespace_naming_a_domain_is_refused_on_the_node(domain_nodes: Domain) -> None:
    """An intruder copies the domain's channel claim into its own namespace (the domain's UID is on
    every node it holds): the node agent refuses to prepare it, says why, and labels no node."""
    setup = domain_nodes
    cluster = setup.cluster
    domain_doc, *_ = _example(len(NODES))
    domain_doc["metadata"]["name"] = "intruded"
    domain_doc["spec"]["channel"]["resourceClaimTemplate"]["name"] = "intruded-channel"
    cluster.apply([domain_doc])
    uid = cluster.wait_for(
        lambda: ((_get(cluster, "computedomain", "intruded", "-n", TENANT) or {}).get("metadata") or {}).get(
            "uid"
        ),
        what="the domain's UID",
    )
    template = cluster.wait_for(
        lambda: _get(cluster, "resourceclaimtemplate", "intruded-channel", "-n", TENANT),
        timeout=60,
        what="the workload's claim template",
    )
    claim = {
        "apiVersion": template["apiVersion"],
        "kind": "ResourceClaim",
        "metadata": {"name": "borrowed-channel", "namespace": INTRUDER},
        "spec": template["spec"]["spec"],
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "intruder", "namespace": INTRUDER},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "ctr",
                    "image": WORKLOAD_IMAGE,
                    "command": ["sh", "-c", "ls -la /dev/nvidia-caps-imex-channels; sleep 3600"],
                    "resources": {"claims": [{"name": "channel"}]},
                }
            ],
            "resourceClaims": [{"name": "channel", "resourceClaimName": "borrowed-channel"}],
        },
    }
    try:
        with _schedulable(cluster, *NODES):
            cluster.apply([claim, pod])
            refusal = cluster.wait_for(
                lambda: _warning(cluster, INTRUDER, "intruder", "must be in its domain's namespace"),
                timeout=120,
                what="the node agent's refusal in the intruder pod's Events",
            )
        assert f"namespace {INTRUDER}" in refusal, refusal
        assert f"namespace {TENANT}" in refusal, refusal
        found = _get(cluster, "pod", "intruder", "-n", INTRUDER) or {}
        assert found["status"]["phase"] == "Pending", found["status"]
        node = found["spec"]["nodeName"]
        assert node in NODES
        claim_uid = (_get(cluster, "resourceclaim", "borrowed-channel", "-n", INTRUDER) or {})["metadata"][
            "uid"
        ]
        agent = setup.agents[NODES.index(node)]
        assert not agent.dirs.cdi_spec(claim_uid, cd.DRIVER).exists()
        checkpoint = agent.dirs.checkpoint(cd.DRIVER)
        assert not checkpoint.exists() or claim_uid not in agent.dirs.checkpoint_claims(cd.DRIVER)
        for name in NODES:
            labels = _node_labels(cluster, name)
            assert labels.get(cd.DOMAIN_LABEL) != uid, (name, labels)
        assert not _items(cluster, "pods", "-n", DAEMONS, "-l", f"{cd.DOMAIN_LABEL}={uid}")
    finally:
        cluster.kubectl(
            "delete", "pod", "intruder", "-n", INTRUDER, "--wait=true", "--timeout=60s", check=False
        )
        cluster.kubectl(
            "delete", "resourceclaim", "borrowed-channel", "-n", INTRUDER, "--wait=true", check=False
        )
        cluster.kubectl(
            "delete", "computedomain", "intruded", "-n", TENANT, "--wait=true", "--timeout=90s", check=False
        )
