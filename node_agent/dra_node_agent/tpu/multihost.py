"""At prepare: the worker identity of a pod on a multi-host TPU slice, and Events when its Job and
the slice do not fit together.

``TpuWorkerResolver.resolve`` runs only for a claim with every chip of a host of a multi-host slice
(a single-host slice keeps ``TPU_WORKER_ID=0``/``localhost``) whose TpuConfig does not set both
worker fields already. It GETs the claim's pod and, for a pod of an Indexed Job (a JobSet's child
Jobs are Indexed Jobs), the Job, and returns ``TpuWorkers`` from them (``tpu.workers``). The reads
use the agent's own client (kubernetes_asyncio, non-blocking, in ``tpu.workload_api``); RBAC: ``get``
on pods and jobs, which only the TPU install grants (its ``accel-dra-node-agent-tpu-workloads`` role).

What prepare does with the outcome:
- a pod that is not in an Indexed Job: the host's own identity (tpu-env WORKER_ID), as before;
- a Job that cannot number its workers (not Indexed, index out of range) or a pod or Job that
  cannot be read: the prepare fails with the reason and the kubelet retries, because the
  environment would be wrong;
- a Job whose pods do not fit the slice (``slice_problems``): the prepare succeeds with the Job's
  identity, as GKE's webhook would give it, and a Warning Event on the pod says what is wrong.
  The check (it lists the driver's ResourceSlices) and the Event run in the background: they
  never delay or fail a prepare, and a failure is only logged. Each pod gets each reason once
  (``claim_messages``: at most a few Events a pod, the rest counted).
- a Job sized beyond the slice: its worker names stop at the slice's hosts; a pod whose index has
  no host, a Job with more completions than the largest slice has hosts, or names too long for one
  environment entry fail the prepare, naming the Job (``tpu.workers``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from dra_api.aiotasks import BackgroundTasks
from dra_node_agent.claim_messages import ClaimMessageLimiter
from dra_node_agent.claim_reader import ClaimAllocation, describe
from dra_node_agent.devices import DiscoveredDevice, DiscoveredInventory, TpuHostInfo
from dra_node_agent.opaqueconfig import DriverConfig, TpuConfig
from dra_node_agent.tpu.workers import (
    PublishedHost,
    SliceWorkload,
    TpuWorkers,
    WorkloadError,
    job_of_pod,
    published_hosts,
    slice_problems,
    slice_workload,
)

logger = logging.getLogger(__name__)

CLOSE_GRACE: Final = 5.0


class WorkloadSource(Protocol):
    """The API reads the resolver needs; each raises ``WorkloadError`` when the object cannot be read."""

    async def pod(self, namespace: str, name: str) -> Mapping[str, Any]: ...

    async def job(self, namespace: str, name: str) -> Mapping[str, Any]: ...

    async def resource_slices(self, driver: str) -> list[Mapping[str, Any]]: ...


class PodEventSink(Protocol):
    """Where Warning Events about a pod go; must log rather than raise."""

    async def record(self, *, workload: SliceWorkload, type: str, reason: str, message: str) -> None: ...


class TpuWorkerResolver:
    """Worker identity for the claims of one TPU driver on this node (see the module docstring)."""

    def __init__(
        self, *, source: WorkloadSource, events: PodEventSink | None, driver: str, node_name: str
    ) -> None:
        self._source = source
        self._events = events
        self.driver = driver
        self.node_name = node_name
        # Each pod's Events (one per reason), bounded per pod and in the pods remembered.
        self._reported = ClaimMessageLimiter(kind="event")
        self._checks = BackgroundTasks()

    async def resolve(
        self,
        *,
        allocation: ClaimAllocation,
        inventory: DiscoveredInventory,
        devices: Sequence[DiscoveredDevice],
        config: DriverConfig | None,
    ) -> TpuWorkers | None:
        """The pod's worker identity, or None where the host's own applies (see the module docstring):
        the TPU's ``claim_context.ClaimContextSource``."""
        host = inventory.tpu_host
        if host is None or host.single_host or len(devices) != host.chips_on_host:
            return None
        if isinstance(config, TpuConfig) and config.worker_id is not None and config.worker_hostnames:
            return None  # an explicit TpuConfig sets both: nothing to derive
        where = describe(allocation.ref)
        if len(allocation.pods) != 1:
            # One pod per host is how a slice runs; a claim shared by pods has no one index.
            logger.info(
                "%s: reserved for %d pods; using the host's worker identity", where, len(allocation.pods)
            )
            return None
        (pod_name, pod_uid) = allocation.pods[0]
        try:
            pod = await self._source.pod(allocation.ref.namespace, pod_name)
            ref = job_of_pod(pod)
            if ref is None:
                logger.info(
                    "%s: pod %s is not in an Indexed Job; using the host's worker identity", where, pod_name
                )
                return None
            job = await self._source.job(ref.namespace, ref.name)
            workload = slice_workload(pod=pod, job=job, slice_hosts=host.slice_hosts)
        except WorkloadError as exc:
            raise WorkloadError(f"{where}: multi-host TPU worker identity: {exc}") from exc
        if workload.pod_uid and pod_uid and workload.pod_uid != pod_uid:
            raise WorkloadError(
                f"{where}: pod {pod_name} was replaced (uid {workload.pod_uid}, claim says {pod_uid})"
            )
        logger.info(
            "%s: %s worker %d of %d on node %s",
            where,
            workload.describe(),
            workload.index,
            workload.completions,
            self.node_name,
        )
        self._checks.spawn(
            self._check(workload=workload, host=host, selectors=allocation.selectors),
            name=f"tpu-slice-check-{self.driver}",
        )
        return workload.workers

    async def _check(self, *, workload: SliceWorkload, host: TpuHostInfo, selectors: Sequence[str]) -> None:
        published: list[PublishedHost] | None = None
        if host.slice_id is not None:
            try:
                published = published_hosts(
                    await self._source.resource_slices(self.driver), driver=self.driver
                )
            except Exception as exc:  # the size check still runs; the log says why the others did not
                logger.warning(
                    "TPU slice check for pod %s: cannot list ResourceSlices: %s", workload.pod, exc
                )
        problems = slice_problems(
            workload=workload,
            host=host,
            node_name=self.node_name,
            published=published,
            selectors=selectors,
            driver=self.driver,
        )
        for problem in problems:
            if not self._reported.allow(workload.pod_uid or workload.pod, problem.reason).allowed:
                continue
            logger.warning("%s: %s", problem.reason, problem.message)
            if self._events is not None:
                try:
                    await self._events.record(
                        workload=workload, type="Warning", reason=problem.reason, message=problem.message
                    )
                except Exception as exc:  # best effort, as the sink promises; never an unhandled task error
                    logger.warning("cannot post %s Event for pod %s: %s", problem.reason, workload.pod, exc)

    async def settle(self) -> None:
        """Wait for the checks started so far (tests)."""
        await self._checks.join()

    async def aclose(self, *, grace: float = CLOSE_GRACE) -> None:
        """Give running checks ``grace`` seconds, then cancel them."""
        await self._checks.drain(grace=grace)
