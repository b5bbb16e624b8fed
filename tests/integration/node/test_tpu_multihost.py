"""A multi-host TPU slice on real nodes, run the way GKE users run one: four kubelets, each with an
agent serving one host of a simulated v5p 2x2x4 slice (its own tpu-env file: WORKER_ID 0-3, one
SLICE_ID), a headless Service, and an Indexed Job of four pods whose claims take every chip of a host
of that slice. Each pod must land on its own node and see TPU_WORKER_ID = its completion index, the
same four TPU_WORKER_HOSTNAMES and the whole slice's TPU_TOPOLOGY. A second, one-pod Job on the same
slice is one host short of it: its pod runs and carries the agent's Warning Event that says so.

Real nodes are costly on a small machine: one slice, one four-pod Job, one one-pod Job.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from dra_devcluster import LocalCluster, RealNode
from dra_devcluster.images import WORKLOAD_IMAGE
from dra_node_agent.tpu.workers import SIZE_MISMATCH
from tests.integration.agent.agentproc import TPU, AgentDirs, AgentProcess, agent_kubeconfig
from tests.integration.objects import device_class

NAMESPACE = "tpu-multihost"
CLASS = "multihost-tpu"
SLICE = "v5p-slice-a"
HOSTS = 4
NODES = [f"tpu-host-{i}" for i in range(HOSTS)]
SERVICE = "workers"
SHOW_ENV = "env | grep -E '^TPU_(WORKER_ID|WORKER_HOSTNAMES|TOPOLOGY|ACCELERATOR_TYPE|HOST_BOUNDS)=' | sort"


@dataclass
class Slice:
    cluster: LocalCluster
    nodes: dict[str, RealNode]
    agents: dict[str, AgentProcess]

    def pods(self, job: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cluster.get_json(
            "pods", "-n", NAMESPACE, "-l", f"batch.kubernetes.io/job-name={job}"
        )["items"]
        return items

    def log(self, pod: dict[str, Any]) -> list[str]:
        """The container's output, from the pod-log folder of the node it runs on."""
        node = self.nodes.get(pod["spec"].get("nodeName", ""))
        if node is None:
            return []
        meta = pod["metadata"]
        lines = []
        for path in sorted(node.pod_logs_dir.glob(f"{NAMESPACE}_{meta['name']}_{meta['uid']}/main/*.log")):
            for line in path.read_text(errors="replace").splitlines():
                parts = line.split(" ", 3)  # <time> <stream> <P|F> <text>
                lines.append(parts[3] if len(parts) == 4 else line)
        return lines

    def finished_logs(self, job: str, count: int) -> list[tuple[dict[str, Any], list[str]]] | None:
        pods = self.pods(job)
        found = [(pod, self.log(pod)) for pod in pods]
        if len(found) != count or not all("done" in lines for _, lines in found):
            return None
        return found

    def wait_logs(self, job: str, count: int) -> list[tuple[dict[str, Any], list[str]]]:
        try:
            found: list[tuple[dict[str, Any], list[str]]] = self.cluster.wait_for(
                lambda: self.finished_logs(job, count),
                timeout=300,
                interval=1,
                what=f"{count} pods of Job {job} to print their TPU environment",
            )
        except TimeoutError:
            described = self.cluster.kubectl("describe", "pods", "-n", NAMESPACE, check=False).stdout
            tails = "\n".join(f"--- {n}:\n{a.log_tail(30)}" for n, a in self.agents.items())
            raise AssertionError(f"{described[-6000:]}\n{tails}") from None
        return found


def tpu_env(worker: int) -> str:
    # As Cloud TPU writes the file (KEY: 'value'), plus the slice identity this driver reads.
    return f"TOPOLOGY: '2x2x4'\nWORKER_ID: '{worker}'\nSLICE_ID: '{SLICE}'\n"


def indexed_job(name: str, *, completions: int) -> list[dict[str, Any]]:
    """A claim template taking every chip of one host of the slice, and the Indexed Job using it."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "tpu",
                            "exactly": {
                                "deviceClassName": CLASS,
                                "allocationMode": "All",
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": f'device.attributes["{TPU}"].sliceId == "{SLICE}"'
                                        }
                                    }
                                ],
                            },
                        }
                    ]
                }
            }
        },
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "completionMode": "Indexed",
            "completions": completions,
            "parallelism": completions,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": "tpu-workers"}},
                "spec": {
                    "subdomain": SERVICE,
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": WORKLOAD_IMAGE,
                            # Kept running, so every pod holds its host while the others start.
                            "command": ["sh", "-c", f"{SHOW_ENV}; echo done; sleep 3600"],
                            "resources": {"claims": [{"name": "tpu"}]},
                        }
                    ],
                    "resourceClaims": [{"name": "tpu", "resourceClaimTemplateName": name}],
                },
            },
        },
    }
    return [template, job]


@pytest.fixture(scope="module")
def tpu_slice(local_cluster: LocalCluster) -> Iterator[Slice]:
    kubeconfig = agent_kubeconfig(local_cluster)
    nodes: dict[str, RealNode] = {}
    agents: dict[str, AgentProcess] = {}
    try:
        for worker, name in enumerate(NODES):
            nodes[name] = local_cluster.add_real_node(name)
            dirs = AgentDirs.for_node(nodes[name])
            dirs.create()
            env_file = dirs.root / "tpu-env"
            env_file.write_text(tpu_env(worker))
            agents[name] = AgentProcess(
                node=name,
                dirs=dirs,
                kubeconfig=kubeconfig,
                profiles=("tpu-v5p-2x2x4",),
                extra_env={"DRA_AGENT_TPU_ENV_FILE": str(env_file)},
                wait_kubelet=True,
            )
        local_cluster.create_namespace(NAMESPACE)
        local_cluster.apply(
            [
                device_class(CLASS, driver=TPU),
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": SERVICE, "namespace": NAMESPACE},
                    "spec": {"clusterIP": "None", "selector": {"app": "tpu-workers"}},
                },
            ]
        )
        for agent in agents.values():
            agent.start()
        yield Slice(cluster=local_cluster, nodes=nodes, agents=agents)
    finally:
        # Deleted while the agents still run, so they unprepare the pods' claims.
        local_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=180s", check=False)
        for agent in agents.values():
            if agent.process is not None:
                agent.stop()
        local_cluster.kubectl("delete", "deviceclass", CLASS, "--ignore-not-found", check=False)
        for name in nodes:
            local_cluster.remove_real_node(name)


def test_an_indexed_job_gets_one_host_per_pod_and_a_consistent_worker_identity(tpu_slice: Slice) -> None:
    cluster = tpu_slice.cluster
    # Every host publishes its place in the slice, which the claims select on.
    slices = cluster.get_json("resourceslices", f"--field-selector=spec.driver={TPU}")["items"]
    published = {
        s["spec"]["nodeName"]: s["spec"]["devices"][0]["attributes"]
        for s in slices
        if s["spec"]["nodeName"] in tpu_slice.nodes
    }
    assert {n: (a["sliceId"]["string"], a["workerId"]["int"]) for n, a in published.items()} == {
        name: (SLICE, worker) for worker, name in enumerate(NODES)
    }

    cluster.apply(indexed_job("train", completions=HOSTS))
    found = tpu_slice.wait_logs("train", HOSTS)

    hostnames = {f"train-{i}.{SERVICE}" for i in range(HOSTS)}
    seen_nodes = set()
    seen_lists = set()
    for pod, lines in found:
        index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        env = dict(line.split("=", 1) for line in lines if line.startswith("TPU_"))
        where = f"pod {pod['metadata']['name']} on {pod['spec']['nodeName']}: {lines}"
        assert env["TPU_WORKER_ID"] == index, where
        assert env["TPU_TOPOLOGY"] == "2x2x4", where
        assert env["TPU_ACCELERATOR_TYPE"] == "v5p-32", where
        assert env["TPU_HOST_BOUNDS"] == "1,1,4", where
        worker_list = env["TPU_WORKER_HOSTNAMES"].split(",")
        assert len(worker_list) == HOSTS, where
        assert set(worker_list) == hostnames, where
        assert worker_list == sorted(worker_list), where  # in index order
        seen_lists.add(env["TPU_WORKER_HOSTNAMES"])
        seen_nodes.add(pod["spec"]["nodeName"])
    assert seen_nodes == set(NODES), "every pod on a host of its own"
    assert len(seen_lists) == 1, f"the same TPU_WORKER_HOSTNAMES everywhere: {seen_lists}"
    # A Job that fits its slice draws no slice Warning.
    events = cluster.get_json("events", "-n", NAMESPACE)["items"]
    assert [e for e in events if e.get("reason", "").startswith("TpuSlice")] == []
    # ... because the checks ran and found nothing: the agents read every object they needed
    # (the Job's pods and the slices, with the project's RBAC), none logged a failed read.
    for name, agent in tpu_slice.agents.items():
        failed = [line for line in agent.log_text().splitlines() if "TPU slice check" in line]
        assert failed == [], f"agent on {name}: {failed}"

    cluster.kubectl(
        "delete", "job", "train", "-n", NAMESPACE, "--cascade=foreground", "--wait=true", "--timeout=120s"
    )
    cluster.wait_for(lambda: not tpu_slice.pods("train"), timeout=120, what="the Job's pods to be gone")


def test_a_job_a_host_short_of_its_slice_runs_with_a_warning_on_its_pod(tpu_slice: Slice) -> None:
    cluster = tpu_slice.cluster
    cluster.apply(indexed_job("short", completions=1))
    [(pod, lines)] = tpu_slice.wait_logs("short", 1)
    name = pod["metadata"]["name"]
    assert "TPU_WORKER_ID=0" in lines
    assert f"TPU_WORKER_HOSTNAMES=short-0.{SERVICE}" in lines

    def warning() -> str | None:
        events = cluster.get_json("events", "-n", NAMESPACE, f"--field-selector=involvedObject.name={name}")
        return next(
            (
                e["message"]
                for e in events["items"]
                if e.get("type") == "Warning" and e.get("reason") == SIZE_MISMATCH
            ),
            None,
        )

    message: str = cluster.wait_for(warning, timeout=60, what=f"a {SIZE_MISMATCH} Event on pod {name}")
    assert f"Job {NAMESPACE}/short runs 1 workers but TPU slice {SLICE}" in message, message
    assert "has 4 hosts" in message, message
    assert f"is on node {pod['spec']['nodeName']}" in message, message
