"""Lists and watches: whole resources a page at a time, and watch streams from a resourceVersion.

Kopf watches everything but ResourceClaims; these serve the operator's own claim watch and
re-lists (:mod:`dra_operator.watch.claimwatch`, :mod:`dra_operator.claims.relist`) and its peering
watch (:mod:`dra_operator.watch.peering`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api.names import RESOURCE_GROUP
from dra_operator.client.connection import Connection
from dra_operator.client.errors import Expired, WatchInactive, api_error


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


class ListsAndWatches(Connection):
    """Listings of resource.k8s.io resources, nodes and pods, and watch streams."""

    # -- listings ----------------------------------------------------------------------------------

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

    # -- watches -----------------------------------------------------------------------------------

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
        :class:`~dra_operator.client.errors.Expired` on 410 Gone (as an HTTP status or as an ERROR
        event), and :class:`~dra_operator.client.errors.WatchInactive` when no byte came for
        ``inactivity_timeout_s``."""
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
                raise await api_error(raw)
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
