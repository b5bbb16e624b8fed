"""The one-command demo: the real control plane, the operator, one agent per node, and the examples.

Two GPU nodes (8 simulated H100 each) and one TPU node (v6e 2x4). The operator and the agents run
as local processes in simulated mode; this module plays the kubelet for every pod the scheduler
binds (registration, then NodePrepareResources over the agents' real unix sockets) and prints what
a user wants to see: claims, their devices and nodes, the environment each container would get
from the CDI specs, and device-health metrics.

It lives in ``dra_api`` because it is shared tooling; it starts the operator and the agents through
their console entry points and never imports them.
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

from dra_api.kubeletapi.model import ClaimRef
from dra_api.localcluster.cluster import LocalCluster, free_port
from dra_api.localcluster.kubelet import KubeletClientError, KubeletPluginClient


@dataclass(frozen=True)
class DemoNode:
    name: str
    profile: str
    labels: Mapping[str, str]


DEMO_NODES: tuple[DemoNode, ...] = (
    DemoNode("gpu-node-1", "h100-80gb-x8", {"nvidia.com/gpu.present": "true"}),
    DemoNode("gpu-node-2", "h100-80gb-x8", {"nvidia.com/gpu.present": "true"}),
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

    @property
    def registry_dir(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.root / "plugins"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"


@dataclass
class PreparedPod:
    namespace: str
    name: str
    node: str
    claims: list[dict[str, Any]] = field(default_factory=list)
    cdi_ids: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def _console_script(name: str) -> str:
    # The scripts sit next to the interpreter of the environment the project is installed in.
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def start_components(cluster: LocalCluster, *, workdir: Path) -> tuple[list[NodeRuntime], int]:
    """Create the nodes and start the operator and one agent per node; returns runtimes and the
    operator's metrics port."""
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
        ],
    )
    for node in DEMO_NODES:
        cluster.add_node(node.name, labels=node.labels)
        runtime = NodeRuntime(node=node, root=workdir / "nodes" / node.name, metrics_port=free_port())
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


def apply_examples(cluster: LocalCluster) -> list[Path]:
    examples = sorted((repo_root() / "manifests" / "examples").glob("*.yaml"))
    if not examples:
        raise FileNotFoundError(f"no examples under {repo_root() / 'manifests' / 'examples'}")
    for path in examples:
        cluster.kubectl("apply", "-f", str(path))
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
            devices = ", ".join(f"{r['device']} ({r['driver']})" for r in results)
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
    gpu_runtime = next((r for r in runtimes if r.node.profile.startswith("h100")), runtimes[0])
    out.append(f"Device health, from the agent on {gpu_runtime.node.name} (/metrics):")
    out.extend(
        f"  {line}" for line in metrics_excerpt(gpu_runtime.metrics_port, needle="dra_agent_device_healthy")
    )
    out.append("Claims, from the operator (/metrics):")
    out.extend(f"  {line}" for line in metrics_excerpt(operator_port, needle="claims"))
    return "\n".join(out)


def run_demo(*, workdir: Path, exit_after: bool) -> int:
    print(f"Starting a local Kubernetes control plane in {workdir} ...", flush=True)
    with LocalCluster(workdir=workdir) as cluster:
        print(f"Control plane ready at {cluster.server} in {cluster.timings['start_s']:.1f} s.", flush=True)
        runtimes, operator_port = start_components(cluster, workdir=workdir)
        profiles = ", ".join(f"{r.node.name}: {r.node.profile}" for r in runtimes)
        print(
            f"Started the operator and {len(runtimes)} node agents ({profiles}); waiting for slices ...",
            flush=True,
        )
        wait_for_slices(cluster, runtimes)
        wait_for_plugins(cluster, runtimes)
        examples = apply_examples(cluster)
        print(
            f"Applied {', '.join(p.name for p in examples)}; playing the kubelet for bound pods ...",
            flush=True,
        )
        pods = play_kubelet(cluster, runtimes, expected_pods=3)
        print()
        print(report(cluster, runtimes, pods, operator_port))
        print()
        print("Use the cluster further:")
        print(f"  export KUBECONFIG={cluster.kubeconfig}")
        kubectl = cluster.binaries.kubectl if cluster.binaries else "kubectl"
        print(f"  {kubectl} get resourceslices,resourceclaims -A")
        print(f"Component logs: {cluster.logs_dir}")
        failed = len(pods) < 3 or any(p.errors for p in pods)
        if failed:
            print(f"\nDEMO INCOMPLETE: {len(pods)} of 3 pods prepared; see the logs above.", file=sys.stderr)
        if exit_after:
            return 1 if failed else 0
        print("\nPress Ctrl-C to stop everything.", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("\nstopping")
    return 1 if failed else 0
