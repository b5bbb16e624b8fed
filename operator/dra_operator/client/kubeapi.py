""":class:`KubeApi`, the one object through which the operator's own logic calls the Kubernetes
API (Kopf watches everything but ResourceClaims, see :mod:`dra_operator.watch.claimwatch`).

Its calls are grouped by what they are for: claim reads and writes (:class:`ClaimCalls`), lists and
watches (:class:`~dra_operator.client.listwatch.ListsAndWatches`), the cluster-scoped objects the
operator keeps (:class:`ClusterObjects`: slices, DeviceClasses, DeviceTaintRules, the peering
object) and core objects and Events (:class:`CoreCalls`). They share one
:class:`~dra_operator.client.connection.Connection`; what a call can fail with is in
:mod:`dra_operator.client.errors`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api.events import event_body
from dra_api.names import MANAGED_BY_VALUE, RESOURCE_GROUP
from dra_operator.client.connection import MERGE_PATCH, Connection
from dra_operator.client.errors import Conflict, Gone, error_text, translate
from dra_operator.client.listwatch import ListsAndWatches

logger = logging.getLogger(__name__)

COMPONENT = MANAGED_BY_VALUE


class ClaimCalls(Connection):
    """A ResourceClaim read, and the merge patches of its metadata and status (fenced)."""

    async def get_claim(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self.custom.get_namespaced_custom_object(
                RESOURCE_GROUP, self.version, namespace, "resourceclaims", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def patch_claim(self, *, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._fence(f"ResourceClaim {namespace}/{name}")
        return await self._merge_patch(self._claim_path(namespace, name), body)

    async def patch_claim_status(
        self, *, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        self._fence(f"ResourceClaim {namespace}/{name} status")
        return await self._merge_patch(self._claim_path(namespace, name) + "/status", body)

    def _claim_path(self, namespace: str, name: str) -> str:
        # Quoted as the generated client quotes path parameters (no safe characters).
        return (
            f"/apis/{RESOURCE_GROUP}/{self.version}/namespaces/{quote(namespace, safe='')}"
            f"/resourceclaims/{quote(name, safe='')}"
        )


class ClusterObjects(Connection):
    """The cluster-scoped objects the operator keeps: orphaned ResourceSlices (deleted), its
    DeviceClasses, the DeviceTaintRules that reserve devices, and its entry in the peering object."""

    async def delete_slice(self, *, name: str, uid: str) -> bool:
        """Delete a ResourceSlice only if it is still the one seen (UID precondition)."""
        self._fence(f"deletion of ResourceSlice {name}")
        try:
            await self.custom.delete_cluster_custom_object(
                RESOURCE_GROUP,
                self.version,
                "resourceslices",
                name,
                body={"preconditions": {"uid": uid}},
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def get_device_class(self, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self.custom.get_cluster_custom_object(
                RESOURCE_GROUP, self.version, "deviceclasses", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def create_device_class(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create; None when it already exists (someone was faster)."""
        self._fence("DeviceClass")
        try:
            obj: dict[str, Any] = await self.custom.create_cluster_custom_object(
                RESOURCE_GROUP, self.version, "deviceclasses", dict(body)
            )
        except ApiException as exc:
            if exc.status == 409:
                return None
            raise
        return obj

    async def patch_device_class(self, *, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._fence(f"DeviceClass {name}")
        try:
            obj: dict[str, Any] = await self.custom.patch_cluster_custom_object(
                RESOURCE_GROUP, self.version, "deviceclasses", name, dict(body), _content_type=MERGE_PATCH
            )
        except ApiException as exc:
            raise translate(exc) from exc
        return obj

    async def discover_taint_rules(self) -> str | None:
        """Which resource.k8s.io version serves DeviceTaintRules (v1, else v1beta2), if any."""
        for version in ("v1", "v1beta2"):
            found = await self._raw_get(f"/apis/{RESOURCE_GROUP}/{version}")
            names = {r.get("name") for r in (found or {}).get("resources", [])}
            if "devicetaintrules" in names:
                self.taint_rule_version = version
                return version
        self.taint_rule_version = None
        return None

    @property
    def taint_rule_api_version(self) -> str:
        return f"{RESOURCE_GROUP}/{self.taint_rule_version}"

    async def create_taint_rule(self, body: Mapping[str, Any]) -> None:
        self._fence("DeviceTaintRule")
        try:
            await self.custom.create_cluster_custom_object(
                RESOURCE_GROUP, self.taint_rule_version, "devicetaintrules", dict(body)
            )
        except ApiException as exc:
            raise translate(exc) from exc

    async def delete_taint_rule(self, name: str) -> bool:
        """Delete a DeviceTaintRule; False when it was gone already."""
        self._fence(f"deletion of DeviceTaintRule {name}")
        try:
            await self.custom.delete_cluster_custom_object(
                RESOURCE_GROUP, self.taint_rule_version, "devicetaintrules", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise translate(exc) from exc
        return True

    async def list_taint_rules(self, label: str) -> list[str]:
        """The names of the DeviceTaintRules that carry ``label``."""
        page = await self.custom.list_cluster_custom_object(
            RESOURCE_GROUP, self.taint_rule_version, "devicetaintrules", label_selector=label
        )
        return [str(item["metadata"]["name"]) for item in page.get("items", [])]

    async def patch_peering(self, *, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self.custom.patch_cluster_custom_object(
                "kopf.dev", "v1", "clusterkopfpeerings", name, dict(body), _content_type=MERGE_PATCH
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj


class CoreCalls(Connection):
    """Core objects: whether a node exists, a pod; and the Events the operator posts."""

    async def node_exists(self, name: str) -> bool:
        return await self._raw_get(f"/api/v1/nodes/{name}") is not None

    async def get_pod(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._raw_get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    async def post_event(self, *, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about ``involved`` (apiVersion, kind, name, namespace, uid)."""
        body = event_body(
            involved=involved,
            type_=type_,
            reason=reason,
            message=message,
            component=COMPONENT,
            instance=self.instance,
        )
        namespace = body["metadata"]["namespace"]
        # An Event is an explanation, not state: losing one must not fail the reconcile. Sent as
        # plain JSON and its reply left unread: turning it into a V1Event (its timestamps go through
        # dateutil) was a noticeable share of the operator's CPU at one Event per allocation.
        try:
            await self._write(
                "POST", f"/api/v1/namespaces/{namespace}/events", body, content_type="application/json"
            )
        except (TimeoutError, ApiException, aiohttp.ClientError, OSError, Conflict, Gone) as exc:
            said = getattr(exc, "body", None) or ""
            logger.warning(
                "could not post %s event %s on %s: %s%s",
                type_,
                reason,
                involved.get("name"),
                error_text(exc),
                f": {said[:200]}" if said else "",
            )


class KubeApi(ClaimCalls, ListsAndWatches, ClusterObjects, CoreCalls):
    """Thin async calls over ``kubernetes_asyncio`` returning plain JSON dicts: the one object the
    operator holds to call the API server, made of the parts above over one connection."""


async def server_version(api_client: client.ApiClient) -> str:
    """The API server's release as ``/version`` reports it (``v1.37.2``)."""
    info = await client.VersionApi(api_client).get_code()
    return str(info.git_version)
