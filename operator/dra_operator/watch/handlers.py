"""Kopf handlers: thin. Each passes the watched object to the reconcile logic and returns.

ResourceClaims are not among them: they have a watch of their own (:mod:`dra_operator.watch.claimwatch`).

Handlers are registered into a registry built per operator (:func:`build_registry`), not Kopf's
global one, so that tests can run several operators in one process.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import kopf

from dra_api.model import ModelError
from dra_api.names import RESOURCE_GROUP
from dra_operator.base.settings import Settings
from dra_operator.claims.coordinator import ClaimReconciler
from dra_operator.computedomains import ComputeDomainController
from dra_operator.model.cluster import ClusterModel
from dra_operator.model.metrics import Metrics
from dra_operator.upkeep.deviceclasses import DeviceClassKeeper
from dra_operator.watch import cdwatch
from dra_operator.watch.liveness import Health
from dra_operator.watch.peering import HEARTBEAT_ANNOTATION

logger = logging.getLogger(__name__)


@dataclass
class OperatorParts:
    """What the handlers talk to."""

    settings: Settings
    model: ClusterModel
    claims: ClaimReconciler
    classes: DeviceClassKeeper
    health: Health
    metrics: Metrics
    login: Any
    configure: Any
    compute_domains: ComputeDomainController | None = None


def _plain(body: Any) -> dict[str, Any]:
    # Kopf's Body is a read-only mapping view; the model wants plain JSON.
    return {k: (dict(v) if hasattr(v, "items") else v) for k, v in dict(body).items()}


def build_registry(parts: OperatorParts) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    model, metrics, health = parts.model, parts.metrics, parts.health

    def seen(resource: str, type: str | None) -> None:
        metrics.watch_events.labels(resource).inc()
        health.event_seen()
        if type is None:
            # Kopf is listing (type None), which after startup means its watch had a gap (410 Gone,
            # a reconnect): the listing shows what exists but not what was deleted meanwhile.
            parts.claims.watch_relisted(resource)
        else:
            parts.claims.watch_event(resource)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        parts.configure(settings)

    @kopf.on.login(registry=registry)
    async def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo | None:
        result: kopf.ConnectionInfo | None = parts.login(settings)
        return result

    @kopf.on.event(RESOURCE_GROUP, "resourceslices", registry=registry)
    async def slice_event(type: str | None, body: kopf.Body, name: str, **_: Any) -> None:
        seen("resourceslices", type)
        if type == "DELETED":
            model.remove_slice(
                name, resource_version=str(body.get("metadata", {}).get("resourceVersion", ""))
            )
        else:
            try:
                if model.upsert_slice(_plain(body)) is None:
                    return
            except ModelError as exc:
                logger.warning("ignoring ResourceSlice %s: %s", name, exc)
                metrics.reconcile_errors.labels("ResourceSlice").inc()
                return
        parts.claims.on_cluster_change()

    @kopf.on.event(RESOURCE_GROUP, "deviceclasses", registry=registry)
    async def class_event(type: str | None, body: kopf.Body, name: str, **_: Any) -> None:
        seen("deviceclasses", type)
        obj = _plain(body)
        if type == "DELETED":
            model.remove_class(name)
        else:
            try:
                model.upsert_class(obj)
            except ModelError as exc:
                logger.warning("ignoring DeviceClass %s: %s", name, exc)
                metrics.reconcile_errors.labels("DeviceClass").inc()
        parts.claims.on_cluster_change()
        if health.active:  # the standby leaves repairs to the active instance
            await parts.classes.reconcile(name=name, obj=None if type == "DELETED" else obj)

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_event(type: str | None, body: kopf.Body, name: str, **_: Any) -> None:
        seen("nodes", type)
        if type == "DELETED":
            model.remove_node(name)
        elif not model.upsert_node(_plain(body)):
            return  # a status update (heartbeat, conditions): nothing allocation depends on
        parts.claims.on_cluster_change()

    @kopf.on.event("", "v1", "pods", registry=registry)
    async def pod_event(
        type: str | None, body: kopf.Body, name: str, namespace: str | None, **_: Any
    ) -> None:
        namespace = namespace or ""
        seen("pods", type)
        if type == "DELETED":
            model.remove_pod(namespace=namespace, name=name)
            parts.claims.on_pod_gone(namespace=namespace, name=name)
        else:
            obj = _plain(body)
            model.upsert_pod(obj)
            if (body.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                parts.claims.on_pod_gone(namespace=namespace, name=name)
        parts.claims.on_pod_change()

    if parts.compute_domains is not None:
        cdwatch.register(registry, controller=parts.compute_domains)

    if not parts.settings.standalone:
        peering = parts.settings.peering_name

        @kopf.on.event(
            "kopf.dev", "v1", "clusterkopfpeerings", registry=registry, when=lambda name, **_: name == peering
        )
        async def heartbeat_event(body: kopf.Body, **_: Any) -> None:
            metrics.watch_events.labels("clusterkopfpeerings").inc()
            health.heartbeat_seen(
                (body.get("metadata") or {}).get("annotations", {}).get(HEARTBEAT_ANNOTATION)
            )

    return registry
