"""ResourceSlices of nodes that no longer exist.

Node agents make the Node the owner of their slices, so the garbage collector removes them with the
node. A slice without such an owner (published by hand, by an older agent, or after its owner
reference was stripped) would stay forever and offer devices nobody can reach; the operator deletes
it once its node has been gone for a grace period (confirmed with the API server, never just from
the watch). Only slices of its own drivers: another driver's slices are that driver's to clean
up, and its controller may keep them on purpose (the operator's role can delete any slice, which
RBAC cannot narrow by driver, so the filter is here).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from dra_api.model import ResourceSlice
from dra_operator.client.kubeapi import KubeApi
from dra_operator.model.cluster import ClusterModel

logger = logging.getLogger(__name__)


def owned_by_node(sl: ResourceSlice) -> bool:
    return any(o.kind == "Node" and o.api_version == "v1" for o in sl.metadata.owner_references)


def orphan_candidates(model: ClusterModel, *, drivers: Collection[str]) -> list[ResourceSlice]:
    """Node-local slices of ``drivers`` whose node the model does not know and that no Node owns."""
    return [
        s
        for s in model.slices.values()
        if s.driver in drivers
        and s.node_name is not None
        and s.node_name not in model.nodes
        and not owned_by_node(s)
    ]


class OrphanSliceCollector:
    def __init__(
        self,
        *,
        model: ClusterModel,
        api: KubeApi,
        drivers: Collection[str],
        grace: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.drivers = frozenset(drivers)
        self.api = api
        self.grace = grace
        self.clock = clock
        self._missing_since: dict[str, float] = {}

    async def sweep(self) -> list[str]:
        """Delete slices whose node has been missing for longer than the grace period."""
        now = self.clock()
        candidates = {s.name: s for s in orphan_candidates(self.model, drivers=self.drivers)}
        for name in list(self._missing_since):
            if name not in candidates:
                del self._missing_since[name]
        deleted: list[str] = []
        for name, sl in candidates.items():
            first = self._missing_since.setdefault(name, now)
            if now - first < self.grace:
                continue
            assert sl.node_name is not None
            if await self.api.node_exists(sl.node_name):
                continue
            if await self.api.delete_slice(name=name, uid=sl.metadata.uid):
                logger.info("deleted ResourceSlice %s of node %s, which no longer exists", name, sl.node_name)
                deleted.append(name)
            self._missing_since.pop(name, None)
        return deleted
