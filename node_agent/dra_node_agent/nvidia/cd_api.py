"""What the compute-domain driver reads and writes in the API server: the agent's client module.

- ComputeDomains by UID, from a list-and-watch cache of every namespace's (a channel claim names
  its domain only by UID, and its namespace must be the domain's); started on first use;
- the domain's cliques in the driver's namespace, one GET each;
- this node's labels: the domain label a channel claim sets and removes, and ``nvidia.com/gpu.clique``.
  Writes carry the node's resourceVersion, so a label someone else changed meanwhile is read again,
  never overwritten blindly; an admission policy lets the agent change only its own node's two labels.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api import computedomains as cd
from dra_api.kube import ApiClient, get_namespaced_or_none, request_error_text

logger = logging.getLogger(__name__)

WATCH_SERVER_TIMEOUT_S: Final = 300
LABEL_ATTEMPTS: Final = 5


class ApiUnavailable(Exception):
    """A read or write the API server did not answer (in time); the message says which."""


class DomainApi:
    """The compute-domain driver's calls; one instance per agent."""

    def __init__(self, *, api: ApiClient, node_name: str, namespace: str, request_timeout: float) -> None:
        self.node_name = node_name
        self.namespace = namespace
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        self._watch_timeout = aiohttp.ClientTimeout(
            total=WATCH_SERVER_TIMEOUT_S + 30, sock_connect=request_timeout, sock_read=90
        )
        self._domains: dict[str, cd.ComputeDomain] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- domains ------------------------------------------------------------------------------------

    async def domain(self, uid: str, *, wait_s: float) -> cd.ComputeDomain | None:
        """The domain of ``uid`` as the cache has it (None: none such); waits up to ``wait_s`` for
        the cache's first listing, ``ApiUnavailable`` when it has none by then."""
        if self._task is None:
            self._task = asyncio.create_task(self._watch_loop(), name="compute-domain-watch")
        if not self._synced.is_set():
            try:
                await asyncio.wait_for(self._synced.wait(), timeout=wait_s)
            except TimeoutError:
                raise ApiUnavailable("ComputeDomains could not be listed yet") from None
        return self._domains.get(uid)

    def _take(self, obj: Mapping[str, Any]) -> None:
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        try:
            self._domains[uid] = cd.ComputeDomain.from_json(obj)
        except cd.DomainError as exc:
            logger.warning("ignoring a ComputeDomain: %s", exc)
            self._domains.pop(uid, None)

    async def _list(self) -> str:
        listing = await self._custom.list_cluster_custom_object(
            cd.GROUP, cd.VERSION, cd.DOMAIN_PLURAL, _request_timeout=self._timeout
        )
        self._domains.clear()
        for obj in listing.get("items") or []:
            self._take(obj)
        self._synced.set()
        return str((listing.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch_loop(self) -> None:
        backoff = 1.0
        while True:
            try:
                version = await self._list()
                async with watch.Watch() as stream:
                    async for event in stream.stream(
                        self._custom.list_cluster_custom_object,
                        cd.GROUP,
                        cd.VERSION,
                        cd.DOMAIN_PLURAL,
                        resource_version=version,
                        timeout_seconds=WATCH_SERVER_TIMEOUT_S,
                        allow_watch_bookmarks=True,
                        _request_timeout=self._watch_timeout,
                    ):
                        kind = event.get("type")
                        obj = event.get("object") or {}
                        if kind == "ERROR":
                            break
                        if kind == "DELETED":
                            self._domains.pop(str(obj.get("metadata", {}).get("uid") or ""), None)
                        elif kind in ("ADDED", "MODIFIED"):
                            self._take(obj)
                backoff = 1.0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the cache must survive any API hiccup; it lists again
                logger.warning("ComputeDomain watch failed: %s", request_error_text(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def fresh_domain(self, domain: cd.ComputeDomain) -> cd.ComputeDomain | None:
        """The domain as the API server has it now (None: gone, or replaced under its name)."""
        obj = await get_namespaced_or_none(
            self._custom,
            group=cd.GROUP,
            version=cd.VERSION,
            namespace=domain.namespace,
            plural=cd.DOMAIN_PLURAL,
            name=domain.name,
            request_timeout=self._timeout,
            what=f"ComputeDomain {domain.key}",
            fail=ApiUnavailable,
        )
        fresh = cd.ComputeDomain.from_json(obj) if obj is not None else None
        return fresh if fresh is not None and fresh.uid == domain.uid else None

    async def clique(self, name: str) -> cd.Clique | None:
        obj = await get_namespaced_or_none(
            self._custom,
            group=cd.GROUP,
            version=cd.VERSION,
            namespace=self.namespace,
            plural=cd.CLIQUE_PLURAL,
            name=name,
            request_timeout=self._timeout,
            what=f"ComputeDomainClique {name}",
            fail=ApiUnavailable,
        )
        return cd.Clique.from_json(obj) if obj is not None else None

    # -- this node's labels -------------------------------------------------------------------------

    async def node_label(self, key: str) -> tuple[str | None, str]:
        """This node's label ``key`` (None: unset) and the node's resourceVersion."""
        try:
            node = await self._core.read_node(self.node_name, _request_timeout=self._timeout)
        except (ApiException, TimeoutError, aiohttp.ClientError) as exc:
            raise ApiUnavailable(f"reading node {self.node_name}: {request_error_text(exc)}") from exc
        labels = node.metadata.labels or {}
        return labels.get(key), str(node.metadata.resource_version or "")

    async def set_node_label(self, key: str, value: str | None, *, unless: Any = None) -> str | None:
        """Set (or with None remove) this node's label ``key``, read afresh before each try; the
        label's value before. ``unless(current)`` may refuse the change by returning a reason
        (raised as ``ValueError``); a change that is already so is not written."""
        for _ in range(LABEL_ATTEMPTS):
            current, version = await self.node_label(key)
            if unless is not None and (reason := unless(current)):
                raise ValueError(reason)
            if current == value:
                return current
            body = {"metadata": {"resourceVersion": version, "labels": {key: value}}}
            try:
                await self._core.patch_node(self.node_name, body, _request_timeout=self._timeout)
            except ApiException as exc:
                if exc.status == 409:
                    continue  # changed meanwhile: read it again
                raise ApiUnavailable(f"labelling node {self.node_name}: {request_error_text(exc)}") from exc
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise ApiUnavailable(f"labelling node {self.node_name}: {request_error_text(exc)}") from exc
            return current
        raise ApiUnavailable(
            f"labelling node {self.node_name}: it kept changing under {LABEL_ATTEMPTS} tries"
        )

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
