"""Which claim serves a pod's extended resources (KEP-5004): a Normal Event on the pod.

A pod written for the device plugin (``resources.limits: nvidia.com/gpu: 2``) on a node without
that plugin gets its devices from a ResourceClaim kube-scheduler makes at binding time and names
only in ``status.extendedResourceClaimStatus``, which ``kubectl describe pod`` does not print. Once
that claim is allocated with devices of the operator's classes, the active instance posts one
Normal ``ExtendedResourceClaim`` Event on the pod naming the claim, the resources it serves and the
devices, so ``kubectl describe pod`` and ``kubectl get events`` say where the GPUs came from.

Only an Event: the claim and the pod are kube-scheduler's and the kubelet's. Each pod is reported
once per operator instance; after a restart or failover, pods scheduled more than
:data:`REPORT_WINDOW_S` ago are not reported again (their Event was posted before), so a restart
does not post an Event for every running pod of the cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any, Protocol

from dra_operator.model.cluster import ClaimKey, ClusterModel, PodInfo, parse_time
from dra_operator.model.ownership import request_classes
from dra_operator.planner import truncate

logger = logging.getLogger(__name__)

REASON = "ExtendedResourceClaim"
REPORT_WINDOW_S = 600.0
"""Pods scheduled longer ago than this are not reported (see the module's docstring)."""


class EventPoster(Protocol):
    """What :class:`ExtendedResourceReporter` posts through: the operator's queued event sink."""

    def post(self, *, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


def _resources(pod: PodInfo) -> str:
    """``nvidia.com/gpu (container main)``, one entry per resource, containers grouped."""
    by_resource: dict[str, list[str]] = {}
    for container, resource in pod.extended_resources:
        by_resource.setdefault(resource, []).append(container)
    return ", ".join(
        f"{resource} (container{'s' if len(cs) > 1 else ''} {', '.join(cs)})"
        for resource, cs in sorted(by_resource.items())
    )


def extended_message(*, pod: PodInfo, namespace: str, claim: str, devices: list[str]) -> str:
    return truncate(
        f"extended resources {_resources(pod) or '(none listed)'} are served through DRA by "
        f"ResourceClaim {namespace}/{claim}, which kube-scheduler made for this pod: "
        f"{', '.join(devices) or 'no devices'}" + (f" on node {pod.node_name}" if pod.node_name else "")
    )


class ExtendedResourceReporter:
    """Finds pods whose extended-resource claim is allocated and not reported yet; :meth:`sweep`
    runs periodically on the active instance."""

    def __init__(self, *, model: ClusterModel, classes: Collection[str], events: EventPoster) -> None:
        self.model = model
        self.classes = set(classes)
        self.events = events
        self._reported: dict[str, str] = {}  # pod UID -> claim name

    def __len__(self) -> int:
        """How many pods are remembered as reported."""
        return len(self._reported)

    def sweep(self, *, now: float) -> int:
        """Post the Events that are due; how many were queued."""
        posted = 0
        seen: set[str] = set()
        for (namespace, name), pod in self.model.pods.items():
            if not pod.extended_claim:
                continue
            seen.add(pod.uid)
            if self._reported.get(pod.uid) == pod.extended_claim:
                continue
            scheduled = parse_time(pod.scheduled_at)
            if scheduled is not None and now - scheduled > REPORT_WINDOW_S:
                self._reported[pod.uid] = pod.extended_claim  # reported by an earlier instance
                continue
            claim = self.model.claims.get(ClaimKey(namespace, pod.extended_claim))
            allocation = claim.status.allocation if claim is not None else None
            if claim is None or allocation is None:
                continue  # kube-scheduler writes the allocation while binding: look again later
            self._reported[pod.uid] = pod.extended_claim
            if not request_classes(claim) & self.classes:
                continue  # another driver's class serves this resource
            devices = [f"{r.driver} {r.device}" for r in allocation.devices]
            message = extended_message(
                pod=pod, namespace=namespace, claim=pod.extended_claim, devices=devices
            )
            logger.info("pod %s/%s: %s", namespace, name, message)
            self.events.post(
                involved={
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": name,
                    "namespace": namespace,
                    "uid": pod.uid,
                },
                type_="Normal",
                reason=REASON,
                message=message,
            )
            posted += 1
        for uid in [u for u in self._reported if u not in seen]:
            del self._reported[uid]
        return posted
