"""The one-command demo: the real control plane, the operator, one agent per node, and the examples.

Two GPU nodes (8 simulated H100; 8 A100, three of them in MIG mode) and one TPU node (v6e 2x4),
each a real kubelet with its own
containerd (:mod:`dra_devcluster.node`). The operator and the agents run as local processes, the
agents in simulated mode serving their node's kubelet. The examples are applied as they are written,
with one change: their image is the local busybox image (no registry is reachable). The demo prints
what a user wants to see: the claims, each pod's node and devices, what each container printed (the
environment and device nodes from the CDI specs), each container's allocatedResourcesStatus, and
device-health metrics.

With ``fake_nodes`` (``--fake-nodes``, for machines that cannot run a kubelet) the nodes are Node
objects only, and this module plays the kubelet instead: registration, then NodePrepareResources
over the agents' unix sockets; it then prints the environment the CDI specs would give.

It starts the operator and the agents through their console entry points and never imports them.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dra_api.kubeletapi.model import ClaimRef
from dra_devcluster.cluster import LocalCluster, free_port
from dra_devcluster.images import WORKLOAD_IMAGE
from dra_devcluster.kubelet import KubeletClientError, KubeletPluginClient
from dra_devcluster.node import RealNode
from dra_devcluster.versions import KubernetesVersion, resolve


@dataclass(frozen=True)
class DemoNode:
    name: str
    profile: str
    labels: Mapping[str, str]
    agent_args: tuple[str, ...] = ()


DEMO_NODES: tuple[DemoNode, ...] = (
    # Its GPUs are shared out by memory (NVIDIA's ConsumableShares): a claim that asks for no
    # share still gets a whole GPU, and the shares example's two tenants get one GPU together.
    DemoNode(
        "gpu-node-1",
        "h100-80gb-x8",
        {"nvidia.com/gpu.present": "true"},
        agent_args=("--consumable-shares=memory",),
    ),
    DemoNode("gpu-node-2", "a100-40gb-mig", {"nvidia.com/gpu.present": "true"}),
    DemoNode(
        "tpu-node-1",
        "tpu-v6e-2x4",
        {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
            "cloud.google.com/gke-tpu-topology": "2x4",
        },
    ),
)


@dataclass
class NodeRuntime:
    """Where one node's agent keeps its sockets, CDI specs and checkpoint (the node's "host" paths)."""

    node: DemoNode
    root: Path
    metrics_port: int
    real: RealNode | None = None

    @property
    def registry_dir(self) -> Path:
        return self.real.registry_dir if self.real else self.root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.real.plugins_dir if self.real else self.root / "plugins"

    @property
    def cdi_dir(self) -> Path:
        return self.real.cdi_dir if self.real else self.root / "cdi"

    @property
    def state_dir(self) -> Path:
        return self.root / "agent-state" if self.real else self.root / "state"


@dataclass
class PreparedPod:
    namespace: str
    name: str
    node: str
    claims: list[dict[str, Any]] = field(default_factory=list)
    cdi_ids: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _console_script(name: str) -> str:
    # The scripts sit next to the interpreter of the environment the project is installed in.
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def start_components(
    cluster: LocalCluster, *, workdir: Path, fake_nodes: bool = False
) -> tuple[list[NodeRuntime], int]:
    """Create the nodes (real ones unless ``fake_nodes``) and start the operator and one agent per
    node; returns runtimes and the operator's metrics port."""
    runtimes: list[NodeRuntime] = []
    # As a real install does: the project's CRDs (Kopf peering) before the operator.
    cluster.kubectl("apply", "-k", str(repo_root() / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    cluster.kubectl("apply", "-f", str(repo_root() / "manifests" / "base" / "operator-peering.yaml"))
    operator_port = free_port()
    cluster.spawn(
        "dra-operator",
        [
            _console_script("dra-operator"),
            "run",
            f"--kubeconfig={cluster.kubeconfig}",
            "--metrics-host=127.0.0.1",
            f"--metrics-port={operator_port}",
            "--mig-enabled=true",  # NVIDIA's MIG example asks for class mig.nvidia.com
        ],
    )
    for node in DEMO_NODES:
        if fake_nodes:
            cluster.add_node(node.name, labels=node.labels)
            runtime = NodeRuntime(node=node, root=workdir / "nodes" / node.name, metrics_port=free_port())
        else:
            # The demo runs its agents as processes: fixed socket names, so the nodes fit in a short
            # workdir and everything the demo starts stays in it.
            real = cluster.add_real_node(node.name, agent_pods=False)
            labels = [f"{k}={v}" for k, v in node.labels.items()]
            cluster.kubectl("label", "node", node.name, *labels, "--overwrite")
            runtime = NodeRuntime(node=node, root=real.root, metrics_port=free_port(), real=real)
        for directory in (runtime.registry_dir, runtime.plugins_dir, runtime.cdi_dir, runtime.state_dir):
            directory.mkdir(parents=True, exist_ok=True)
        cluster.spawn(
            f"dra-node-agent-{node.name}",
            [
                _console_script("dra-node-agent"),
                "run",
                f"--node-name={node.name}",
                f"--kubeconfig={cluster.kubeconfig}",
                f"--simulate-profile={node.profile}",
                f"--kubelet-registry-dir={runtime.registry_dir}",
                f"--kubelet-plugins-dir={runtime.plugins_dir}",
                f"--cdi-dir={runtime.cdi_dir}",
                f"--state-dir={runtime.state_dir}",
                f"--metrics-address=127.0.0.1:{runtime.metrics_port}",
                *node.agent_args,
            ],
        )
        runtimes.append(runtime)
    return runtimes, operator_port


def wait_for_slices(cluster: LocalCluster, runtimes: Sequence[NodeRuntime], *, timeout: float = 120) -> None:
    wanted = {r.node.name for r in runtimes}

    def published() -> bool:
        slices = cluster.get_json("resourceslices")["items"]
        return wanted <= {s["spec"].get("nodeName") for s in slices}

    cluster.wait_for(published, timeout=timeout, what="every agent to publish its ResourceSlices")


def wait_for_plugins(cluster: LocalCluster, runtimes: Sequence[NodeRuntime], *, timeout: float = 60) -> None:
    """Wait until every agent serves its kubelet registration socket (what kubelet watches for)."""

    def serving() -> bool:
        return all(any(r.registry_dir.glob("*-reg.sock")) for r in runtimes)

    try:
        cluster.wait_for(serving, timeout=timeout, what="every agent's kubelet registration socket")
    except TimeoutError as err:
        missing = [r.node.name for r in runtimes if not any(r.registry_dir.glob("*-reg.sock"))]
        tails = "\n".join(f"--- {n}:\n{cluster.log_tail(f'dra-node-agent-{n}', lines=15)}" for n in missing)
        raise TimeoutError(f"{err}; agents without a socket: {', '.join(missing)}\n{tails}") from err


def example_namespaces(path: Path) -> list[str]:
    """The namespaces an example's objects land in: its own, or for a file written without one (as
    GKE's guide writes them, for ``kubectl create -n``) ``dra-example-<file stem>``."""
    return _namespaces([d for d in yaml.safe_load_all(path.read_text()) if d], stem=path.stem)


def _namespaces(docs: Sequence[Mapping[str, Any]], *, stem: str) -> list[str]:
    own = sorted(
        {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
        | {d["metadata"]["namespace"] for d in docs if d["metadata"].get("namespace")}
    )
    return own or [f"dra-example-{stem}"]


def example_pod_count(paths: Sequence[Path]) -> int:
    """How many pods the examples create (Pods, plus each Deployment's replicas)."""
    count = 0
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "Pod":
                count += 1
            elif doc and doc["kind"] == "Deployment":
                count += int(doc["spec"].get("replicas", 1))
    return count


def apply_examples(cluster: LocalCluster, *, image: str | None = None) -> list[Path]:
    """Apply the examples as written (a file without namespaces into its own, as ``kubectl create
    -n`` would); with ``image``, every container runs that image instead."""
    examples = sorted((repo_root() / "manifests" / "examples").glob("*.yaml"))
    if not examples:
        raise FileNotFoundError(f"no examples under {repo_root() / 'manifests' / 'examples'}")
    for path in examples:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        unnamespaced = not any(d["kind"] == "Namespace" or d["metadata"].get("namespace") for d in docs)
        namespace = _namespaces(docs, stem=path.stem)[0]
        if unnamespaced:
            cluster.create_namespace(namespace)
        if image is None:
            target = ["-n", namespace] if unnamespaced else []
            cluster.kubectl("apply", *target, "-f", str(path))
            continue
        for doc in docs:
            if unnamespaced:
                doc["metadata"]["namespace"] = namespace
            spec = doc.get("spec") or {}
            pod_spec = (spec.get("template") or {}).get("spec") if doc["kind"] != "Pod" else spec
            for container in (pod_spec or {}).get("containers") or []:
                container["image"] = image
        cluster.apply(docs)
    return examples


def _claim_names(pod: Mapping[str, Any]) -> list[str] | None:
    """The pod's claim names, or None while the claim controller has not created them all yet."""
    statuses = {
        s["name"]: s.get("resourceClaimName")
        for s in pod.get("status", {}).get("resourceClaimStatuses") or []
    }
    names: list[str] = []
    for ref in pod["spec"].get("resourceClaims") or []:
        if ref.get("resourceClaimName"):
            names.append(ref["resourceClaimName"])
        elif statuses.get(ref["name"]):
            names.append(statuses[ref["name"]])
        else:
            return None
    return names


async def _prepare_on_node(
    runtime: NodeRuntime, claims: Sequence[dict[str, Any]]
) -> tuple[list[str], list[str]]:
    """Play kubelet for one pod: register each driver the claims use, then NodePrepareResources."""
    by_driver: dict[str, list[ClaimRef]] = {}
    for claim in claims:
        ref = ClaimRef(
            namespace=claim["metadata"]["namespace"],
            name=claim["metadata"]["name"],
            uid=claim["metadata"]["uid"],
        )
        for driver in sorted({r["driver"] for r in claim["status"]["allocation"]["devices"]["results"]}):
            by_driver.setdefault(driver, []).append(ref)
    cdi_ids: list[str] = []
    errors: list[str] = []
    for driver, refs in by_driver.items():
        try:
            client = await KubeletPluginClient.register_driver(runtime.registry_dir, driver=driver)
        except KubeletClientError as err:
            errors.append(f"{driver}: {err}")
            continue
        async with client:
            try:
                results = await client.prepare(refs)
            except KubeletClientError as err:
                errors.append(f"{driver}: {err}")
                continue
        for uid, result in results.items():
            if result.error:
                errors.append(f"claim {uid}: {result.error}")
            for device in result.devices:
                cdi_ids.extend(device.cdi_device_ids)
    return cdi_ids, errors


def play_kubelet(
    cluster: LocalCluster, runtimes: Sequence[NodeRuntime], *, expected_pods: int, timeout: float = 180
) -> list[PreparedPod]:
    """Prepare the claims of every pod bound to a demo node, as kubelet would before starting it."""
    by_node = {r.node.name: r for r in runtimes}
    done: dict[tuple[str, str], PreparedPod] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(done) < expected_pods:
        for pod in cluster.get_json("pods", "--all-namespaces")["items"]:
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            node = pod["spec"].get("nodeName")
            if key in done or node not in by_node or not pod["spec"].get("resourceClaims"):
                continue
            names = _claim_names(pod)
            if names is None:
                continue
            claims = [cluster.get_json("resourceclaim", n, "-n", key[0]) for n in names]
            if not all(c.get("status", {}).get("allocation") for c in claims):
                continue
            cdi_ids, errors = asyncio.run(_prepare_on_node(by_node[node], claims))
            done[key] = PreparedPod(key[0], key[1], node, claims, cdi_ids, errors)
        time.sleep(0.5)
    return list(done.values())


def container_environment(runtime: NodeRuntime, cdi_ids: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """What a CDI-aware runtime would inject for these device IDs: environment and device nodes."""
    wanted = set(cdi_ids)
    env: dict[str, str] = {}
    nodes: list[str] = []
    for path in sorted(runtime.cdi_dir.glob("*.json")):
        spec = json.loads(path.read_text())
        kind = spec.get("kind", "")
        matched = [d for d in spec.get("devices", []) if f"{kind}={d['name']}" in wanted]
        if not matched:
            continue
        for edits in [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in matched]:
            for item in edits.get("env") or []:
                name, _, value = item.partition("=")
                env[name] = value
            nodes.extend(n["path"] for n in edits.get("deviceNodes") or [])
    return env, sorted(set(nodes))


def metrics_excerpt(port: int, *, needle: str = "device", limit: int = 8) -> list[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError as err:
        return [f"(metrics not reachable on port {port}: {err})"]
    # Samples only: no HELP/TYPE comments, and no "_created" timestamps prometheus-client adds.
    lines = [
        line
        for line in text.splitlines()
        if needle in line and not line.startswith("#") and "_created" not in line.split("{")[0]
    ]
    return lines[:limit] or [f"(no {needle} series exported yet)"]


def report(
    cluster: LocalCluster, runtimes: Sequence[NodeRuntime], pods: Sequence[PreparedPod], operator_port: int
) -> str:
    by_node = {r.node.name: r for r in runtimes}
    out: list[str] = []
    out.append("$ kubectl get resourceclaims -A")
    out.append(cluster.kubectl("get", "resourceclaims", "--all-namespaces").stdout.rstrip())
    out.append("")
    for pod in pods:
        out.append(f"pod {pod.namespace}/{pod.name} on {pod.node}:")
        for claim in pod.claims:
            results = claim["status"]["allocation"]["devices"]["results"]
            devices = ", ".join(_result_text(r) for r in results)
            out.append(f"  claim {claim['metadata']['name']}: {devices}")
        env, nodes = container_environment(by_node[pod.node], pod.cdi_ids)
        out.append(f"  CDI devices: {', '.join(pod.cdi_ids) or '(none)'}")
        if nodes:
            out.append(f"  device nodes: {', '.join(nodes)}")
        for name in sorted(env):
            out.append(f"  env {name}={env[name]}")
        for error in pod.errors:
            out.append(f"  PREPARE ERROR: {error}")
        out.append("")
    out.extend(_metrics_sections(runtimes, operator_port))
    return "\n".join(out)


@dataclass
class RunningPod:
    namespace: str
    name: str
    node: str
    claims: list[dict[str, Any]]
    log: list[str]
    resource_status: list[str]
    phase: str


def wait_for_running_pods(
    cluster: LocalCluster,
    runtimes: Sequence[NodeRuntime],
    *,
    expected_pods: int,
    namespaces: Sequence[str],
    timeout: float = 180,
) -> list[RunningPod]:
    """The example pods once each runs on a real node and has printed something (or time is up)."""
    by_node = {r.node.name: r for r in runtimes}
    found: dict[tuple[str, str], RunningPod] = {}
    claim_names: dict[tuple[str, str], list[str]] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for pod in cluster.get_json("pods", "--all-namespaces")["items"]:
            namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            runtime = by_node.get(pod["spec"].get("nodeName") or "")
            if runtime is None or runtime.real is None or namespace not in namespaces:
                continue
            phase = str(pod.get("status", {}).get("phase", ""))
            claim_names[(namespace, name)] = _claim_names(pod) or []
            found[(namespace, name)] = RunningPod(
                namespace=namespace,
                name=name,
                node=runtime.node.name,
                claims=[],  # read once, when the waiting is over
                log=_container_log(cluster, runtime.real, pod) if phase == "Running" else [],
                resource_status=_resource_status(pod),
                phase=phase,
            )
        if len(found) >= expected_pods and all(p.phase == "Running" and p.log for p in found.values()):
            break
        time.sleep(0.5)
    for key, running in found.items():
        running.claims = [cluster.get_json("resourceclaim", n, "-n", key[0]) for n in claim_names[key]]
    return sorted(found.values(), key=lambda p: (p.namespace, p.name))


def _container_log(cluster: LocalCluster, node: RealNode, pod: Mapping[str, Any]) -> list[str]:
    """``kubectl logs`` of the pod (the API server reaches the kubelet through the node proxy);
    should that fail, the kubelet's log files, saying so."""
    meta = pod["metadata"]
    result = cluster.kubectl("logs", "-n", meta["namespace"], meta["name"], "--all-containers", check=False)
    if result.returncode == 0:
        return result.stdout.splitlines()
    lines = [f"(kubectl logs failed: {result.stderr.strip()}; from the node's pod log folder:)"]
    for path in sorted(node.pod_logs_dir.glob(f"{meta['namespace']}_{meta['name']}_{meta['uid']}/*/*.log")):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ", 3)  # <time> <stream> <P|F> <text>, as the kubelet writes them
            lines.append(parts[3] if len(parts) == 4 else line)
    return lines


def _resource_status(pod: Mapping[str, Any]) -> list[str]:
    out = []
    for status in pod.get("status", {}).get("containerStatuses") or []:
        for entry in status.get("allocatedResourcesStatus") or []:
            for resource in entry.get("resources") or []:
                health = resource.get("health", "")
                message = f" ({resource['message']})" if resource.get("message") else ""
                out.append(f"{status['name']}: {entry['name']} {resource['resourceID']} {health}{message}")
    return out


def _no_resource_status(cluster: LocalCluster) -> str:
    release = cluster.kubernetes
    if release.gate_enabled("ResourceHealthStatus"):
        return "(none reported)"
    return (
        f"(not reported: the kubelet's ResourceHealthStatus gate is off in Kubernetes {release.minor}; "
        "the agent's metrics below still say)"
    )


def report_running(
    cluster: LocalCluster, runtimes: Sequence[NodeRuntime], pods: Sequence[RunningPod], operator_port: int
) -> str:
    out: list[str] = ["$ kubectl get resourceclaims -A"]
    out.append(cluster.kubectl("get", "resourceclaims", "--all-namespaces").stdout.rstrip())
    out.append("")
    for pod in pods:
        out.append(f"pod {pod.namespace}/{pod.name} on {pod.node} ({pod.phase}):")
        for claim in pod.claims:
            devices = ", ".join(_result_text(r) for r in _results(claim)) or "(not allocated)"
            out.append(f"  claim {claim['metadata']['name']}: {devices}")
        out.append(f"  $ kubectl logs -n {pod.namespace} {pod.name}")
        out.extend(f"  | {line}" for line in pod.log or ["(nothing yet)"])
        out.append("  allocatedResourcesStatus:")
        out.extend(f"    {line}" for line in pod.resource_status or [_no_resource_status(cluster)])
        out.append("")
    # What the CDI specs gave the containers besides what they print: variables and device files.
    for driver, command in (
        ("gpu.nvidia.com", "env | grep ^NVIDIA_; ls -l /dev/nvidia*"),
        ("tpu.google.com", "ls -l /dev/accel* /dev/vfio 2>/dev/null"),
    ):
        shown = next((p for p in pods if p.phase == "Running" and _drivers(p) == {driver}), None)
        if shown is None:
            continue
        out.append(f"$ kubectl exec -n {shown.namespace} {shown.name} -- sh -c '{command}'")
        result = cluster.kubectl(
            "exec", "-n", shown.namespace, shown.name, "--", "sh", "-c", command, check=False
        )
        out.extend(f"  | {line}" for line in (result.stdout + result.stderr).splitlines())
        out.append("")
    out.extend(shares_section(cluster, pods))
    out.append("")
    out.extend(_metrics_sections(runtimes, operator_port))
    return "\n".join(out)


def _result_text(result: Mapping[str, Any]) -> str:
    """One allocated device as the report shows it: with its share ID and consumed capacity when
    the claim holds a share of it."""
    extra = ""
    if result.get("shareID"):
        consumed = ", ".join(f"{k} {v}" for k, v in sorted((result.get("consumedCapacity") or {}).items()))
        extra = f", share {result['shareID']}" + (f", {consumed}" if consumed else "")
    return f"{result['device']} ({result['driver']}{extra})"


def shares_section(cluster: LocalCluster, pods: Sequence[RunningPod]) -> list[str]:
    """Which GPUs the running pods' claims hold together, each claim its own share of it."""
    holders: dict[tuple[str, str, str], list[str]] = {}
    for pod in pods:
        for claim in pod.claims:
            for r in _results(claim):
                if r.get("shareID"):
                    memory = (r.get("consumedCapacity") or {}).get("memory", "?")
                    holders.setdefault((r["driver"], r["pool"], r["device"]), []).append(
                        f"{pod.namespace}/{pod.name} ({memory})"
                    )
    shared = {device: who for device, who in holders.items() if len(who) > 1}
    out = ["GPU shares (consumable capacity: one GPU, a share of its memory for each claim):"]
    for (driver, pool, device), who in sorted(shared.items()):
        out.append(f"  {driver} {pool}/{device}: held by {', '.join(sorted(who))}")
    if not shared:
        if cluster.kubernetes.gate_enabled("DRAConsumableCapacity"):
            out.append("  (no GPU is held by two claims)")
        else:
            out.append(
                f"  (none: Kubernetes {cluster.kubernetes.minor} has DRAConsumableCapacity off, so the "
                "API server drops the shares' capacity and each claim gets a whole GPU)"
            )
    return out


def _results(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The claim's allocated devices; none while it is not allocated."""
    results: list[dict[str, Any]] = ((claim.get("status") or {}).get("allocation") or {}).get(
        "devices", {}
    ).get("results") or []
    return results


def _drivers(pod: RunningPod) -> set[str]:
    return {r["driver"] for claim in pod.claims for r in _results(claim)}


def _metrics_sections(runtimes: Sequence[NodeRuntime], operator_port: int) -> list[str]:
    gpu_runtime = next((r for r in runtimes if r.node.profile.startswith("h100")), runtimes[0])
    out = [f"Device health, from the agent on {gpu_runtime.node.name} (/metrics):"]
    out.extend(
        f"  {line}" for line in metrics_excerpt(gpu_runtime.metrics_port, needle="dra_agent_device_healthy")
    )
    out.append("Claims, from the operator (/metrics):")
    out.extend(f"  {line}" for line in metrics_excerpt(operator_port, needle="claims"))
    return out


def run_demo(
    *, workdir: Path, exit_after: bool, fake_nodes: bool = False, kubernetes: KubernetesVersion | None = None
) -> int:
    """The demo on a cluster of ``kubernetes`` (default: ``DRA_KUBERNETES_VERSION``, else the default)."""
    cluster = LocalCluster(workdir=workdir, kubernetes=kubernetes or resolve())
    print(
        f"Starting a local Kubernetes {cluster.kubernetes.version} control plane in {workdir} ...", flush=True
    )
    with cluster:
        print(f"Control plane ready at {cluster.server} in {cluster.timings['start_s']:.1f} s.", flush=True)
        runtimes, operator_port = start_components(cluster, workdir=workdir, fake_nodes=fake_nodes)
        profiles = ", ".join(f"{r.node.name}: {r.node.profile}" for r in runtimes)
        kind = "Node objects without a kubelet" if fake_nodes else "real nodes (kubelet + containerd)"
        print(
            f"Started {len(runtimes)} {kind}, the operator and one agent per node ({profiles}); "
            "waiting for slices ...",
            flush=True,
        )
        wait_for_slices(cluster, runtimes)
        wait_for_plugins(cluster, runtimes)
        if fake_nodes:
            examples = apply_examples(cluster)
            print(
                f"Applied {', '.join(p.name for p in examples)}; playing the kubelet for bound pods ...",
                flush=True,
            )
            expected = example_pod_count(examples)
            pods = play_kubelet(cluster, runtimes, expected_pods=expected)
            print()
            print(report(cluster, runtimes, pods, operator_port))
            failed = len(pods) < expected or any(p.errors for p in pods)
        else:
            examples = apply_examples(cluster, image=WORKLOAD_IMAGE)
            print(
                f"Applied {', '.join(p.name for p in examples)} (image: {WORKLOAD_IMAGE}); "
                "waiting for their pods to run ...",
                flush=True,
            )
            expected = example_pod_count(examples)
            namespaces = [ns for path in examples for ns in example_namespaces(path)]
            running = wait_for_running_pods(cluster, runtimes, expected_pods=expected, namespaces=namespaces)
            print()
            print(report_running(cluster, runtimes, running, operator_port))
            failed = len(running) < expected or any(p.phase != "Running" or not p.log for p in running)
        print()
        print("Use the cluster further:")
        print(f"  export KUBECONFIG={cluster.kubeconfig}")
        kubectl = cluster.binaries.kubectl if cluster.binaries else "kubectl"
        print(f"  {kubectl} get resourceslices,resourceclaims -A")
        print(f"Component logs: {cluster.logs_dir}")
        if failed:
            print("\nDEMO INCOMPLETE: not every example pod ran; see the output above.", file=sys.stderr)
        if exit_after:
            return 1 if failed else 0
        print("\nPress Ctrl-C to stop everything.", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("\nstopping")
    return 1 if failed else 0
