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
    handlers = _Handlers(parts)
    kopf.on.startup(registry=registry)(handlers.configure)
    kopf.on.login(registry=registry)(handlers.login)
    kopf.on.event(RESOURCE_GROUP, "resourceslices", registry=registry)(handlers.slice_event)
    kopf.on.event(RESOURCE_GROUP, "deviceclasses", registry=registry)(handlers.class_event)
    kopf.on.event("", "v1", "nodes", registry=registry)(handlers.node_event)
    kopf.on.event("", "v1", "pods", registry=registry)(handlers.pod_event)
    if parts.compute_domains is not None:
        cdwatch.register(registry, controller=parts.compute_domains)
    if not parts.settings.standalone:
        peering = parts.settings.peering_name
        kopf.on.event(
            "kopf.dev", "v1", "clusterkopfpeerings", registry=registry, when=lambda name, **_: name == peering
        )(handlers.heartbeat_event)
    return registry


class _Handlers:
    """The handlers :func:`build_registry` registers, over one operator's parts."""

    def __init__(self, parts: OperatorParts) -> None:
        self.parts = parts
        self.model, self.metrics, self.health = parts.model, parts.metrics, parts.health

    def _seen(self, resource: str, type: str | None) -> None:
        self.metrics.watch_events.labels(resource).inc()
        self.health.event_seen()
        if type is None:
            # Kopf is listing (type None), which after startup means its watch had a gap (410 Gone,
            # a reconnect): the listing shows what exists but not what was deleted meanwhile.
            self.parts.claims.watch_relisted(resource)
        else:
            self.parts.claims.watch_event(resource)

    async def configure(self, settings: kopf.OperatorSettings, **_: Any) -> None:
        self.parts.configure(settings)

    async def login(self, settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo | None:
        result: kopf.ConnectionInfo | None = self.parts.login(settings)
        return result

    async def slice_event(self, type: str | None, body: kopf.Body, name: str, **_: Any) -> None:
        self._seen("resourceslices", type)
        if type == "DELETED":
            self.model.remove_slice(
                name, resource_version=str(body.get("metadata", {}).get("resourceVersion", ""))
            )
        else:
            try:
                if self.model.upsert_slice(_plain(body)) is None:
                    return
            except ModelError as exc:
                logger.warning("ignoring ResourceSlice %s: %s", name, exc)
                self.metrics.reconcile_errors.labels("ResourceSlice").inc()
                return
        self.parts.claims.on_cluster_change()

    async def class_event(self, type: str | None, body: kopf.Body, name: str, **_: Any) -> None:
        self._seen("deviceclasses", type)
        obj = _plain(body)
        if type == "DELETED":
            self.model.remove_class(name)
        else:
            try:
                self.model.upsert_class(obj)
            except ModelError as exc:
                logger.warning("ignoring DeviceClass %s: %s", name, exc)
                self.metrics.reconcile_errors.labels("DeviceClass").inc()
        self.parts.claims.on_cluster_change()
        if self.health.active:  # the standby leaves repairs to the active instance
            await self.parts.classes.reconcile(name=name, obj=None if type == "DELETED" else obj)

    async def node_event(self, type: str | None, body: kopf.Body, name: str, **_: Any) -> None:
        self._seen("nodes", type)
        if type == "DELETED":
            self.model.remove_node(name)
        elif not self.model.upsert_node(_plain(body)):
            return  # a status update (heartbeat, conditions): nothing allocation depends on
        self.parts.claims.on_cluster_change()

    async def pod_event(
        self, type: str | None, body: kopf.Body, name: str, namespace: str | None, **_: Any
    ) -> None:
        namespace = namespace or ""
        self._seen("pods", type)
        if type == "DELETED":
            self.model.remove_pod(namespace=namespace, name=name)
            self.parts.claims.on_pod_gone(namespace=namespace, name=name)
        else:
            obj = _plain(body)
            self.model.upsert_pod(obj)
            if (body.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                self.parts.claims.on_pod_gone(namespace=namespace, name=name)
        self.parts.claims.on_pod_change()

    async def heartbeat_event(self, body: kopf.Body, **_: Any) -> None:
        self.metrics.watch_events.labels("clusterkopfpeerings").inc()
        self.health.heartbeat_seen(
            (body.get("metadata") or {}).get("annotations", {}).get(HEARTBEAT_ANNOTATION)
        )
