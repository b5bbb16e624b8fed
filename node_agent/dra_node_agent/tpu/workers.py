"""The worker identity of a pod on a multi-host TPU slice, as GKE gives it, and the slice checks.

A multi-host slice runs as an Indexed Job (or a JobSet, whose child Jobs are Indexed Jobs) with one
pod per host, each claiming every chip of its host. GKE's webhook gives each such pod
``TPU_WORKER_ID`` = its completion index and ``TPU_WORKER_HOSTNAMES`` = the DNS names of all the
Job's pods in index order, ``<hostname>.<subdomain>``: the Job controller names an Indexed Job's pod
``<job>-<index>`` (a JobSet's child Job is ``<jobset>-<replicatedJob>-<jobIndex>``, hence
``<jobset>-<rjob>-<jobIndex>-<i>``), and ``spec.subdomain`` names the headless Service. This module
derives the same from the pod and its Job (pure functions; ``tpu.multihost`` reads the objects), and
says what is inconsistent between the Job and the physical slice its pods land on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dra_node_agent.claim_reader import ClaimError
from dra_node_agent.devices import TpuHostInfo

COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
JOB_NAME_LABELS: Final = ("batch.kubernetes.io/job-name", "job-name")
JOBSET_NAME: Final = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB: Final = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_JOB_INDEX: Final = "jobset.sigs.k8s.io/job-index"

# Reasons of the Warning Events on the pod.
SIZE_MISMATCH: Final = "TpuSliceSizeMismatch"
HOST_MISSING: Final = "TpuSliceHostMissing"
NOT_PINNED: Final = "TpuSliceNotPinned"

SLICE_ID_ATTRIBUTE: Final = "sliceId"
WORKER_ID_ATTRIBUTE: Final = "workerId"

_DIGITS = re.compile(r"^\d+$")
# The most hosts a real slice has: TPU7x (Ironwood), 9216 chips at 4 a host. A Job with more
# completions can be no slice's workload, and each completion would be one more hostname to hold.
MAX_SLICE_HOSTS: Final = 2304
# Linux refuses an environment entry of more than MAX_ARG_STRLEN (32 pages: 131072 bytes with its
# NUL): a longer TPU_WORKER_HOSTNAMES would fail the container's start rather than the prepare.
MAX_ENV_ENTRY_BYTES: Final = 131071
WORKER_HOSTNAMES_VAR: Final = "TPU_WORKER_HOSTNAMES"


class WorkloadError(ClaimError):
    """The pod's Job cannot give it a correct worker identity; prepare fails (the kubelet retries)."""


@dataclass(frozen=True)
class TpuWorkers:
    """The multi-host identity of one container: its worker index and every worker's hostname, in
    index order (TPU_WORKER_ID, TPU_WORKER_HOSTNAMES); derived at prepare from the pod's Job. It is
    the TPU's context of a claim (``claim_context``): prepare hands it, unread, to ``TpuEnv`` and
    ``TpuStatusData``."""

    worker_id: int
    hostnames: tuple[str, ...]


@dataclass(frozen=True)
class JobRef:
    """The Indexed Job a pod belongs to, and the pod's index in it."""

    namespace: str
    name: str
    index: int


@dataclass(frozen=True)
class SliceWorkload:
    """One pod of a multi-host workload: where it stands in its Job, and every worker's hostname."""

    namespace: str
    pod: str
    pod_uid: str
    job: str
    index: int
    completions: int
    hostnames: tuple[str, ...]
    jobset: str | None = None
    replicated_job: str | None = None
    jobset_job_index: str | None = None

    @property
    def workers(self) -> TpuWorkers:
        return TpuWorkers(worker_id=self.index, hostnames=self.hostnames)

    def describe(self) -> str:
        """``Job ns/name``, or ``JobSet ns/js (replicated job r, job index 0: Job ns/name)``."""
        job = f"Job {self.namespace}/{self.job}"
        if self.jobset is None:
            return job
        return (
            f"JobSet {self.namespace}/{self.jobset} (replicated job {self.replicated_job}, "
            f"job index {self.jobset_job_index}: {job})"
        )


@dataclass(frozen=True)
class PublishedHost:
    """A TPU host as its ResourceSlice shows it: node, physical slice and worker id."""

    node: str
    generation: str
    topology: str
    slice_id: str | None
    worker_id: int | None


@dataclass(frozen=True)
class SliceProblem:
    reason: str
    message: str


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def job_of_pod(pod: Mapping[str, Any]) -> JobRef | None:
    """The Indexed Job that owns the pod and the pod's completion index; None for any other pod.

    The Job is the controlling ownerReference of kind Job, else the job-name label; the index is
    the completion-index annotation (the label of the same name on 1.28+).
    """
    meta = _meta(pod)
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    raw_index = annotations.get(COMPLETION_INDEX, labels.get(COMPLETION_INDEX))
    if raw_index is None or not _DIGITS.fullmatch(str(raw_index)):
        return None
    name = next(
        (
            str(o.get("name"))
            for o in meta.get("ownerReferences") or []
            if o.get("kind") == "Job" and str(o.get("apiVersion", "")).startswith("batch/") and o.get("name")
        ),
        None,
    )
    name = name or next((str(labels[k]) for k in JOB_NAME_LABELS if labels.get(k)), None)
    if name is None:
        return None
    return JobRef(namespace=str(meta.get("namespace", "")), name=name, index=int(raw_index))


def slice_workload(*, pod: Mapping[str, Any], job: Mapping[str, Any], slice_hosts: int) -> SliceWorkload:
    """The pod's place in its Indexed Job and the hostnames of the Job's pods on the slice.

    The number of workers is the Job's ``spec.completions``. Each hostname is the pod's own
    ``spec.hostname`` with its index replaced (``<job>-<i>``, as the Job controller sets it; the
    Job's name when the pod's hostname does not end in its index), then ``.<spec.subdomain>``
    when the pod has one (without it the names do not resolve; GKE requires it). A tenant sizes
    the Job, so the names are bounded by the slice, not by the Job: at most ``slice_hosts`` of them
    (the hosts of the physical slice), and refused above ``MAX_SLICE_HOSTS`` completions or
    ``MAX_ENV_ENTRY_BYTES`` of names. Raises ``WorkloadError``, naming the Job, when the Job cannot
    name every worker or its pod has no host on the slice.
    """
    ref = job_of_pod(pod)
    meta = _meta(pod)
    where = f"pod {meta.get('namespace')}/{meta.get('name')}"
    if ref is None:
        raise WorkloadError(f"{where}: not a pod of an Indexed Job")
    job_spec = job.get("spec") or {}
    completions = job_spec.get("completions")
    job_name = f"Job {ref.namespace}/{ref.name}"
    if job_spec.get("completionMode") not in (None, "Indexed") or not isinstance(completions, int):
        raise WorkloadError(
            f"{where}: {job_name} is not an Indexed Job with spec.completions; "
            "its pods cannot be numbered as workers of a TPU slice"
        )
    _check_size(
        where=where, job_name=job_name, completions=completions, index=ref.index, slice_hosts=slice_hosts
    )
    spec = pod.get("spec") or {}
    hostname = str(spec.get("hostname") or "")
    suffix = f"-{ref.index}"
    prefix = (
        hostname[: -len(suffix)] if hostname.endswith(suffix) and len(hostname) > len(suffix) else ref.name
    )
    subdomain = str(spec.get("subdomain") or "")
    domain = f".{subdomain}" if subdomain else ""
    labels = meta.get("labels") or {}
    jobset = labels.get(JOBSET_NAME)
    hostnames = tuple(f"{prefix}-{i}{domain}" for i in range(min(completions, slice_hosts)))
    size = len(WORKER_HOSTNAMES_VAR) + 1 + len(",".join(hostnames).encode())
    if size > MAX_ENV_ENTRY_BYTES:
        raise WorkloadError(
            f"{where}: {job_name}'s {len(hostnames)} worker hostnames make a {WORKER_HOSTNAMES_VAR} of "
            f"{size} bytes, more than the {MAX_ENV_ENTRY_BYTES} a process's environment entry may hold; "
            "shorten the pods' hostname or subdomain"
        )
    return SliceWorkload(
        namespace=ref.namespace,
        pod=str(meta.get("name", "")),
        pod_uid=str(meta.get("uid", "")),
        job=ref.name,
        index=ref.index,
        completions=completions,
        hostnames=hostnames,
        jobset=str(jobset) if jobset else None,
        replicated_job=str(labels.get(REPLICATED_JOB, "")) or None,
        jobset_job_index=str(labels.get(JOBSET_JOB_INDEX, "")) or None,
    )


def _check_size(*, where: str, job_name: str, completions: int, index: int, slice_hosts: int) -> None:
    """Refuse a Job no slice can hold, an index outside the Job, and a pod with no host on the slice."""
    if completions > MAX_SLICE_HOSTS:
        raise WorkloadError(
            f"{where}: {job_name} has {completions} completions, more than the {MAX_SLICE_HOSTS} hosts "
            f"of the largest TPU slice: no slice holds its workers; set completions to the slice's "
            f"{slice_hosts} hosts"
        )
    if not 0 <= index < completions:
        raise WorkloadError(
            f"{where}: completion index {index} is outside {job_name}'s {completions} completions"
        )
    if index >= slice_hosts:
        raise WorkloadError(
            f"{where}: completion index {index} of {job_name} has no host on the TPU slice, which has "
            f"{slice_hosts} hosts; set the Job's completions and parallelism to {slice_hosts}"
        )


def published_hosts(slices: Iterable[Mapping[str, Any]], *, driver: str) -> list[PublishedHost]:
    """Each node's TPU host as its ResourceSlices of ``driver`` publish it (first device; v1 or v1beta1)."""
    hosts: dict[str, PublishedHost] = {}
    for item in slices:
        spec = item.get("spec") or {}
        node = spec.get("nodeName")
        if spec.get("driver") != driver or not node or node in hosts:
            continue
        for device in spec.get("devices") or []:
            attrs = (device.get("basic") or device).get("attributes") or {}

            def value(name: str, kind: str, attrs: Mapping[str, Any] = attrs) -> Any:
                entry = attrs.get(name, attrs.get(f"{driver}/{name}")) or {}
                return entry.get(kind)

            worker = value(WORKER_ID_ATTRIBUTE, "int")
            hosts[str(node)] = PublishedHost(
                node=str(node),
                generation=str(value("tpuGen", "string") or ""),
                topology=str(value("topology", "string") or ""),
                slice_id=value(SLICE_ID_ATTRIBUTE, "string"),
                worker_id=int(worker) if isinstance(worker, int) else None,
            )
            break
    return sorted(hosts.values(), key=lambda h: h.node)


def selects_slice(selectors: Sequence[str]) -> bool:
    """Whether any CEL selector of the claim looks at the slice identity attribute."""
    return any(SLICE_ID_ATTRIBUTE in expression for expression in selectors)


def slice_problems(
    *,
    workload: SliceWorkload,
    host: TpuHostInfo,
    node_name: str,
    published: Sequence[PublishedHost] | None,
    selectors: Sequence[str],
    driver: str,
) -> list[SliceProblem]:
    """What keeps the workload's pods from forming one slice, as the node preparing this pod sees it.

    - The Job's completions differ from the hosts of the slice (topology / chips per host): a host
      is left out, or a pod has no host of the slice.
    - Fewer hosts publish this physical slice (``published``, from every node's ResourceSlices)
      than it has: one is gone, so the Job cannot have all its workers on this slice.
    - Another physical slice of the same generation and topology exists and the claim's selectors
      do not name a slice: the pods can land on hosts of different slices. An agent sees only its
      own pod (it may GET, not list, pods), so this is what it can tell reliably: the placement is
      not constrained, rather than that it went wrong.
    """
    shape = f"{host.generation}-{host.slice_chips * host.cores_per_chip}, topology {host.topology}"
    slice_name = (
        f"TPU slice {host.slice_id} ({shape})"
        if host.slice_id
        else f"the TPU slice of node {node_name} ({shape})"
    )
    this_host = f"pod {workload.pod} (worker {workload.index}) is on node {node_name}"
    if host.worker_id is not None:
        this_host += f", host {host.worker_id} of the slice"
    problems: list[SliceProblem] = []
    if workload.completions != host.slice_hosts:
        verb = "leaves out a host" if workload.completions < host.slice_hosts else "has more pods than hosts"
        problems.append(
            SliceProblem(
                SIZE_MISMATCH,
                f"{workload.describe()} runs {workload.completions} workers but {slice_name} has "
                f"{host.slice_hosts} hosts: the Job {verb}, and libtpu waits for every host of the "
                f"slice; {this_host}. Set the Job's completions and parallelism to {host.slice_hosts}.",
            )
        )
    if published is None or host.slice_id is None:
        return problems
    members = [p for p in published if p.slice_id == host.slice_id]
    if len(members) < host.slice_hosts:
        known = sorted(p.worker_id for p in members if p.worker_id is not None)
        missing = sorted(set(range(host.slice_hosts)) - set(known))
        problems.append(
            SliceProblem(
                HOST_MISSING,
                f"{slice_name} has {host.slice_hosts} hosts but only {len(members)} publish it "
                f"(nodes {', '.join(p.node for p in members) or 'none'}; missing workers "
                f"{', '.join(str(m) for m in missing) or 'unknown'}): {workload.describe()} cannot "
                f"have all its workers on this slice; {this_host}.",
            )
        )
    others = sorted(
        {
            p.slice_id
            for p in published
            if p.slice_id is not None
            and p.slice_id != host.slice_id
            and p.generation == host.generation
            and p.topology == host.topology
        }
    )
    if others and not selects_slice(selectors):
        problems.append(
            SliceProblem(
                NOT_PINNED,
                f"{workload.describe()}'s claim does not select a slice (no {SLICE_ID_ATTRIBUTE} in "
                f"its selectors) and {len(others) + 1} physical slices of {shape} exist "
                f"({', '.join([host.slice_id, *others])}): its pods can land on hosts of different "
                f"slices, which never form one; {this_host}, in {slice_name}. Select on "
                f'device.attributes["{driver}"].{SLICE_ID_ATTRIBUTE}.',
            )
        )
    return problems
