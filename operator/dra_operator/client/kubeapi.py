"""The only module of the operator's own logic that calls the Kubernetes API (Kopf watches everything
but ResourceClaims, see :mod:`dra_operator.watch.claimwatch`).

Writes that must not lose a race carry ``metadata.resourceVersion`` inside a merge patch: the API
server then refuses them with 409 Conflict when the object changed since it was read, which
:class:`Conflict` reports. A 404 is :class:`Gone`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api.events import event_body
from dra_api.names import MANAGED_BY_VALUE, RESOURCE_GROUP

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
COMPONENT = MANAGED_BY_VALUE


class Conflict(Exception):
    """The object changed since it was read (HTTP 409)."""


class Gone(Exception):
    """The object does not exist (HTTP 404)."""


class Expired(Exception):
    """A watch's resourceVersion is too old for the server (410 Gone): list again."""


class WatchInactive(Exception):
    """A watch brought nothing, not even a bookmark, for its inactivity timeout: the connection is
    taken as silently stalled and dropped; resume from the last resourceVersion seen."""


class NotActive(Exception):
    """A write was refused here because this instance is not (or no longer) the active one."""


def _translate(exc: ApiException) -> Exception:
    if exc.status == 409:
        return Conflict(str(exc.reason))
    if exc.status == 404:
        return Gone(str(exc.reason))
    return exc


def transient(exc: BaseException) -> bool:
    """Whether an API call may succeed when simply tried again: throttling (429), a server-side
    error (5xx), a dropped connection or a timeout. Anything else (403, 422, bugs) will not."""
    if isinstance(exc, ApiException):
        return exc.status == 429 or (exc.status is not None and exc.status >= 500)
    return isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError))


def error_cause(exc: BaseException) -> str:
    """A short label for an API error: the HTTP status, or the exception's type."""
    if isinstance(exc, ApiException) and exc.status is not None:
        return str(exc.status)
    return type(exc).__name__


def error_text(exc: BaseException) -> str:
    """One line for a log: the status and reason of an API error, or the exception's text."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def retry_after(exc: BaseException) -> float | None:
    """The server's Retry-After (seconds) on a 429 or 503, if it sent one."""
    if not isinstance(exc, ApiException) or exc.status not in (429, 503) or not exc.headers:
        return None
    value = exc.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: never sent by the API server


async def _api_error(raw: Any) -> ApiException:
    """The ApiException for an unpreloaded response with an HTTP error status (the client raises
    only when it reads the body itself), with its headers for Retry-After."""
    error = ApiException(status=raw.status, reason=await raw.text())
    error.headers = raw.headers
    return error


@dataclass(frozen=True)
class Listing:
    """A complete list of one resource, or one page of it, and the resourceVersion it was read at
    (for a page, the first page's: the snapshot's)."""

    items: list[dict[str, Any]]
    resource_version: str


PAGE_SIZE = 500
"""Objects per page of a listing (``limit``): a re-list holds one page's JSON at a time, not the
whole cluster's."""


async def _paged(
    get: Callable[[str | None], Awaitable[dict[str, Any]]],
) -> AsyncGenerator[Listing, None]:
    """The pages that ``get`` returns (given the previous page's continue token, None first), each
    as a Listing at the first page's resourceVersion (the snapshot's)."""
    cont: str | None = None
    version = ""
    while True:
        page = await get(cont)
        meta = page.get("metadata") or {}
        version = version or str(meta.get("resourceVersion", ""))
        cont = meta.get("continue") or None
        items: list[dict[str, Any]] = list(page.get("items") or [])
        # Not kept while the next page is read: one page at a time.
        del page, meta
        yield Listing(items, version)
        del items
        if not cont:
            return


async def _collect(pages: AsyncGenerator[Listing, None]) -> Listing:
    items: list[dict[str, Any]] = []
    version = ""
    async for page in pages:
        items.extend(page.items)
        version = page.resource_version
    return Listing(items, version)


class KubeApi:
    """Thin async calls over ``kubernetes_asyncio`` returning plain JSON dicts."""

    def __init__(self, api: client.ApiClient, *, resource_version: str, instance: str) -> None:
        self.api = api
        self.version = resource_version
        self.instance = instance
        # Typed as Any: the client's stubs know neither _content_type nor plain-dict bodies.
        self.custom: Any = client.CustomObjectsApi(api)
        self.core: Any = client.CoreV1Api(api)
        self.taint_rule_version: str | None = None
        """The resource.k8s.io version that serves DeviceTaintRules (:meth:`discover_taint_rules`);
        None: not served."""
        self.may_write: Callable[[], bool] = lambda: True
        """Checked before every write to claims, slices and classes: a standby, or an active
        instance past its renew deadline, sends none (see :mod:`dra_operator.watch.peering`)."""

    def _fence(self, what: str) -> None:
        if not self.may_write():
            raise NotActive(f"not the active instance: {what} not written")

    @property
    def api_version(self) -> str:
        return f"{RESOURCE_GROUP}/{self.version}"

    # -- resource.k8s.io ---------------------------------------------------------------------------

    async def list_snapshot(self, plural: str, *, page_size: int = 0) -> Listing:
        """All objects of a resource.k8s.io resource, at once (see :meth:`snapshot_pages`)."""
        return await _collect(self.snapshot_pages(plural, page_size=page_size))

    async def snapshot_pages(self, plural: str, *, page_size: int = 0) -> AsyncGenerator[Listing, None]:
        """The objects of a resource.k8s.io resource, one page of ``page_size`` (default
        :data:`PAGE_SIZE`) at a time. The
        pages of one list are one consistent snapshot, at the first page's resourceVersion, which
        every page carries."""
        kind = {
            "resourceclaims": "ResourceClaim",
            "resourceslices": "ResourceSlice",
            "deviceclasses": "DeviceClass",
        }[plural]

        async def get(cont: str | None) -> dict[str, Any]:
            kwargs: dict[str, Any] = {"limit": page_size or PAGE_SIZE}
            if cont:
                kwargs["_continue"] = cont
            page: dict[str, Any] = await self.custom.list_cluster_custom_object(
                RESOURCE_GROUP, self.version, plural, **kwargs
            )
            for item in page.get("items") or []:
                item.setdefault("apiVersion", self.api_version)
                item.setdefault("kind", kind)
            return page

        async for listing in _paged(get):
            yield listing

    async def watch(
        self,
        plural: str,
        *,
        resource_version: str,
        server_timeout_s: int,
        client_timeout_s: float,
        connect_timeout_s: float,
        inactivity_timeout_s: float,
    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """Watch a resource.k8s.io resource cluster-wide from ``resource_version``: yields (type,
        object) for ADDED, MODIFIED, DELETED and BOOKMARK until the server ends the stream. Raises
        :class:`Expired` on 410 Gone (as an HTTP status or as an ERROR event), and
        :class:`WatchInactive` when no byte came for ``inactivity_timeout_s``."""
        async for item in self._watch(
            f"/apis/{RESOURCE_GROUP}/{self.version}/{plural}",
            [],
            resource_version=resource_version,
            server_timeout_s=server_timeout_s,
            client_timeout_s=client_timeout_s,
            connect_timeout_s=connect_timeout_s,
            inactivity_timeout_s=inactivity_timeout_s,
        ):
            yield item

    def watch_peering(
        self,
        *,
        name: str,
        resource_version: str,
        server_timeout_s: int,
        client_timeout_s: float,
        connect_timeout_s: float,
        inactivity_timeout_s: float,
    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """Watch the one ClusterKopfPeering object ``name`` (see :meth:`watch`)."""
        return self._watch(
            "/apis/kopf.dev/v1/clusterkopfpeerings",
            [("fieldSelector", f"metadata.name={name}")],
            resource_version=resource_version,
            server_timeout_s=server_timeout_s,
            client_timeout_s=client_timeout_s,
            connect_timeout_s=connect_timeout_s,
            inactivity_timeout_s=inactivity_timeout_s,
        )

    async def _watch(
        self,
        path: str,
        query: list[tuple[str, str]],
        *,
        resource_version: str,
        server_timeout_s: int,
        client_timeout_s: float,
        connect_timeout_s: float,
        inactivity_timeout_s: float,
    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        # sock_read is the inactivity deadline: aiohttp restarts it on every byte received, so a
        # stream stalled without failing (no data, no FIN, no RST) ends after it, while a quiet
        # healthy one keeps going on the API server's bookmarks. The total deadline is the backstop
        # for a stream the server does not end after timeoutSeconds.
        timeout = aiohttp.ClientTimeout(
            total=client_timeout_s, sock_connect=connect_timeout_s, sock_read=inactivity_timeout_s
        )
        silent = f"no data for {inactivity_timeout_s:g} s, not even a bookmark"
        try:
            response = await self._call_watch(
                path=path,
                query=query,
                resource_version=resource_version,
                server_timeout_s=server_timeout_s,
                client_timeout=timeout,
            )
        except aiohttp.SocketTimeoutError as exc:
            raise WatchInactive(f"no response: {silent}") from exc
        raw = response[0] if isinstance(response, tuple) else response
        try:
            if raw.status == 410:
                raise Expired(await raw.text())
            if raw.status >= 400:
                raise await _api_error(raw)
            # Objects can be larger than aiohttp's line limit: split the stream into lines here.
            pending = bytearray()
            chunks = raw.content.iter_any()
            while True:
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                except aiohttp.SocketTimeoutError as exc:
                    raise WatchInactive(silent) from exc
                pending += chunk
                start = 0
                while (end := pending.find(b"\n", start)) >= 0:
                    line, start = bytes(pending[start:end]), end + 1
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = str(event.get("type", "")), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise Expired(str(obj.get("message", "")))
                        raise ApiException(status=obj.get("code"), reason=str(obj.get("message", "")))
                    yield kind, obj
                del pending[:start]
        finally:
            raw.release()

    async def _call_watch(
        self,
        *,
        path: str,
        query: list[tuple[str, str]],
        resource_version: str,
        server_timeout_s: int,
        client_timeout: aiohttp.ClientTimeout,
    ) -> Any:
        return await self.api.call_api(
            path,
            "GET",
            query_params=[
                *query,
                ("watch", "true"),
                ("allowWatchBookmarks", "true"),
                ("resourceVersion", resource_version),
                ("timeoutSeconds", str(server_timeout_s)),
            ],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=client_timeout,
        )

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

    async def _merge_patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A merge patch of ``path``; the object the server returns. Every allocation is one of
        these, so it skips the generated client's layers (which copy the body recursively, and quote
        and check every parameter) and sends the JSON through the client's own REST session,
        headers and authentication. Errors are raised as the generated client raises them (status,
        reason, body, headers), then translated (:class:`Conflict`, :class:`Gone`)."""
        api = self.api
        headers: dict[str, Any] = {
            **api.default_headers,
            "Accept": "application/json",
            "Content-Type": MERGE_PATCH,
        }
        if api.cookie:
            headers["Cookie"] = api.cookie
        await api.update_params_for_auth(headers, [], ["BearerToken"])
        raw = await api.rest_client.request(
            "PATCH",
            f"{api.configuration.host}{path}",
            headers=headers,
            body=dict(body),
            _preload_content=False,
        )
        try:
            data = await raw.read()
        finally:
            raw.release()
        if not 200 <= raw.status <= 299:
            error = ApiException(status=raw.status, reason=raw.reason)
            error.body = data.decode("utf-8", "replace")
            error.headers = raw.headers
            translated = _translate(error)
            if translated is error:
                raise error
            raise translated from error
        obj: dict[str, Any] = json.loads(data)
        return obj

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
            raise _translate(exc) from exc
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
            raise _translate(exc) from exc

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
            raise _translate(exc) from exc
        return True

    async def list_taint_rules(self, label: str) -> list[str]:
        """The names of the DeviceTaintRules that carry ``label``."""
        page = await self.custom.list_cluster_custom_object(
            RESOURCE_GROUP, self.taint_rule_version, "devicetaintrules", label_selector=label
        )
        return [str(item["metadata"]["name"]) for item in page.get("items", [])]

    # -- core --------------------------------------------------------------------------------------

    async def list_nodes(self) -> list[dict[str, Any]]:
        return (await self.list_core("nodes")).items

    async def list_pods(self) -> list[dict[str, Any]]:
        return (await self.list_core("pods")).items

    async def list_core(self, plural: str) -> Listing:
        """All nodes or pods (cluster-wide), at once (see :meth:`core_pages`)."""
        return await _collect(self.core_pages(plural))

    async def core_pages(self, plural: str) -> AsyncGenerator[Listing, None]:
        """All nodes or pods (cluster-wide), one page of :data:`PAGE_SIZE` at a time, as one
        snapshot at the first page's resourceVersion, which every page carries."""

        async def get(cont: str | None) -> dict[str, Any]:
            query = f"?limit={PAGE_SIZE}"
            if cont:
                query += f"&continue={quote(cont, safe='')}"
            return (await self._raw_get(f"/api/v1/{plural}{query}")) or {}

        async for listing in _paged(get):
            yield listing

    async def _raw_get(self, path: str) -> dict[str, Any] | None:
        """GET a core object as plain JSON; None on 404. (Without preloading, the client does not
        raise on HTTP errors, so the status is checked here.)"""
        response = await self.api.call_api(
            path,
            "GET",
            auth_settings=["BearerToken"],
            _preload_content=False,
            header_params={"Accept": "application/json"},
        )
        raw = response[0] if isinstance(response, tuple) else response
        if raw.status == 404:
            return None
        if raw.status >= 400:
            raise await _api_error(raw)
        data: dict[str, Any] = await raw.json()
        return data

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
        # An Event is an explanation, not state: losing one must not fail the reconcile.
        try:
            # The reply is not turned into a V1Event (its timestamps go through dateutil): at one
            # Event per allocation that was a noticeable share of the operator's CPU. Without
            # preloading, the client does not raise on HTTP errors: the status is checked here.
            raw = await self.core.create_namespaced_event(namespace, body, _preload_content=False)
            text = await raw.text()
        except (TimeoutError, ApiException, aiohttp.ClientError) as exc:
            logger.warning("could not post %s event %s on %s: %s", type_, reason, involved.get("name"), exc)
            return
        if raw.status >= 400:
            logger.warning(
                "could not post %s event %s on %s: HTTP %d %s",
                type_,
                reason,
                involved.get("name"),
                raw.status,
                text[:200],
            )

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


async def server_version(api_client: client.ApiClient) -> str:
    """The API server's release as ``/version`` reports it (``v1.37.2``)."""
    info = await client.VersionApi(api_client).get_code()
    return str(info.git_version)
