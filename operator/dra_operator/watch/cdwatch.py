"""Kopf's handlers for the ComputeDomain controller: thin, each hands an event to the controller.

Event handlers only (``kopf.on.event``): they keep no progress and add no finalizer of Kopf's, so
both operator instances run them and only the active one writes (the controller checks
``watch.peering`` before every write). Kopf's change handlers (``on.create``, ``on.delete``) would
store their progress and Kopf's finalizer on the object from whichever instance saw the change
first, the standby included; the controller keeps NVIDIA's finalizer itself instead.

Watched: ComputeDomains (every namespace), their cliques (the driver's namespace), the daemon pods
(labelled with their domain) and nodes (for the domain label). Kopf shares one watch per resource
between these handlers and the operator's own, so pods and nodes are watched once.
"""

from __future__ import annotations

from typing import Any

import kopf

from dra_api import computedomains as cd
from dra_operator.computedomains import ComputeDomainController


def _plain(body: Any) -> dict[str, Any]:
    return {k: (dict(v) if hasattr(v, "items") else v) for k, v in dict(body).items()}


def register(registry: kopf.OperatorRegistry, *, controller: ComputeDomainController) -> None:
    """Add the controller's handlers to ``registry``."""

    @kopf.on.event(cd.GROUP, cd.VERSION, cd.DOMAIN_PLURAL, registry=registry)
    async def domain_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        controller.domain_event(type, _plain(body))

    daemons = controller.reconciler.options.namespace

    @kopf.on.event(cd.GROUP, cd.VERSION, cd.CLIQUE_PLURAL, registry=registry)
    async def clique_event(type: str | None, body: kopf.Body, namespace: str | None, **_: Any) -> None:
        if namespace == daemons:
            controller.clique_event(type, _plain(body))

    @kopf.on.event("", "v1", "pods", registry=registry, labels={cd.DOMAIN_LABEL: kopf.PRESENT})
    async def daemon_pod_event(type: str | None, body: kopf.Body, namespace: str | None, **_: Any) -> None:
        if namespace == daemons:
            controller.pod_event(type, _plain(body))

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_event(type: str | None, body: kopf.Body, name: str, **_: Any) -> None:
        # Cheap for the node heartbeats: only the domain label is looked at.
        labels = dict((body.get("metadata") or {}).get("labels") or {})
        controller.node_event(type, {"metadata": {"name": name, "labels": labels}})

    del domain_event, clique_event, daemon_pod_event, node_event
