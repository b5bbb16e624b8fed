"""The cluster as ``kubectl dra`` sees it: one list per kind, parsed into the typed model.

:func:`fetch` reads DeviceClasses, ResourceSlices and ResourceClaims (in the served resource.k8s.io
version), Nodes and Pods, each with one (paged) list, cluster-wide. :meth:`ClusterObjects.from_lists`
turns those lists into typed objects; objects the model cannot parse are left out with a warning.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_api.kube import make_api_client, preferred_resource_version
from dra_api.model import DeviceClass, ModelError, Node, NodeSelector, ResourceClaim, ResourceSlice
from dra_api.names import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from dra_operator.kubeapi import KubeApi
from dra_operator.reconcile.status import CONDITION_ANNOTATION

POD_CLAIM_STATUSES = "resourceClaimStatuses"


@dataclass(frozen=True, slots=True)
class ClaimObject:
    """A claim and what the typed model does not keep of it."""

    claim: ResourceClaim
    created: str = ""
    """metadata.creationTimestamp (RFC 3339)."""
    condition: Mapping[str, Any] = field(default_factory=dict)
    """The operator's condition annotation (``dra.accel.dev/condition``), parsed; empty if none."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.claim.namespace, self.claim.name)


@dataclass(frozen=True, slots=True)
class PodObject:
    namespace: str
    name: str
    node: str
    phase: str
    claims: tuple[str, ...]
    """Names of the ResourceClaims (in the pod's namespace) the pod uses."""


@dataclass(frozen=True, slots=True)
class ClusterObjects:
    classes: dict[str, DeviceClass]
    managed_classes: frozenset[str]
    """Classes the operator keeps (label app.kubernetes.io/managed-by=accel-dra-operator)."""
    slices: list[ResourceSlice]
    nodes: list[Node]
    claims: list[ClaimObject]
    pods: list[PodObject]
    warnings: tuple[str, ...] = ()

    @classmethod
    def from_lists(
        cls,
        *,
        classes: Iterable[Mapping[str, Any]],
        slices: Iterable[Mapping[str, Any]],
        claims: Iterable[Mapping[str, Any]],
        nodes: Iterable[Mapping[str, Any]],
        pods: Iterable[Mapping[str, Any]],
    ) -> ClusterObjects:
        warnings: list[str] = []
        parsed_classes: dict[str, DeviceClass] = {}
        managed: set[str] = set()
        for obj in classes:
            try:
                dc = DeviceClass.from_json(obj)
            except ModelError as exc:
                warnings.append(f"skipped: {exc}")
                continue
            parsed_classes[dc.name] = dc
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE:
                managed.add(dc.name)
        parsed_slices: list[ResourceSlice] = []
        for obj in slices:
            try:
                parsed_slices.append(ResourceSlice.from_json(obj))
            except ModelError as exc:
                warnings.append(f"skipped: {exc}")
        parsed_claims: list[ClaimObject] = []
        for obj in claims:
            try:
                claim = ResourceClaim.from_json(obj)
            except ModelError as exc:
                warnings.append(f"skipped: {exc}")
                continue
            meta = obj.get("metadata") or {}
            parsed_claims.append(
                ClaimObject(
                    claim=claim,
                    created=str(meta.get("creationTimestamp") or ""),
                    condition=_condition(meta.get("annotations") or {}),
                )
            )
        parsed_nodes: list[Node] = []
        for obj in nodes:
            try:
                parsed_nodes.append(Node.from_json(obj))
            except ModelError as exc:
                warnings.append(f"skipped: {exc}")
        return cls(
            classes=parsed_classes,
            managed_classes=frozenset(managed),
            slices=sorted(parsed_slices, key=lambda s: (s.node_name or "", s.driver, s.pool.name, s.name)),
            nodes=sorted(parsed_nodes, key=lambda n: n.name),
            claims=sorted(parsed_claims, key=lambda c: c.key),
            pods=sorted((pod_object(p) for p in pods), key=lambda p: (p.namespace, p.name)),
            warnings=tuple(warnings),
        )

    def claim(self, namespace: str, name: str) -> ClaimObject | None:
        return next((c for c in self.claims if c.key == (namespace, name)), None)

    def pods_using(self, namespace: str, name: str) -> list[PodObject]:
        return [p for p in self.pods if p.namespace == namespace and name in p.claims]


def _condition(annotations: Mapping[str, Any]) -> Mapping[str, Any]:
    text = annotations.get(CONDITION_ANNOTATION)
    if not isinstance(text, str):
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def pod_object(obj: Mapping[str, Any]) -> PodObject:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    names: dict[str, None] = {}
    for ref in spec.get("resourceClaims") or []:
        if isinstance(ref, Mapping) and ref.get("resourceClaimName"):
            names[str(ref["resourceClaimName"])] = None
    for entry in status.get(POD_CLAIM_STATUSES) or []:
        if isinstance(entry, Mapping) and entry.get("resourceClaimName"):
            names[str(entry["resourceClaimName"])] = None
    extended = status.get("extendedResourceClaimStatus") or {}
    if isinstance(extended, Mapping) and extended.get("resourceClaimName"):
        names[str(extended["resourceClaimName"])] = None
    return PodObject(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or ""),
        claims=tuple(names),
    )


def node_of(selector: NodeSelector | None, *, nodes: Sequence[Node]) -> str | None:
    """The node an allocation is pinned to (None: reachable from several nodes, or every node)."""
    if selector is None:
        return None
    if len(selector.terms) == 1:
        term = selector.terms[0]
        requirements = (*term.match_fields, *term.match_expressions)
        if len(requirements) == 1:
            req = requirements[0]
            by_name = req.key in ("metadata.name", "kubernetes.io/hostname")
            if by_name and req.operator == "In" and len(req.values) == 1:
                return req.values[0]
    matching = [n.name for n in nodes if selector.matches(n)]
    return matching[0] if len(matching) == 1 else None


async def fetch(*, kubeconfig: str | None, context: str | None) -> ClusterObjects:
    """Read the cluster: one list per kind (deviceclasses, resourceslices, resourceclaims, nodes, pods)."""
    api = await make_api_client(kubeconfig=kubeconfig, context=context)
    try:
        version = await preferred_resource_version(api)
        kube = KubeApi(api, resource_version=version, instance="kubectl-dra")
        classes, slices, claims, nodes, pods = await asyncio.gather(
            kube.list_snapshot("deviceclasses"),
            kube.list_snapshot("resourceslices"),
            kube.list_snapshot("resourceclaims"),
            kube.list_core("nodes"),
            kube.list_core("pods"),
        )
    finally:
        await api.close()
    return ClusterObjects.from_lists(
        classes=classes.items, slices=slices.items, claims=claims.items, nodes=nodes.items, pods=pods.items
    )
