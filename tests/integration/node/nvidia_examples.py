"""NVIDIA's sharing and passthrough examples (``manifests/examples/nvidia-sharing/``) on the real
node of a test module, as the demo applies examples: unchanged but for every container's image,
which is the local busybox image. Where a container's script runs NVIDIA's nbody sample
(``/tmp/sample --benchmark --numbodies=4226000``, which busybox lacks and whose absence would end
the container at once), the sample is replaced by ``sleep 9999``, the long-running command of
NVIDIA's other examples. Nothing else is changed.

The examples name no node: with the module's one real node, kube-scheduler puts them there. They
create namespaces of their own, removed (and their claims unprepared) when a test is done with them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from dra_devcluster import LocalCluster
from dra_devcluster.images import WORKLOAD_IMAGE
from tests.integration.node.conftest import NodeWithAgent

REPO = Path(__file__).parents[3]
EXAMPLES = REPO / "manifests" / "examples" / "nvidia-sharing"
SAMPLE = "/tmp/sample --benchmark --numbodies=4226000"
SAMPLE_STAND_IN = "sleep 9999"
GPU_CLASS = REPO / "manifests" / "base" / "deviceclass-gpu.yaml"


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc["kind"] == "Pod":
        return dict(doc["spec"])
    template = (doc.get("spec") or {}).get("template")
    return None if template is None else dict(template["spec"])


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = _pod_spec(doc)
    return [] if spec is None else list(spec.get("containers") or [])


def example_docs(name: str) -> list[dict[str, Any]]:
    """The example's objects with the demo's image and, where needed, the sample's stand-in."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text()) if d]
    for doc in docs:
        for container in _containers(doc):
            container["image"] = WORKLOAD_IMAGE
            if "args" in container:
                container["args"] = [arg.replace(SAMPLE, SAMPLE_STAND_IN) for arg in container["args"]]
    return docs


def namespaces(docs: list[dict[str, Any]]) -> list[str]:
    return [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"]


@contextmanager
def gpu_class(cluster: LocalCluster) -> Iterator[None]:
    """The project's DeviceClass ``gpu.nvidia.com`` (NVIDIA's name and selector), for the module."""
    cluster.apply(GPU_CLASS.read_text())
    try:
        yield
    finally:
        cluster.kubectl("delete", "deviceclass", "gpu.nvidia.com", "--ignore-not-found", check=False)


def remove_example(setup: NodeWithAgent, docs: list[dict[str, Any]]) -> None:
    """Delete the example's namespaces and wait until the agent unprepared their claims."""
    cluster = setup.cluster
    for namespace in namespaces(docs):
        uids = {c["metadata"]["uid"] for c in cluster.get_json("resourceclaims", "-n", namespace)["items"]}
        # Some of NVIDIA's scripts (``sleep 9999 & wait``) ignore SIGTERM as PID 1: no 30 s grace.
        cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=1", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s", check=False)
        cluster.wait_for(
            lambda uids=uids: not uids & set(setup.agent.dirs.checkpoint_claims()),
            timeout=60,
            what=f"the claims of namespace {namespace} unprepared",
        )


@contextmanager
def applied(setup: NodeWithAgent, docs: list[dict[str, Any]]) -> Iterator[None]:
    setup.cluster.apply(docs)
    try:
        yield
    finally:
        remove_example(setup, docs)


def running_pods(
    cluster: LocalCluster, namespace: str, *, count: int, timeout: float = 120
) -> list[dict[str, Any]]:
    """The namespace's pods once ``count`` of them run with every container ready."""

    def ready() -> list[dict[str, Any]] | None:
        pods: list[dict[str, Any]] = cluster.get_json("pods", "-n", namespace)["items"]
        up = [
            p
            for p in pods
            if p["status"].get("phase") == "Running"
            and all(s.get("ready") for s in p["status"].get("containerStatuses") or [{}])
        ]
        return up if len(up) == count == len(pods) else None

    try:
        found: list[dict[str, Any]] = cluster.wait_for(
            ready, timeout=timeout, what=f"{count} pods running in {namespace}"
        )
    except TimeoutError:
        described = cluster.kubectl("describe", "pods", "-n", namespace, check=False).stdout
        raise AssertionError(f"the pods of {namespace} did not all run:\n{described[-4000:]}") from None
    return found


def claim_of(cluster: LocalCluster, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's one claim (made from its template)."""
    (status,) = pod["status"]["resourceClaimStatuses"]
    namespace = pod["metadata"]["namespace"]
    claim: dict[str, Any] = cluster.get_json("resourceclaim", status["resourceClaimName"], "-n", namespace)
    return claim


def results(claim: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The claim's allocated devices by request."""
    out: dict[str, list[dict[str, Any]]] = {}
    for result in claim["status"]["allocation"]["devices"]["results"]:
        out.setdefault(result["request"], []).append(result)
    return out


def allocated_configs(claim: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The opaque parameters the allocation carries, by request (an entry naming no request, as
    kube-scheduler writes the config of a claim with one request, applies to all)."""
    names = [r["name"] for r in claim["spec"]["devices"]["requests"]]
    out: dict[str, dict[str, Any]] = {}
    for entry in claim["status"]["allocation"]["devices"].get("config") or []:
        for request in entry.get("requests") or names:
            out[request] = entry["opaque"]["parameters"]
    return out


def in_container(cluster: LocalCluster, pod: dict[str, Any], container: str, script: str) -> str:
    """What ``sh -c script`` prints in the pod's container (``kubectl exec``)."""
    meta = pod["metadata"]
    return cluster.kubectl(
        "exec", meta["name"], "-n", meta["namespace"], "-c", container, "--", "sh", "-c", script
    ).stdout


def published(setup: NodeWithAgent, driver: str) -> dict[str, dict[str, Any]]:
    """The node's devices of ``driver`` by name, each its attributes as plain values."""
    slices = setup.cluster.get_json("resourceslices", f"--field-selector=spec.nodeName={setup.node.name}")
    return {
        device["name"]: {key: next(iter(value.values())) for key, value in device["attributes"].items()}
        for s in slices["items"]
        if s["spec"]["driver"] == driver
        for device in s["spec"].get("devices") or []
    }
