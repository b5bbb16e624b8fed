"""The simulated overlay installed for real: the product image on a real node, `crds/` and
`manifests/overlays/simulated` applied with kubectl, the operator and the agent running as pods
under their ServiceAccounts, the agent registered with the node's kubelet through the hostPath
plugin folders, NVIDIA's quickstart example running on what it published, and a killed agent
container restarted by its liveness and startup probes.

What differs from an install on a kind or cloud cluster is only what this local cluster lacks,
patched onto the rendered objects (``localnode.adapt``, which says what and why).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_devcluster import LocalCluster, RealNode
from dra_devcluster.images import WORKLOAD_IMAGE, ImageArchive
from dra_devcluster.productimage import ensure_product_image, ensure_product_image_of
from tests.integration.deploy.localnode import LocalNode, adapt
from tests.integration.pace import let_pass
from tests.unit.deploy.render import CRDS_DIR, EXAMPLES_DIR, NAMESPACE, REPO_ROOT, overlay_dir

pytestmark = pytest.mark.cluster

NODE = "ov-1"
AGENT = "accel-dra-node-agent"
OPERATOR = "accel-dra-operator"
EXAMPLE_NS = "gpu-test1"
# The release the agent is rolled back to and forward from (N16): the last one whose checkpoint
# had no ``dynamicMIG``/``migUUID`` fields, built from its commit by today's image builder.
PREVIOUS_RELEASE = "7305f7dbb79ba8e43f42ca148a373182a44e53e7"
WORKLOAD_NS = "overlay-workload"


@dataclass
class Install:
    cluster: LocalCluster
    node: RealNode
    objects: list[dict[str, Any]]
    state: Path  # the agent's state folder on the host

    def pods(self, name: str) -> list[dict[str, Any]]:
        found = self.cluster.get_json("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name={name}")
        return [p for p in found["items"] if not p["metadata"].get("deletionTimestamp")]

    def ready_pod(self, name: str, *, timeout: float = 180) -> dict[str, Any]:
        return self.ready_pods(name, count=1, timeout=timeout)[0]

    def ready_pods(self, name: str, *, count: int, timeout: float = 180) -> list[dict[str, Any]]:
        """At least ``count`` ready pods of the workload ``name``."""

        def ready() -> list[dict[str, Any]] | None:
            found = [
                pod
                for pod in self.pods(name)
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in pod.get("status", {}).get("conditions") or []
                )
            ]
            return found if len(found) >= count else None

        try:
            pods: list[dict[str, Any]] = self.cluster.wait_for(
                ready, timeout=timeout, interval=1, what=f"{count} ready {name} pod(s)"
            )
            return pods
        except TimeoutError:
            described = self.cluster.kubectl(
                "describe", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name={name}", check=False
            ).stdout
            raise AssertionError(
                f"fewer than {count} ready {name} pods:\n{described[-4000:]}\n{self.container_log(name)}"
            ) from None

    def container_log(self, name: str) -> str:
        """The latest log of the pods' containers, from the node's pod-log folder."""
        texts = []
        for path in sorted(self.node.pod_logs_dir.glob(f"{NAMESPACE}_{name}-*/*/*.log")):
            texts.append(
                f"--- {path.relative_to(self.node.pod_logs_dir)}\n" + path.read_text(errors="replace")[-3000:]
            )
        return "\n".join(texts)


@pytest.fixture(scope="module")
def install(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    cluster = local_cluster
    image = ensure_product_image(source=REPO_ROOT)
    node = cluster.add_real_node(NODE)
    objects = [
        d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(overlay_dir("simulated"))).stdout) if d
    ]
    state = tmp_path_factory.mktemp("agent-state")
    adapt(objects, LocalNode.of(node, cluster, state_dir=str(state)))
    try:
        node.import_images([ImageArchive(name=image.reference, path=image.path)])
        cluster.kubectl("apply", "-k", str(CRDS_DIR))
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", "crd/clusterkopfpeerings.kopf.dev"
        )
        cluster.apply(objects)
        yield Install(cluster=cluster, node=node, objects=objects, state=state)
    finally:
        waited = ("--ignore-not-found", "--wait=true", "--timeout=120s")
        cluster.kubectl("delete", "namespace", EXAMPLE_NS, *waited, check=False)
        listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
        cluster.kubectl("delete", "-f", "-", *waited, input=listed, check=False)
        cluster.kubectl("delete", "-k", str(CRDS_DIR), "--ignore-not-found", check=False)
        mine = f"--field-selector=spec.nodeName={NODE}"
        cluster.kubectl("delete", "resourceslices", mine, "--ignore-not-found", check=False)
        cluster.remove_real_node(NODE)


def checkpoint_claims(path: Path) -> dict[str, Any]:
    claims: dict[str, Any] = json.loads(path.read_text())["data"]["preparedClaims"]
    return claims


def node_slices(install: Install) -> dict[str, int]:
    """driver -> devices published for the test's node."""
    found = install.cluster.get_json("resourceslices", f"--field-selector=spec.nodeName={NODE}")["items"]
    counts: dict[str, int] = {}
    for item in found:
        driver = item["spec"]["driver"]
        counts[driver] = counts.get(driver, 0) + len(item["spec"].get("devices") or [])
    return counts


def test_operator_and_agent_run_as_pods_under_their_service_accounts(install: Install) -> None:
    agent = install.ready_pod(AGENT)
    operators = install.ready_pods(OPERATOR, count=2)  # the shipped two replicas, one active
    assert agent["spec"]["serviceAccountName"] == AGENT
    assert {o["spec"]["serviceAccountName"] for o in operators} == {OPERATOR}
    assert agent["spec"]["nodeName"] == NODE
    # On the pod network, as shipped: each pod has an address of its own on the node's bridge.
    for pod in [agent, *operators]:
        assert not pod["spec"].get("hostNetwork"), pod["metadata"]["name"]
        assert pod["status"]["podIP"].startswith(install.node.gateway.rsplit(".", 1)[0] + "."), pod["status"]

    # The agent published through the node-scoped admission policy, with the kubelet-issued token.
    def both_published() -> dict[str, int] | None:
        counts = node_slices(install)
        return counts if {"gpu.nvidia.com", "tpu.google.com"} <= set(counts) else None

    counts = install.cluster.wait_for(both_published, timeout=60, what="the agent pod's ResourceSlices")
    assert counts == {"gpu.nvidia.com": 8, "tpu.google.com": 8}, counts
    # Ready only once the kubelet registered both drivers (its readiness probe says so).
    registered = {p.name for p in install.node.registry_dir.iterdir() if p.name.endswith("-reg.sock")}
    assert any(name.startswith("gpu.nvidia.com") for name in registered), registered
    assert any(name.startswith("tpu.google.com") for name in registered), registered
    # The operator put the DeviceClasses in place.
    classes = install.cluster.get_json(
        "deviceclasses", "-l", "app.kubernetes.io/managed-by=accel-dra-operator"
    )
    assert {c["metadata"]["name"] for c in classes["items"]} >= {"gpu.nvidia.com", "tpu.google.com"}
    # Kopf's watches reached the API server where the pod's service variables say, at the first try.
    for operator in operators:
        name = operator["metadata"]["name"]
        text = "".join(
            p.read_text(errors="replace")
            for p in install.node.pod_logs_dir.glob(f"{NAMESPACE}_{name}_*/*/*.log")
        )
        assert "dra_operator.entry.runner: starting" in text, text[-3000:]
        assert "failed; will retry" not in text, text[-3000:]


def run_example(install: Install) -> list[str]:
    """NVIDIA's gpu-test1 with the local image, pinned to the node; returns its pods' logs."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES_DIR / "nvidia-gpu-test1.yaml").read_text()) if d]
    pods = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        if doc["kind"] == "Pod":
            doc["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
            for container in doc["spec"]["containers"]:
                container["image"] = WORKLOAD_IMAGE
            pods.append(doc["metadata"]["name"])
        install.cluster.apply([doc])
    logs = []
    for pod in pods:

        def running(pod: str = pod) -> str | None:
            status = install.cluster.get_json("pod", pod, "-n", EXAMPLE_NS).get("status") or {}
            return status.get("phase") if status.get("phase") == "Running" else None

        install.cluster.wait_for(running, timeout=120, what=f"example pod {pod} running")
        paths = sorted(install.node.pod_logs_dir.glob(f"{EXAMPLE_NS}_{pod}_*/ctr/*.log"))
        logs.append("\n".join(p.read_text(errors="replace") for p in paths))
    return logs


def test_the_quickstart_example_runs_on_the_devices_the_agent_pod_published(install: Install) -> None:
    install.ready_pod(AGENT)
    run_example(install)
    claims = install.cluster.get_json("resourceclaims", "-n", EXAMPLE_NS)["items"]
    assert len(claims) == 2
    devices = {r["device"] for c in claims for r in c["status"]["allocation"]["devices"]["results"]}
    assert len(devices) == 2, "each pod has a GPU of its own"
    # The agent pod prepared them: its checkpoint (on the host) records both claims as completed.
    recorded = checkpoint_claims(install.state / "gpu.nvidia.com" / "checkpoint.json")
    assert {c["metadata"]["uid"] for c in claims} <= set(recorded)
    # And wrote each claim's device status with its pod's token, through the admission policy that
    # confines it to the claims of its node (on every release; 1.36+ checks it itself as well).
    install.cluster.wait_for(
        lambda: all(
            any(d["driver"] == "gpu.nvidia.com" for d in (c.get("status") or {}).get("devices") or [])
            for c in install.cluster.get_json("resourceclaims", "-n", EXAMPLE_NS)["items"]
        ),
        timeout=60,
        what="the agent pod's status.devices entries in both claims",
    )
    install.cluster.kubectl("delete", "namespace", EXAMPLE_NS, "--wait=true", "--timeout=120s")


def test_a_killed_agent_container_is_restarted_and_registers_again(install: Install) -> None:
    pod = install.ready_pod(AGENT)
    (status,) = pod["status"]["containerStatuses"]
    restarts = int(status["restartCount"])
    container_id = status["containerID"].split("://", 1)[1]
    install.node.kill_container(container_id)

    def restarted() -> dict[str, Any] | None:
        for current in install.pods(AGENT):
            statuses = current.get("status", {}).get("containerStatuses") or []
            if statuses and int(statuses[0]["restartCount"]) > restarts and statuses[0].get("ready"):
                return current
        return None

    install.cluster.wait_for(
        restarted, timeout=180, interval=1, what="the agent container restarted and ready"
    )
    # Registered again: a new example's claims are prepared by the restarted agent.
    run_example(install)
    install.cluster.kubectl("delete", "namespace", EXAMPLE_NS, "--wait=true", "--timeout=120s")


def gpu_workload(name: str) -> list[dict[str, Any]]:
    """A claim template and a pod holding one GPU on the test's node."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": WORKLOAD_NS},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOAD_NS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": WORKLOAD_IMAGE,
                    "command": ["sh", "-c", "echo up; sleep 3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
        },
    }
    return [template, pod]


def workload_image(install: Install, kind: str) -> str:
    (workload,) = [o for o in install.objects if o["kind"] == kind]
    return str(workload["spec"]["template"]["spec"]["containers"][0]["image"])


def new_version(install: Install, kind: str, image: str) -> dict[str, Any]:
    """The installed workload of ``kind`` with ``image``."""
    (workload,) = [o for o in install.objects if o["kind"] == kind]
    workload["spec"]["template"]["spec"]["containers"][0]["image"] = image
    return workload


def roll_agent(install: Install, *, image: str) -> str:
    """Roll the agent DaemonSet to ``image`` and wait until the rollout is done; returns the new pod
    (the shipped maxSurge 1 starts it beside the old one, which then stops)."""
    daemonset = new_version(install, "DaemonSet", image)
    before = {p["metadata"]["name"] for p in install.pods(AGENT)}
    install.cluster.apply([daemonset])
    install.cluster.kubectl("rollout", "status", f"daemonset/{AGENT}", "-n", NAMESPACE, "--timeout=180s")

    def only_new() -> str | None:
        pods = install.pods(AGENT)
        if len(pods) != 1 or pods[0]["metadata"]["name"] in before:
            return None
        # The spec's image: the runtime reports one of the references of the (same) content.
        if pods[0]["spec"]["containers"][0]["image"] != image:
            return None
        (status,) = pods[0].get("status", {}).get("containerStatuses") or [{}]
        return str(pods[0]["metadata"]["name"]) if status.get("ready") else None

    return str(install.cluster.wait_for(only_new, timeout=120, what=f"one agent pod, ready, running {image}"))


def slices_of_node(install: Install) -> list[tuple[str, str, int, str]]:
    """(name, uid, pool generation, devices as JSON) of the node's slices."""
    found = install.cluster.get_json("resourceslices", f"--field-selector=spec.nodeName={NODE}")["items"]
    return sorted(
        (
            s["metadata"]["name"],
            s["metadata"]["uid"],
            int(s["spec"]["pool"]["generation"]),
            json.dumps(s["spec"].get("devices"), sort_keys=True),
        )
        for s in found
    )


def test_rolling_the_agent_to_the_previous_release_and_back_keeps_a_running_claim(install: Install) -> None:
    """N11/N16 as pods: a GPU pod runs through a downgrade of the agent DaemonSet to the previous
    release's image and the upgrade back (the shipped maxSurge 1 update); each agent takes the
    other's checkpoint over, the slices are updated in place (same names and UIDs) and end as they
    were, and the last agent unprepares the claim when the pod goes."""
    cluster = install.cluster
    install.ready_pod(AGENT)
    current = workload_image(install, "DaemonSet")
    previous = ensure_product_image_of(PREVIOUS_RELEASE)
    assert previous.name != current
    install.node.import_images([ImageArchive(name=previous.reference, path=previous.path)])
    cluster.create_namespace(WORKLOAD_NS)
    try:
        cluster.apply(gpu_workload("held"))
        cluster.wait_for(
            lambda: (
                (cluster.get_json("pod", "held", "-n", WORKLOAD_NS).get("status") or {}).get("phase")
                == "Running"
            ),
            timeout=120,
            what="the GPU pod running",
        )
        claim = next(
            c
            for c in cluster.get_json("resourceclaims", "-n", WORKLOAD_NS)["items"]
            if c["metadata"]["name"].startswith("held")
        )
        uid = claim["metadata"]["uid"]
        checkpoint = install.state / "gpu.nvidia.com" / "checkpoint.json"
        assert checkpoint_claims(checkpoint)[uid]["state"] == "PrepareCompleted"
        slices = slices_of_node(install)

        for image in (previous.name, current):
            roll_agent(install, image=image)
            pod = cluster.get_json("pod", "held", "-n", WORKLOAD_NS)
            assert pod["status"]["phase"] == "Running"
            assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
            assert checkpoint_claims(checkpoint)[uid]["state"] == "PrepareCompleted"
            now = slices_of_node(install)
            # Updated in place, never recreated: the scheduler never sees the node's devices vanish.
            assert [(n, u) for n, u, _, _ in now] == [(n, u) for n, u, _, _ in slices], "slices recreated"
        # Back on the current release: the same devices as before the downgrade. (The previous
        # release publishes its own attributes; each version rewrites the slices to its own.) Ready
        # means both drivers registered with the kubelet; each driver's slice is rewritten on its
        # own schedule, so the TPU slice may still be the previous release's for a moment.
        wanted = [d for *_, d in slices]
        cluster.wait_for(
            lambda: [d for *_, d in slices_of_node(install)] == wanted,
            timeout=60,
            what="the current release's devices in the node's slices",
        )
        assert [d for *_, d in slices_of_node(install)] == wanted

        cluster.kubectl("delete", "pod", "held", "-n", WORKLOAD_NS, "--wait=true", "--timeout=60s")
        cluster.wait_for(
            lambda: uid not in checkpoint_claims(checkpoint), timeout=60, what="the claim unprepared"
        )
        assert not list(install.node.cdi_dir.glob(f"*{uid}*")), "the claim's CDI spec was left behind"
    finally:
        cluster.kubectl(
            "delete",
            "namespace",
            WORKLOAD_NS,
            "--wait=true",
            "--timeout=120s",
            "--ignore-not-found",
            check=False,
        )


def gpu_claim(name: str) -> dict[str, Any]:
    """A standalone claim (no pod): the operator allocates it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": WORKLOAD_NS},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
    }


def last_peering_state(log: str) -> str | None:
    """ "active" or "standby": what an operator instance's log last said it was."""
    said = {
        "active": log.rfind("this instance is now active"),
        "standby": max(log.rfind("this instance is now standby"), log.rfind("stepped down")),
    }
    state, at = max(said.items(), key=lambda item: item[1])
    return state if at >= 0 else None


def test_rolling_the_operator_while_claims_arrive_allocates_each_once(install: Install) -> None:
    """O8 as pods: the operator Deployment's two replicas roll to another image (the shipped maxSurge
    1, maxUnavailable 0: new pods start one at a time beside the old ones, and the active one hands
    over on SIGTERM) while standalone claims are being created; every claim that fits is allocated,
    on a device of its own, and the rest wait."""
    cluster = install.cluster
    install.ready_pods(OPERATOR, count=2)
    current = workload_image(install, "Deployment")
    image = f"{current}-next"
    install.node.tag_image(f"docker.io/library/{current}", f"docker.io/library/{image}")
    deployment = new_version(install, "Deployment", image)
    cluster.create_namespace(WORKLOAD_NS)
    names = [f"claim-{i}" for i in range(10)]  # the node has 8 GPUs
    errors: list[BaseException] = []

    def create() -> None:
        try:
            for name in names:
                cluster.apply([gpu_claim(name)])
                time.sleep(0.5)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    # The kubelet removes a deleted pod's log folder: the old operator's words are kept as they come.
    kept: dict[Path, str] = {}
    rolled = threading.Event()

    def keep_logs() -> None:
        while not rolled.wait(0.2):
            for path in install.node.pod_logs_dir.glob(f"{NAMESPACE}_{OPERATOR}-*/*/*.log"):
                try:
                    kept[path] = path.read_text(errors="replace")
                except OSError:
                    continue  # removed meanwhile

    creator = threading.Thread(target=create)
    keeper = threading.Thread(target=keep_logs)
    try:
        keeper.start()
        creator.start()
        time.sleep(1)
        cluster.apply([deployment])
        cluster.kubectl("rollout", "status", f"deployment/{OPERATOR}", "-n", NAMESPACE, "--timeout=180s")
        creator.join(timeout=60)
        assert not errors, errors

        def allocated() -> dict[str, list[str]] | None:
            claims = cluster.get_json("resourceclaims", "-n", WORKLOAD_NS)["items"]
            held = {
                c["metadata"]["name"]: [r["device"] for r in c["status"]["allocation"]["devices"]["results"]]
                for c in claims
                if (c.get("status") or {}).get("allocation")
            }
            return held if len(claims) == len(names) and len(held) == 8 else None

        held = cluster.wait_for(allocated, timeout=120, what="8 of the 10 claims allocated")
        devices = [d for results in held.values() for d in results]
        assert all(len(results) == 1 for results in held.values()), held
        assert len(set(devices)) == 8, f"a device was allocated twice: {held}"
        let_pass(5)  # the two that do not fit stay unallocated
        assert allocated() == held
        operators = install.pods(OPERATOR)
        assert len(operators) == 2, [o["metadata"]["name"] for o in operators]
        assert {o["spec"]["containers"][0]["image"] for o in operators} == {image}
        # The old active instance handed over on SIGTERM; of the two new ones, one took over.
        rolled.set()
        keeper.join(timeout=10)
        logs = "\n".join(kept.values())
        assert "handing over to the standby" in logs, logs[-3000:]
        new_logs = {
            o["metadata"]["name"]: "\n".join(
                p.read_text(errors="replace")
                for p in install.node.pod_logs_dir.glob(f"{NAMESPACE}_{o['metadata']['name']}_*/*/*.log")
            )
            for o in operators
        }
        # A new pod with a higher (random) peering priority takes over from a lower one, so both may
        # have been active for a while; at the end exactly one is.
        active = [name for name, text in new_logs.items() if last_peering_state(text) == "active"]
        assert len(active) == 1, {name: text[-2000:] for name, text in new_logs.items()}
    finally:
        rolled.set()
        creator.join(timeout=60)
        cluster.kubectl(
            "delete",
            "namespace",
            WORKLOAD_NS,
            "--wait=true",
            "--timeout=120s",
            "--ignore-not-found",
            check=False,
        )
