"""Multi-host TPU Jobs whose pods landed on hosts of more than one physical slice: a Warning Event.

Hosts of one multi-host TPU slice publish the same ``sliceId`` (see the node agent's TPU discovery
and docs/compatibility.md, "Multi-host TPU slices"). The pods of an Indexed Job (or of one Job of a
JobSet) running such a slice must all be on hosts of one slice: libtpu on hosts of two slices never
forms one, and the workers wait for each other until the Job's deadline. kube-scheduler places each
pod's claim on its own, so a claim template that does not select on ``sliceId`` can spread a Job
across slices.

The node agent cannot see this (it reads only the pod it prepares); the operator's model has every
pod, claim and slice. :meth:`MixedSliceReporter.sweep` groups bound pods by Job, maps each pod's
allocated TPU devices to their ``sliceId`` and, when a Job spans more than one, posts one Warning
``TpuSliceMixed`` Event on each of its pods, naming which workers are on which slice and node.
Only Events: pods and claims are not the operator's to change. Each pod is reported once per
operator instance.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dra_operator.model.cluster import ClaimKey, ClusterModel, PodInfo
from dra_operator.planner import truncate
from dra_operator.reporters.extended import EventPoster

logger = logging.getLogger(__name__)

REASON = "TpuSliceMixed"
SLICE_ID = "sliceId"


def _slice_ids(model: ClusterModel, *, driver: str) -> dict[tuple[str, str], str]:
    """(pool, device) -> the device's ``sliceId``, for ``driver``'s devices that publish one."""
    out: dict[tuple[str, str], str] = {}
    qualified = f"{driver}/{SLICE_ID}"
    for s in model.slices.values():
        if s.driver != driver:
            continue
        for device in s.devices:
            value = device.attributes.get(SLICE_ID, device.attributes.get(qualified))
            if isinstance(value, str):
                out[(s.pool.name, device.name)] = value
    return out


def _worker(name: str, pod: PodInfo) -> str:
    return f"worker {pod.completion_index}" if pod.completion_index is not None else f"pod {name}"


def mixed_message(*, namespace: str, job: str, by_slice: Mapping[str, list[tuple[str, PodInfo]]]) -> str:
    parts = []
    for slice_id, members in sorted(by_slice.items()):
        members = sorted(
            members, key=lambda m: (m[1].completion_index is None, m[1].completion_index or 0, m[0])
        )
        workers = ", ".join(_worker(name, pod) for name, pod in members)
        nodes = ", ".join(sorted({pod.node_name for _, pod in members}))
        parts.append(f"{workers} on slice {slice_id} (nodes {nodes})")
    return truncate(
        f"the pods of Job {namespace}/{job} are on hosts of {len(by_slice)} physical TPU slices: "
        f"{'; '.join(parts)}. Hosts of different slices never form one, so the workers wait for each "
        f"other; delete the Job and select on device.attributes[...].{SLICE_ID} in its claim template."
    )


class MixedSliceReporter:
    """Runs on the active instance; see the module docstring."""

    def __init__(self, *, model: ClusterModel, driver: str, events: EventPoster) -> None:
        self.model = model
        self.driver = driver
        self.events = events
        self._reported: set[str] = set()  # pod UIDs

    def __len__(self) -> int:
        return len(self._reported)

    def sweep(self) -> int:
        """Post the Events that are due; how many were queued."""
        jobs: dict[tuple[str, str], list[tuple[str, PodInfo]]] = {}
        for (namespace, name), pod in self.model.pods.items():
            if pod.job and pod.node_name and not pod.deleting:
                jobs.setdefault((namespace, pod.job), []).append((name, pod))
        live = {pod.uid for pods in jobs.values() for _, pod in pods}
        self._reported &= live
        slice_ids: dict[tuple[str, str], str] | None = None
        posted = 0
        for (namespace, job), pods in jobs.items():
            if len(pods) < 2:
                continue
            if slice_ids is None:
                slice_ids = _slice_ids(self.model, driver=self.driver)
                if not slice_ids:
                    return 0  # no multi-host slice in the cluster
            by_slice: dict[str, list[tuple[str, PodInfo]]] = {}
            for name, pod in pods:
                for slice_id in self._slices_of(namespace, pod, slice_ids):
                    by_slice.setdefault(slice_id, []).append((name, pod))
            if len(by_slice) < 2:
                continue
            message = mixed_message(namespace=namespace, job=job, by_slice=by_slice)
            for name, pod in pods:
                if pod.uid in self._reported:
                    continue
                self._reported.add(pod.uid)
                logger.warning("pod %s/%s: %s", namespace, name, message)
                involved: dict[str, Any] = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": name,
                    "namespace": namespace,
                    "uid": pod.uid,
                }
                self.events.post(involved=involved, type_="Warning", reason=REASON, message=message)
                posted += 1
        return posted

    def _slices_of(self, namespace: str, pod: PodInfo, slice_ids: Mapping[tuple[str, str], str]) -> set[str]:
        found = set()
        for claim_name in pod.claims:
            claim = self.model.claims.get(ClaimKey(namespace, claim_name))
            allocation = claim.status.allocation if claim is not None else None
            if allocation is None:
                continue
            for result in allocation.devices:
                if result.driver == self.driver:
                    slice_id = slice_ids.get((result.pool, result.device))
                    if slice_id is not None:
                        found.add(slice_id)
        return found
