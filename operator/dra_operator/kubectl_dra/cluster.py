"""The cluster as ``kubectl dra`` sees it: one list per kind, parsed into the typed model.

:func:`fetch` reads DeviceClasses, ResourceSlices and ResourceClaims (in the served resource.k8s.io
version), Nodes and Pods, each with one (paged) list, cluster-wide. :meth:`ClusterObjects.from_lists`
turns those lists into typed objects; objects the model cannot parse are left out with a warning.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException

from dra_api.kube import UnsupportedServer, make_api_client, preferred_resource_version
from dra_api.model import DeviceClass, ModelError, Node, NodeSelector, ResourceClaim, ResourceSlice
from dra_api.names import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from dra_operator.claims.status import CONDITION_ANNOTATION
from dra_operator.client.kubeapi import KubeApi

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
    # Lookups by key, built once: a scan of every pod per claim was quadratic (minutes at 5,000 nodes).
    _claims_by_key: dict[tuple[str, str], ClaimObject] = field(init=False, repr=False, compare=False)
    _pods_by_claim: dict[tuple[str, str], list[PodObject]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_key: dict[tuple[str, str], ClaimObject] = {}
        for c in self.claims:
            by_key.setdefault(c.key, c)
        by_claim: dict[tuple[str, str], list[PodObject]] = {}
        for p in self.pods:
            for name in p.claims:
                by_claim.setdefault((p.namespace, name), []).append(p)
        object.__setattr__(self, "_claims_by_key", by_key)
        object.__setattr__(self, "_pods_by_claim", by_claim)

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
        parsed_nodes = _parse_nodes(nodes, warnings)
        return cls(
            classes=parsed_classes,
            managed_classes=frozenset(managed),
            slices=sorted(parsed_slices, key=lambda s: (s.node_name or "", s.driver, s.pool.name, s.name)),
            nodes=parsed_nodes,
            claims=sorted(parsed_claims, key=lambda c: c.key),
            pods=sorted((pod_object(p) for p in pods), key=lambda p: (p.namespace, p.name)),
            warnings=tuple(warnings),
        )

    def with_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> ClusterObjects:
        """These objects with ``nodes`` (listed later) in place of the nodes."""
        warnings = list(self.warnings)
        parsed = _parse_nodes(nodes, warnings)
        return dataclasses.replace(self, nodes=parsed, warnings=tuple(warnings))

    def claim(self, namespace: str, name: str) -> ClaimObject | None:
        return self._claims_by_key.get((namespace, name))

    def pods_using(self, namespace: str, name: str) -> list[PodObject]:
        """In the order of :attr:`pods` (the index is built in that order)."""
        return list(self._pods_by_claim.get((namespace, name), ()))


def _parse_nodes(nodes: Iterable[Mapping[str, Any]], warnings: list[str]) -> list[Node]:
    """Nodes by name; those the model cannot parse are left out with a warning."""
    parsed: list[Node] = []
    for obj in nodes:
        try:
            parsed.append(Node.from_json(obj))
        except ModelError as exc:
            warnings.append(f"skipped: {exc}")
    return sorted(parsed, key=lambda n: n.name)


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


def pinned_node(selector: NodeSelector) -> str | None:
    """The node a selector names by name alone (the form the allocators write), else None."""
    if len(selector.terms) == 1:
        term = selector.terms[0]
        requirements = (*term.match_fields, *term.match_expressions)
        if len(requirements) == 1:
            req = requirements[0]
            by_name = req.key in ("metadata.name", "kubernetes.io/hostname")
            if by_name and req.operator == "In" and len(req.values) == 1:
                return req.values[0]
    return None


def node_of(selector: NodeSelector | None, *, nodes: Sequence[Node]) -> str | None:
    """The node an allocation is pinned to (None: reachable from several nodes, or every node)."""
    if selector is None:
        return None
    pinned = pinned_node(selector)
    if pinned is not None:
        return pinned
    matching = [n.name for n in nodes if selector.matches(n)]
    return matching[0] if len(matching) == 1 else None


def needs_nodes(claims: Iterable[ClaimObject]) -> bool:
    """Whether :func:`node_of` needs the node list for any of the claims' allocations."""
    for obj in claims:
        allocation = obj.claim.status.allocation
        selector = None if allocation is None else allocation.node_selector
        if selector is not None and pinned_node(selector) is None:
            return True
    return False


KINDS = ("deviceclasses", "resourceslices", "resourceclaims", "nodes", "pods")
PAGE_SIZE = 5000
"""Objects per page of the resource.k8s.io lists: at 5,000 nodes, pages of 500 (the operator's
size) made 50 round trips one after the other; a CLI can hold a bigger page."""


async def fetch(
    *,
    kubeconfig: str | None,
    context: str | None,
    kinds: Collection[str] = KINDS,
    nodes_if_needed: bool = False,
) -> ClusterObjects:
    """Read the cluster: one list per kind of ``kinds`` (deviceclasses, resourceslices, resourceclaims,
    nodes, pods); the others are left empty. A command lists only what it shows: a large cluster's
    slices and nodes are most of the bytes. With ``nodes_if_needed``, nodes are listed after the
    claims only when an allocation's node cannot be told without them (see :func:`needs_nodes`)."""
    api = await make_api_client(kubeconfig=kubeconfig, context=context)
    try:
        version = await preferred_resource_version(api)
        kube = KubeApi(api, resource_version=version, instance="kubectl-dra")

        async def listing(kind: str) -> list[dict[str, Any]]:
            if kind in ("nodes", "pods"):
                return (await kube.list_core(kind)).items
            return (await kube.list_snapshot(kind, page_size=PAGE_SIZE)).items

        wanted = [k for k in KINDS if k in kinds]
        lists = dict(zip(wanted, await asyncio.gather(*(listing(k) for k in wanted)), strict=True))
        cluster = ClusterObjects.from_lists(
            classes=lists.get("deviceclasses", ()),
            slices=lists.get("resourceslices", ()),
            claims=lists.get("resourceclaims", ()),
            nodes=lists.get("nodes", ()),
            pods=lists.get("pods", ()),
        )
        if nodes_if_needed and "nodes" not in lists and needs_nodes(cluster.claims):
            cluster = cluster.with_nodes(await listing("nodes"))
    finally:
        await api.close()
    return cluster


class CannotRead(Exception):
    """The cluster could not be read; the message says why in one line."""


def _server_error(exc: ApiException) -> str:
    text = str(exc.reason or "")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("message"):
        text = str(body["message"])
    return f"the server refused the request (HTTP {exc.status}): {' '.join(text.split())[:300]}"


def read(
    *,
    kubeconfig: str | None,
    context: str | None,
    kinds: Collection[str],
    nodes_if_needed: bool,
    timeout_s: float,
) -> ClusterObjects:
    """:func:`fetch`, run to its end within ``timeout_s``; every way it can fail is a
    :class:`CannotRead` with a one-line reason."""
    reading = fetch(kubeconfig=kubeconfig, context=context, kinds=kinds, nodes_if_needed=nodes_if_needed)
    try:
        return asyncio.run(asyncio.wait_for(reading, timeout_s))
    except ConfigException as exc:
        raise CannotRead(" ".join(str(exc).split())) from exc
    except UnsupportedServer as exc:
        raise CannotRead(str(exc)) from exc
    except ApiException as exc:
        raise CannotRead(_server_error(exc)) from exc
    except TimeoutError as exc:
        raise CannotRead(f"the API server did not answer within {timeout_s:g} s (--request-timeout)") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise CannotRead(
            f"cannot reach the API server: {' '.join(str(exc).split()) or type(exc).__name__}"
        ) from exc
