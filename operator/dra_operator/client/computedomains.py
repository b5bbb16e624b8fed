"""Every call the ComputeDomain controller makes to the API server.

Plain JSON over the client's own REST session, as ``kubeapi`` sends its merge patches: the
domains and their status (``resource.nvidia.com/v1beta1``), the cliques in the driver's namespace,
the ResourceClaimTemplates (``resource.k8s.io/v1``), the daemons' DaemonSets and the node labels.
Every write checks ``may_write`` first (a standby writes nothing, see ``watch.peering``); 409 is
:class:`Conflict`, 404 :class:`Gone`, 403 :class:`Forbidden`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final
from urllib.parse import quote

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api import computedomains as cd
from dra_operator.client.errors import Conflict, Gone, NotActive

MERGE_PATCH: Final = "application/merge-patch+json"
JSON: Final = "application/json"
# A listing of domains is cut into pages of this many.
PAGE_SIZE: Final = 500


class Forbidden(Exception):
    """The server refused the call (403): RBAC or an admission policy; the text says which."""


def _q(text: str) -> str:
    return quote(text, safe="")


def domain_path(namespace: str, name: str = "") -> str:
    base = f"/apis/{cd.API_VERSION}/namespaces/{_q(namespace)}/{cd.DOMAIN_PLURAL}"
    return f"{base}/{_q(name)}" if name else base


def clique_path(namespace: str, name: str = "") -> str:
    base = f"/apis/{cd.API_VERSION}/namespaces/{_q(namespace)}/{cd.CLIQUE_PLURAL}"
    return f"{base}/{_q(name)}" if name else base


def template_path(namespace: str, name: str = "") -> str:
    base = f"/apis/resource.k8s.io/v1/namespaces/{_q(namespace)}/resourceclaimtemplates"
    return f"{base}/{_q(name)}" if name else base


def daemonset_path(namespace: str, name: str = "") -> str:
    base = f"/apis/apps/v1/namespaces/{_q(namespace)}/daemonsets"
    return f"{base}/{_q(name)}" if name else base


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{_q(name)}"


class ComputeDomainApi:
    """The controller's calls, each one request with a deadline; JSON in, JSON out."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        may_write: Callable[[], bool] = lambda: True,
        request_timeout_s: float = 30.0,
    ) -> None:
        self.api = api
        self.may_write = may_write
        self.request_timeout_s = request_timeout_s

    async def _call(
        self, method: str, path: str, *, body: Any = None, content_type: str = JSON
    ) -> dict[str, Any] | None:
        """One request; None for a 404 of a GET, the object otherwise."""
        if method != "GET" and not self.may_write():
            raise NotActive(f"not the active instance: {method} {path} not sent")
        api = self.api
        headers: dict[str, Any] = {**api.default_headers, "Accept": JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        if api.cookie:
            headers["Cookie"] = api.cookie
        await api.update_params_for_auth(headers, [], ["BearerToken"])
        raw = await api.rest_client.request(
            method,
            f"{api.configuration.host}{path}",
            headers=headers,
            body=body,
            _preload_content=False,
            _request_timeout=self.request_timeout_s,
        )
        try:
            data = await raw.read()
        finally:
            raw.release()
        if 200 <= raw.status <= 299:
            return json.loads(data) if data else {}
        text = data.decode("utf-8", "replace")[:500]
        if raw.status == 404:
            if method == "GET":
                return None
            raise Gone(text)
        if raw.status == 409:
            raise Conflict(text)
        if raw.status == 403:
            raise Forbidden(_message(text))
        error = ApiException(status=raw.status, reason=raw.reason)
        error.body = text
        raise error

    # -- domains ------------------------------------------------------------------------------------

    async def list_domains(self) -> list[dict[str, Any]]:
        """Every ComputeDomain of the cluster (paged)."""
        items: list[dict[str, Any]] = []
        cont = ""
        while True:
            query = f"?limit={PAGE_SIZE}" + (f"&continue={_q(cont)}" if cont else "")
            page = await self._call("GET", f"/apis/{cd.API_VERSION}/{cd.DOMAIN_PLURAL}{query}") or {}
            items.extend(page.get("items") or [])
            cont = str((page.get("metadata") or {}).get("continue") or "")
            if not cont:
                return items

    async def patch_domain(self, *, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        obj = await self._call(
            "PATCH", domain_path(namespace, name), body=dict(body), content_type=MERGE_PATCH
        )
        assert obj is not None
        return obj

    async def patch_domain_status(
        self, *, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        path = domain_path(namespace, name) + "/status"
        obj = await self._call("PATCH", path, body=dict(body), content_type=MERGE_PATCH)
        assert obj is not None
        return obj

    # -- objects made for a domain: templates, DaemonSets, cliques ----------------------------------

    async def get(self, path: str) -> dict[str, Any] | None:
        return await self._call("GET", path)

    async def create(self, collection: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create; None when one of that name exists already."""
        try:
            return await self._call("POST", collection, body=dict(body))
        except Conflict:
            return None

    async def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        obj = await self._call("PATCH", path, body=dict(body), content_type=MERGE_PATCH)
        assert obj is not None
        return obj

    async def put(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        obj = await self._call("PUT", path, body=dict(body))
        assert obj is not None
        return obj

    async def delete(self, path: str, *, uid: str = "") -> bool:
        """Delete (only the object of ``uid`` when given); False when it was gone already."""
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            await self._call("DELETE", path, body=body)
        except Gone:
            return False
        return True

    async def list_labelled(self, collection: str, *, label: str, value: str) -> list[dict[str, Any]]:
        """The objects of ``collection`` (one namespace) labelled ``label=value``."""
        selector = _q(f"{label}={value}")
        page = await self._call("GET", f"{collection}?labelSelector={selector}") or {}
        return list(page.get("items") or [])

    # -- nodes --------------------------------------------------------------------------------------

    async def remove_node_label(self, *, node: str, value: str) -> bool:
        """Remove the domain label of ``node`` if it still names domain ``value``; False when the
        node is gone or labelled otherwise (a JSON patch whose ``test`` guards the value)."""
        key = cd.DOMAIN_LABEL.replace("~", "~0").replace("/", "~1")
        patch = [
            {"op": "test", "path": f"/metadata/labels/{key}", "value": value},
            {"op": "remove", "path": f"/metadata/labels/{key}"},
        ]
        try:
            await self._call("PATCH", node_path(node), body=patch, content_type="application/json-patch+json")
        except Gone:
            return False
        except ApiException as exc:
            if exc.status == 422:  # the test failed: no such label, or another value
                return False
            raise
        return True


def _message(text: str) -> str:
    """The ``message`` of a Status object, or the text as it came."""
    try:
        decoded = json.loads(text)
    except ValueError:
        return text
    if isinstance(decoded, Mapping):
        return str(decoded.get("message") or text)
    return text
