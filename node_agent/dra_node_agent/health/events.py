"""Events on the Node object that name the device and the reason, as ``kubectl describe node`` shows."""

from __future__ import annotations

import logging
from typing import Any, Final

from kubernetes_asyncio import client

from dra_api.events import event_body

logger = logging.getLogger(__name__)

COMPONENT: Final = "accel-dra-node-agent"
# Node events live in "default", where kubelet writes its own.
EVENT_NAMESPACE: Final = "default"


class NodeEvents:
    """Writes core/v1 Events about this node; failures are logged, never raised."""

    def __init__(self, *, api: client.ApiClient, node_name: str, component: str = COMPONENT) -> None:
        self._core = client.CoreV1Api(api)
        self._node_name = node_name
        self._component = component
        self._node_uid: str | None = None
        self.written = 0

    async def _uid(self) -> str | None:
        """The Node's UID, read once; None when it cannot be read (the Event then goes without it)."""
        if self._node_uid is None:
            try:
                node: Any = await self._core.read_node(self._node_name)
            except Exception as exc:  # the Event matters more than its UID; retried next time
                logger.debug("cannot read node %s for its UID: %s", self._node_name, exc)
                return None
            self._node_uid = str(node.metadata.uid)
        return self._node_uid

    async def record(self, *, type: str, reason: str, message: str) -> None:
        try:
            involved: dict[str, str] = {"apiVersion": "v1", "kind": "Node", "name": self._node_name}
            uid = await self._uid()
            if uid is not None:
                involved["uid"] = uid
            # The client takes the plain dict where its signature names its model class.
            body: Any = event_body(
                involved=involved,
                namespace=EVENT_NAMESPACE,
                type_=type,
                reason=reason,
                message=message,
                component=self._component,
                instance=self._node_name,
                host=self._node_name,
            )
            await self._core.create_namespaced_event(EVENT_NAMESPACE, body)
            self.written += 1
        except Exception as exc:  # an Event is best effort; health handling must go on
            logger.warning("cannot record %s Event %s on node %s: %s", type, reason, self._node_name, exc)
