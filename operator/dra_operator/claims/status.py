"""What the operator writes on a claim besides its allocation: the finalizer, the condition
annotation and status clears, and the text of the Events about it.

ResourceClaim status has no conditions of its own, so a claim's condition lives in the annotation
``dra.accel.dev/condition``. Every write carries ``metadata.resourceVersion``, and what the server
returns goes through the reconciler's claim input at once, so the model never lags our own writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from dra_api import times
from dra_api.model import AllocationResult, ResourceClaim
from dra_api.names import OPERATOR_FINALIZER, PROJECT_DOMAIN
from dra_operator.client.errors import Gone
from dra_operator.client.kubeapi import KubeApi
from dra_operator.model.cluster import ClaimKey, ClusterModel

CONDITION_ANNOTATION = f"{PROJECT_DOMAIN}/condition"
CONDITION_TYPE = "Allocated"

ClaimInput = Callable[..., None]
"""The reconciler's ``on_claim_event(obj, *, deleted)``."""


def now_stamp() -> str:
    """Now, as the API server writes times."""
    return times.rfc3339()


def condition_json(*, status: str, reason: str, message: str, now: str | None = None) -> str:
    """A metav1.Condition, as JSON, for the claim's condition annotation."""
    return json.dumps(
        {
            "type": CONDITION_TYPE,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now or now_stamp(),
        },
        separators=(",", ":"),
    )


def same_condition(old: str, new: str) -> bool:
    """Whether two conditions say the same (their times may differ)."""
    try:
        a, b = json.loads(old), json.loads(new)
    except ValueError:
        return False
    return bool(a.get("reason") == b.get("reason") and a.get("message") == b.get("message"))


def involved(claim: ResourceClaim, *, api_version: str) -> dict[str, Any]:
    """An Event's involvedObject for ``claim``."""
    return {
        "apiVersion": api_version,
        "kind": "ResourceClaim",
        "name": claim.name,
        "namespace": claim.namespace,
        "uid": claim.metadata.uid,
    }


def describe_allocation(allocation: AllocationResult, node: str | None) -> str:
    devices = ", ".join(f"{r.driver}/{r.pool}/{r.device}" for r in allocation.devices)
    where = f"on node {node}" if node else "usable from any node"
    return f"allocated {devices or 'no devices'} {where}"


class ClaimStatusWriter:
    """Writes a claim's finalizer, condition, reservedFor and deallocation, and feeds the result
    back to the reconciler (``on_claim_event``)."""

    def __init__(self, *, api: KubeApi, model: ClusterModel, on_claim_event: ClaimInput) -> None:
        self.api = api
        self.model = model
        self.on_claim_event = on_claim_event

    def _current(self, claim: ResourceClaim) -> ResourceClaim | None:
        return self.model.claims.get(ClaimKey(claim.namespace, claim.name))

    async def patch_meta(
        self, claim: ResourceClaim, *, finalizer: bool, condition: str | None
    ) -> ResourceClaim | None:
        """Set or drop our finalizer and the condition annotation, if they differ; precondition on
        the resourceVersion. Returns the claim as written (None if it is gone)."""
        finalizers = [f for f in claim.metadata.finalizers if f != OPERATOR_FINALIZER]
        if finalizer:
            finalizers.append(OPERATOR_FINALIZER)
        has_condition = claim.metadata.annotations.get(CONDITION_ANNOTATION)
        unchanged_condition = (
            has_condition is None
            if condition is None
            else has_condition is not None and same_condition(has_condition, condition)
        )
        if tuple(finalizers) == claim.metadata.finalizers and unchanged_condition:
            return claim
        body: dict[str, Any] = {
            "metadata": {
                "resourceVersion": claim.metadata.resource_version,
                "finalizers": finalizers,
            }
        }
        if not unchanged_condition:
            body["metadata"]["annotations"] = {CONDITION_ANNOTATION: condition}
        try:
            obj = await self.api.patch_claim(namespace=claim.namespace, name=claim.name, body=body)
        except Gone:
            self.on_claim_event(
                {"metadata": {"namespace": claim.namespace, "name": claim.name}}, deleted=True
            )
            return None
        self.on_claim_event(obj, deleted=False)
        return self._current(claim)

    async def write_allocation(
        self, claim: ResourceClaim, allocation: AllocationResult, *, resource_version: str
    ) -> Mapping[str, Any]:
        """Write ``status.allocation``; the caller feeds the result in (it still holds the
        devices as assumed until then)."""
        return await self.api.patch_claim_status(
            namespace=claim.namespace,
            name=claim.name,
            body={
                "metadata": {"resourceVersion": resource_version},
                "status": {"allocation": allocation.to_json()},
            },
        )

    async def clear_allocation(self, claim: ResourceClaim) -> ResourceClaim | None:
        obj = await self.api.patch_claim_status(
            namespace=claim.namespace,
            name=claim.name,
            body={
                "metadata": {"resourceVersion": claim.metadata.resource_version},
                "status": {"allocation": None, "devices": None, "reservedFor": None},
            },
        )
        self.on_claim_event(obj, deleted=False)
        return self._current(claim)

    async def set_reserved_for(
        self, claim: ResourceClaim, entries: list[dict[str, Any]]
    ) -> ResourceClaim | None:
        obj = await self.api.patch_claim_status(
            namespace=claim.namespace,
            name=claim.name,
            body={
                "metadata": {"resourceVersion": claim.metadata.resource_version},
                "status": {"reservedFor": entries or None},
            },
        )
        self.on_claim_event(obj, deleted=False)
        return self._current(claim)
