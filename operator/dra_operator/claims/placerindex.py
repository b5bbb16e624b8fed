"""Checking the placer's free-device index against the model, and repairing it.

The placer keeps an index of free devices for speed; the model is the truth. When they disagree
(a bug, or an event the index missed), the index is rebuilt from the model, the repair counted and
logged, and a claim whose placement ran into it is told once per device.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from dra_api.model import ResourceClaim
from dra_operator.base.logthrottle import LogThrottle, held_back
from dra_operator.claims.status import involved
from dra_operator.client.events import EventSink
from dra_operator.client.kubeapi import KubeApi
from dra_operator.model.cluster import ClaimKey, ClusterModel, DeviceID
from dra_operator.model.metrics import Metrics
from dra_operator.planner.placement import Placer

logger = logging.getLogger(__name__)


class PlacerIndexCheck:
    def __init__(
        self, *, model: ClusterModel, placer: Placer, metrics: Metrics, events: EventSink, api: KubeApi
    ) -> None:
        self.model = model
        self.placer = placer
        self.metrics = metrics
        self.events = events
        self.api = api
        self._reported: set[DeviceID] = set()
        self._log_throttle = LogThrottle()

    def check(
        self,
        *,
        found_by: str,
        claim: ResourceClaim | None = None,
        taken: Mapping[DeviceID, ClaimKey] | None = None,
    ) -> bool:
        """Compare the placer's free-device index with the model; on a difference, rebuild the
        index from the model, count it, log it (at most every 30 s) and, when a placement ran into
        it, post a Warning Event on the claim once per device. True when they disagreed."""
        problems = self.placer.disagreements(self.model)
        if not problems:
            return False
        self.metrics.index_repairs.labels(found_by).inc()
        self.placer.rebuild()
        held = self._log_throttle.allow(("placer index", found_by))
        if held is not None:
            logger.error(
                "placer index disagrees with the model (found by %s); rebuilt it from the model: %s%s",
                found_by,
                "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""),
                held_back(held),
            )
        fresh = {d: k for d, k in (taken or {}).items() if d not in self._reported}
        if claim is not None and fresh:
            self._reported.update(fresh)
            devices = ", ".join(f"{'/'.join(d)} (held by {k})" for d, k in sorted(fresh.items()))
            self.events.post(
                involved=involved(claim, api_version=self.api.api_version),
                type_="Warning",
                reason="PlacementIndexRepaired",
                message=f"the operator's free-device index counted {devices} as free; it was rebuilt "
                "from the cluster state and the claim will be placed again",
            )
        return True
