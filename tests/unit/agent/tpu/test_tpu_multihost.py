"""Multi-host TPU slices at prepare: each pod's TPU_WORKER_ID and TPU_WORKER_HOSTNAMES come from its
Indexed Job or JobSet as GKE gives them, the slice-wide TPU_* variables from the host's profile, an
explicit TpuConfig wins, a single-host node keeps worker 0 of localhost, and a Job that does not fit
its slice gets a Warning Event on the pod without failing the prepare, unless the Job is sized beyond
the slice (a pod with no host on it, more completions than any slice has hosts, names too long).

The API reads (pod, Job, ResourceSlices) and the Events go through fakes of the resolver's two
protocols; the handler, the simulated hosts (fake sysfs + a tpu-env file each) and the CDI spec on
disk are the real ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent.claim_reader import ClaimAllocation, ClaimGone, driver_allocation
from dra_node_agent.prepare import PrepareHandler
from dra_node_agent.simulated.discovery import SimulatedBackend
from dra_node_agent.tpu.container_env import TpuEnv
from dra_node_agent.tpu.multihost import TpuWorkerResolver
from dra_node_agent.tpu.workers import (
    HOST_MISSING,
    NOT_PINNED,
    SIZE_MISMATCH,
    SliceWorkload,
    WorkloadError,
    slice_workload,
)

TPU = "tpu.google.com"
NS = "ml"
REF = ClaimRef(namespace=NS, name="c", uid="uid-1")
SLICE_SELECTOR = 'device.attributes["tpu.google.com"].sliceId == "slice-a"'


class Claims:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    async def read(self, ref: ClaimRef) -> ClaimAllocation:
        obj = self.objects.get(ref.name)
        if obj is None:
            raise ClaimGone(f"ResourceClaim {ref.namespace}/{ref.name}: not found")
        return driver_allocation(ref=ref, obj=obj, driver=TPU)


class Api:
    """The resolver's WorkloadSource: objects by name, and every node's ResourceSlices."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.slices: list[dict[str, Any]] = []
        self.reads: list[str] = []

    async def pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.reads.append(f"pod/{name}")
        if name not in self.pods:
            raise WorkloadError(f"reading pod {namespace}/{name} failed: 404 Not Found")
        return self.pods[name]

    async def job(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.reads.append(f"job/{name}")
        if name not in self.jobs:
            raise WorkloadError(f"reading Job {namespace}/{name} failed: 404 Not Found")
        return self.jobs[name]

    async def resource_slices(self, driver: str) -> list[Mapping[str, Any]]:
        return [s for s in self.slices if s["spec"]["driver"] == driver]


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str, str]] = []

    async def record(self, *, workload: SliceWorkload, type: str, reason: str, message: str) -> None:
        self.recorded.append((workload.pod, type, reason, message))


def tpu_env(path: Path, *, worker: int, slice_id: str = "slice-a") -> Path:
    path.write_text(f"TOPOLOGY: '2x2x4'\nWORKER_ID: '{worker}'\nSLICE_ID: '{slice_id}'\n")
    return path


def claim_obj(devices: list[str], *, pod: str, node: str, selectors: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": NS, "uid": "uid-1"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "tpu",
                        "exactly": {
                            "deviceClassName": "tpu.google.com",
                            "allocationMode": "All",
                            "selectors": [{"cel": {"expression": s}} for s in selectors],
                        },
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "tpu", "driver": TPU, "pool": node, "device": d} for d in devices]
                }
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}],
        },
    }


def indexed_job(name: str, *, completions: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"completions": completions, "parallelism": completions, "completionMode": "Indexed"},
    }


def job_pod(
    job: str, index: int, *, subdomain: str = "headless", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    name = f"{job}-{index}-abcde"
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": {"batch.kubernetes.io/job-name": job, **(labels or {})},
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "controller": True}],
        },
        "spec": {"hostname": f"{job}-{index}", "subdomain": subdomain},
    }


def published(
    node: str, *, worker: int, slice_id: str, topology: str = "2x2x4", generation: str = "v5p"
) -> dict[str, Any]:
    return {
        "spec": {
            "driver": TPU,
            "nodeName": node,
            "devices": [
                {
                    "name": "0",
                    "attributes": {
                        "tpuGen": {"string": generation},
                        "topology": {"string": topology},
                        "sliceId": {"string": slice_id},
                        "workerId": {"int": worker},
                    },
                }
            ],
        }
    }


class Host:
    def __init__(
        self, handler: PrepareHandler, claims: Claims, api: Api, events: Events, resolver: TpuWorkerResolver
    ):
        self.handler, self.claims, self.api, self.events, self.resolver = (
            handler,
            claims,
            api,
            events,
            resolver,
        )

    @property
    def devices(self) -> list[str]:
        return [d.name for d in self.handler.inventory.devices]

    async def prepare(
        self, *, pod: str, selectors: list[str] | None = None, config: list[dict[str, Any]] | None = None
    ) -> str:
        obj = claim_obj(
            self.devices, pod=pod, node=self.handler.node_name, selectors=selectors or [SLICE_SELECTOR]
        )
        if config:
            obj["status"]["allocation"]["devices"]["config"] = config
        self.claims.objects["c"] = obj
        result = (await self.handler.prepare([REF]))["uid-1"]
        await self.resolver.settle()
        return result.error

    def env(self) -> dict[str, str]:
        spec = json.loads(self.handler.cdi.spec_path("uid-1").read_text())
        return dict(item.split("=", 1) for item in spec["containerEdits"]["env"])


async def make_host(tmp_path: Path, *, profile: str, node: str, env_file: Path | None) -> Host:
    backend = SimulatedBackend(
        profile=profile, node_name=node, state_dir=tmp_path / node / "hw", driver=TPU, tpu_env_path=env_file
    )
    proc = tmp_path / node / "proc/sys/kernel/random"
    proc.mkdir(parents=True)
    (proc / "boot_id").write_text("boot-1\n")
    claims, api, events = Claims(), Api(), Events()
    resolver = TpuWorkerResolver(source=api, events=events, driver=TPU, node_name=node)
    handler = PrepareHandler(
        driver=TPU,
        node_name=node,
        inventory=await backend.discover(),
        claims=claims,
        state_dir=tmp_path / node / "state",
        cdi_dir=tmp_path / node / "cdi",
        proc_root=tmp_path / node / "proc",
        claim_context=resolver,
        vendor_env=TpuEnv(),
    )
    await handler.start()
    return Host(handler, claims, api, events, resolver)


@pytest.fixture
async def v5p(tmp_path: Path) -> Host:
    """Host 2 of the 4-host v5p slice slice-a (2x2x4), whose other three hosts publish too."""
    host = await make_host(
        tmp_path, profile="tpu-v5p-2x2x4", node="tpu-2", env_file=tpu_env(tmp_path / "tpu-env", worker=2)
    )
    host.api.slices = [published(f"tpu-{w}", worker=w, slice_id="slice-a") for w in range(4)]
    return host


async def test_an_indexed_job_pod_gets_its_index_and_every_workers_hostname(v5p: Host) -> None:
    v5p.api.jobs["train"] = indexed_job("train", completions=4)
    pod = job_pod("train", 1)
    v5p.api.pods[pod["metadata"]["name"]] = pod
    assert await v5p.prepare(pod=pod["metadata"]["name"]) == ""
    env = v5p.env()
    # The pod's completion index, not the host's tpu-env WORKER_ID (2): GKE numbers workers so.
    assert env["TPU_WORKER_ID"] == "1"
    assert (
        env["TPU_WORKER_HOSTNAMES"] == "train-0.headless,train-1.headless,train-2.headless,train-3.headless"
    )
    # The whole slice: 16 chips of 2 TensorCores, 4 hosts of 2x2x1 stacked along z.
    assert env["TPU_TOPOLOGY"] == "2x2x4"
    assert env["TPU_ACCELERATOR_TYPE"] == "v5p-32"
    assert env["TPU_HOST_BOUNDS"] == "1,1,4"
    assert env["TPU_CHIPS_PER_HOST_BOUNDS"] == "2,2,1"
    assert env["TPU_SKIP_MDS_QUERY"] == "true"
    assert v5p.api.reads == [f"pod/{pod['metadata']['name']}", "job/train"]
    assert v5p.events.recorded == []


async def test_a_jobset_pod_gets_the_hostnames_of_its_child_job(v5p: Host) -> None:
    child = "llm-workers-0"  # <jobset>-<replicatedJob>-<jobIndex>
    v5p.api.jobs[child] = indexed_job(child, completions=4)
    pod = job_pod(
        child,
        3,
        subdomain="llm",  # JobSet's default subdomain is the JobSet's name
        labels={
            "jobset.sigs.k8s.io/jobset-name": "llm",
            "jobset.sigs.k8s.io/replicatedjob-name": "workers",
            "jobset.sigs.k8s.io/job-index": "0",
        },
    )
    v5p.api.pods[pod["metadata"]["name"]] = pod
    assert await v5p.prepare(pod=pod["metadata"]["name"]) == ""
    env = v5p.env()
    assert env["TPU_WORKER_ID"] == "3"
    assert env["TPU_WORKER_HOSTNAMES"].split(",") == [f"llm-workers-0-{i}.llm" for i in range(4)]


async def test_an_explicit_tpu_config_wins_for_the_variables_it_sets(v5p: Host) -> None:
    v5p.api.jobs["train"] = indexed_job("train", completions=4)
    pod = job_pod("train", 1)
    v5p.api.pods[pod["metadata"]["name"]] = pod
    config = [
        {
            "source": "FromClaim",
            "opaque": {
                "driver": TPU,
                "parameters": {"apiVersion": "tpu.google.com/v1alpha1", "kind": "TpuConfig", "workerId": 3},
            },
        }
    ]
    assert await v5p.prepare(pod=pod["metadata"]["name"], config=config) == ""
    env = v5p.env()
    assert env["TPU_WORKER_ID"] == "3"  # the config's
    assert env["TPU_WORKER_HOSTNAMES"].startswith("train-0.headless,")  # still the Job's


async def test_a_tpu_config_with_both_fields_needs_no_lookup(v5p: Host) -> None:
    config = [
        {
            "source": "FromClaim",
            "opaque": {
                "driver": TPU,
                "parameters": {
                    "apiVersion": "tpu.google.com/v1alpha1",
                    "kind": "TpuConfig",
                    "workerId": 0,
                    "workerHostnames": ["a", "b", "c", "d"],
                },
            },
        }
    ]
    assert await v5p.prepare(pod="unknown-pod", config=config) == ""
    assert v5p.env()["TPU_WORKER_HOSTNAMES"] == "a,b,c,d"
    assert v5p.api.reads == []


async def test_a_pod_outside_an_indexed_job_keeps_the_hosts_worker_id(v5p: Host) -> None:
    v5p.api.pods["plain"] = {"metadata": {"name": "plain", "namespace": NS, "uid": "uid-plain"}, "spec": {}}
    assert await v5p.prepare(pod="plain") == ""
    env = v5p.env()
    assert env["TPU_WORKER_ID"] == "2"  # tpu-env WORKER_ID
    assert "TPU_WORKER_HOSTNAMES" not in env


async def test_a_pod_that_cannot_be_read_fails_the_prepare_and_leaves_nothing(v5p: Host) -> None:
    error = await v5p.prepare(pod="gone")
    assert "multi-host TPU worker identity" in error, error
    assert "pod ml/gone" in error, error
    assert v5p.handler.store.load() == []
    assert not v5p.handler.cdi.spec_path("uid-1").exists()


async def test_an_index_outside_the_jobs_completions_fails_the_prepare(v5p: Host) -> None:
    v5p.api.jobs["train"] = indexed_job("train", completions=2)
    pod = job_pod("train", 3)
    v5p.api.pods[pod["metadata"]["name"]] = pod
    error = await v5p.prepare(pod=pod["metadata"]["name"])
    assert "completion index 3 is outside Job ml/train's 2 completions" in error, error


async def test_a_job_with_more_workers_than_hosts_names_only_the_slices_hosts(v5p: Host) -> None:
    # M3: the tenant sizes the Job; the names stop at the slice's 4 hosts, however many it asks for.
    v5p.api.jobs["train"] = indexed_job("train", completions=6)
    pod = job_pod("train", 1)
    name = pod["metadata"]["name"]
    v5p.api.pods[name] = pod
    assert await v5p.prepare(pod=name) == ""
    assert v5p.env()["TPU_WORKER_HOSTNAMES"] == ",".join(f"train-{i}.headless" for i in range(4))
    await v5p.resolver.settle()
    [(_, _, reason, message)] = v5p.events.recorded
    assert reason == SIZE_MISMATCH
    assert "runs 6 workers but TPU slice slice-a" in message
    # A pod whose index has no host on the slice is refused, naming the Job.
    beyond = job_pod("train", 5)
    v5p.api.pods[beyond["metadata"]["name"]] = beyond
    v5p.handler.store.remove("uid-1")
    error = await v5p.prepare(pod=beyond["metadata"]["name"])
    assert "completion index 5 of Job ml/train has no host on the TPU slice, which has 4 hosts" in error


async def test_a_job_larger_than_any_slice_fails_the_prepare_naming_it(v5p: Host) -> None:
    v5p.api.jobs["huge"] = indexed_job("huge", completions=2_000_000_000)
    pod = job_pod("huge", 0)
    v5p.api.pods[pod["metadata"]["name"]] = pod
    error = await v5p.prepare(pod=pod["metadata"]["name"])
    assert (
        "Job ml/huge has 2000000000 completions, more than the 2304 hosts of the largest TPU slice" in error
    )
    assert v5p.handler.store.load() == []
    assert not v5p.handler.cdi.spec_path("uid-1").exists()


def test_worker_names_too_long_for_one_environment_entry_are_refused() -> None:
    pod = job_pod("train", 0, subdomain="s" * 63)
    pod["spec"]["hostname"] = "h" * 60 + "-0"
    with pytest.raises(
        WorkloadError, match=r"make a TPU_WORKER_HOSTNAMES of 29[0-9]{4} bytes, more than the 131071"
    ):
        slice_workload(pod=pod, job=indexed_job("train", completions=2304), slice_hosts=2304)
    assert (
        len(slice_workload(pod=pod, job=indexed_job("train", completions=2304), slice_hosts=16).hostnames)
        == 16
    )


async def test_a_single_host_node_keeps_worker_zero_of_localhost(tmp_path: Path) -> None:
    host = await make_host(tmp_path, profile="tpu-v6e-2x4", node="solo", env_file=None)
    host.api.jobs["train"] = indexed_job("train", completions=4)
    pod = job_pod("train", 1)
    host.api.pods[pod["metadata"]["name"]] = pod
    assert await host.prepare(pod=pod["metadata"]["name"]) == ""
    env = host.env()
    assert env["TPU_WORKER_ID"] == "0"
    assert env["TPU_WORKER_HOSTNAMES"] == "localhost"
    assert env["TPU_TOPOLOGY"] == "2x4"
    assert host.api.reads == []  # no lookup at all


async def test_a_job_with_fewer_workers_than_hosts_warns_on_the_pod_and_still_prepares(v5p: Host) -> None:
    v5p.api.jobs["train"] = indexed_job("train", completions=3)
    pod = job_pod("train", 0)
    name = pod["metadata"]["name"]
    v5p.api.pods[name] = pod
    assert await v5p.prepare(pod=name) == ""
    assert v5p.env()["TPU_WORKER_HOSTNAMES"].count(",") == 2
    [(on, kind, reason, message)] = v5p.events.recorded
    assert (on, kind, reason) == (name, "Warning", SIZE_MISMATCH)
    assert "Job ml/train runs 3 workers but TPU slice slice-a (v5p-32, topology 2x2x4) has 4 hosts" in message
    assert f"pod {name} (worker 0) is on node tpu-2, host 2 of the slice" in message
    # Once per pod and reason: the kubelet's retries post nothing new.
    v5p.handler.store.remove("uid-1")
    assert await v5p.prepare(pod=name) == ""
    assert len(v5p.events.recorded) == 1


async def test_a_host_missing_from_the_slice_warns_on_the_pod(v5p: Host) -> None:
    v5p.api.slices = [published(f"tpu-{w}", worker=w, slice_id="slice-a") for w in (0, 2, 3)]
    v5p.api.jobs["train"] = indexed_job("train", completions=4)
    pod = job_pod("train", 2)
    v5p.api.pods[pod["metadata"]["name"]] = pod
    assert await v5p.prepare(pod=pod["metadata"]["name"]) == ""
    [(_, _, reason, message)] = v5p.events.recorded
    assert reason == HOST_MISSING
    assert "has 4 hosts but only 3 publish it (nodes tpu-0, tpu-2, tpu-3; missing workers 1)" in message
    assert "Job ml/train cannot have all its workers on this slice" in message


async def test_a_job_whose_claims_do_not_select_a_slice_warns_when_two_slices_exist(v5p: Host) -> None:
    v5p.api.slices += [published(f"tpu-b{w}", worker=w, slice_id="slice-b") for w in range(4)]
    v5p.api.jobs["train"] = indexed_job("train", completions=4)
    pod = job_pod("train", 0)
    v5p.api.pods[pod["metadata"]["name"]] = pod
    topology_only = 'device.attributes["tpu.google.com"].topology == "2x2x4"'
    assert await v5p.prepare(pod=pod["metadata"]["name"], selectors=[topology_only]) == ""
    [(_, _, reason, message)] = v5p.events.recorded
    assert reason == NOT_PINNED
    assert "2 physical slices of v5p-32, topology 2x2x4 exist (slice-a, slice-b)" in message
    assert 'device.attributes["tpu.google.com"].sliceId' in message


async def test_a_claim_that_selects_its_slice_gets_no_warning_beside_another_slice(v5p: Host) -> None:
    v5p.api.slices += [published(f"tpu-b{w}", worker=w, slice_id="slice-b") for w in range(4)]
    v5p.api.jobs["train"] = indexed_job("train", completions=4)
    pod = job_pod("train", 0)
    v5p.api.pods[pod["metadata"]["name"]] = pod
    assert await v5p.prepare(pod=pod["metadata"]["name"]) == ""
    assert v5p.events.recorded == []


async def test_a_failing_event_sink_never_fails_the_prepare(v5p: Host) -> None:
    class Broken:
        async def record(self, **_: Any) -> None:
            raise RuntimeError("API server unreachable")

    v5p.resolver._events = Broken()
    v5p.api.jobs["train"] = indexed_job("train", completions=2)
    pod = job_pod("train", 0)
    v5p.api.pods[pod["metadata"]["name"]] = pod
    assert await v5p.prepare(pod=pod["metadata"]["name"]) == ""
    assert v5p.env()["TPU_WORKER_ID"] == "0"


async def test_a_two_host_v6e_slice(tmp_path: Path) -> None:
    env_file = tmp_path / "tpu-env"
    env_file.write_text("WORKER_ID: '1'\nSLICE_ID: 'v6e-a'\n")
    host = await make_host(tmp_path, profile="tpu-v6e-4x4", node="v6e-1", env_file=env_file)
    host.api.slices = [
        published(f"v6e-{w}", worker=w, slice_id="v6e-a", topology="4x4", generation="v6e") for w in (0, 1)
    ]
    host.api.jobs["serve"] = indexed_job("serve", completions=2)
    pod = job_pod("serve", 1, subdomain="serve-svc")
    host.api.pods[pod["metadata"]["name"]] = pod
    assert await host.prepare(pod=pod["metadata"]["name"]) == ""
    env = host.env()
    assert env["TPU_TOPOLOGY"] == "4x4"
    assert env["TPU_ACCELERATOR_TYPE"] == "v6e-16"
    assert env["TPU_HOST_BOUNDS"] == "2,1,1"
    assert env["TPU_CHIPS_PER_HOST_BOUNDS"] == "2,4,1"
    assert env["TPU_WORKER_ID"] == "1"
    assert env["TPU_WORKER_HOSTNAMES"] == "serve-0.serve-svc,serve-1.serve-svc"
    assert host.events.recorded == []
