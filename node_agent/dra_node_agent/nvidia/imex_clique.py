"""An IMEX daemon's place in its ComputeDomainClique: the part of ``compute-domain-daemon`` that
talks to the API server (the process around it, which renders the IMEX config and runs
``nvidia-imex``, is ``dra_node_agent.imexdaemon``).

As NVIDIA's daemon does it: the clique ``<domain UID>.<clique ID>`` in the driver's namespace,
labelled with both, lists one entry per daemon (``nodeName``, ``ipAddress``, ``cliqueID``,
``index``, ``status``). A daemon joins with the smallest index no other daemon holds (its DNS name
``compute-domain-daemon-<index>`` in every daemon's nodes file), keeps its index when it joins
again (a restart with a new IP address), turns Ready or NotReady, and leaves on shutdown. Every
write carries the clique's resourceVersion, so two daemons joining at once never take one index:
the loser reads the clique again and takes the next.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api import computedomains as cd
from dra_api.kube import ApiClient, get_namespaced_or_none, request_error_text

logger = logging.getLogger(__name__)

ATTEMPTS: Final = 10


class CliqueError(Exception):
    """The clique could not be read or written (in time), or has no free index; the message says which."""


class CliqueMembership:
    """One daemon's entry in its domain's clique."""

    def __init__(
        self,
        *,
        api: ApiClient,
        namespace: str,
        domain_uid: str,
        clique_id: str,
        node_name: str,
        max_nodes: int = cd.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN,
        request_timeout: float = 10.0,
    ) -> None:
        self.namespace = namespace
        self.domain_uid = domain_uid
        self.clique_id = clique_id
        self.node_name = node_name
        self.max_nodes = max_nodes
        self.name = cd.clique_name(domain_uid, clique_id)
        self._custom = client.CustomObjectsApi(api)
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)

    async def join(self, *, ip_address: str) -> int:
        """Add (or update) this node's entry, NotReady; returns its index."""

        def change(daemons: list[dict[str, Any]]) -> list[dict[str, Any]]:
            mine = next((d for d in daemons if d.get("nodeName") == self.node_name), None)
            used = {d.get("index") for d in daemons if d is not mine}
            index = mine.get("index") if mine is not None else None
            if not isinstance(index, int) or index in used or not 0 <= index < self.max_nodes:
                index = next((i for i in range(self.max_nodes) if i not in used), None)
            if index is None:
                raise CliqueError(
                    f"clique {self.name} has no free index: {self.max_nodes} daemons joined already "
                    "(--max-nodes-per-imex-domain)"
                )
            entry = cd.DomainNode(
                name=self.node_name,
                ip_address=ip_address,
                clique_id=self.clique_id,
                index=index,
                status=cd.NOT_READY,
            ).to_clique_json()
            return [d for d in daemons if d is not mine] + [entry]

        daemons = await self._update(change, create=True)
        return int(next(d["index"] for d in daemons if d.get("nodeName") == self.node_name))

    async def daemons(self) -> list[dict[str, Any]] | None:
        """The clique's entries as they are now; None when the clique does not exist."""
        current = await self._get()
        if current is None:
            return None
        return [dict(d) for d in current.get("daemons") or [] if isinstance(d, dict)]

    async def set_status(self, status: str) -> None:
        """This node's entry Ready or NotReady (it must have joined)."""

        def change(daemons: list[dict[str, Any]]) -> list[dict[str, Any]]:
            if not any(d.get("nodeName") == self.node_name for d in daemons):
                raise CliqueError(f"clique {self.name}: node {self.node_name} has not joined")
            return [{**d, "status": status} if d.get("nodeName") == self.node_name else d for d in daemons]

        await self._update(change, create=False)

    async def leave(self) -> None:
        """Remove this node's entry (nothing to do when it has none, or the clique is gone)."""

        def change(daemons: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [d for d in daemons if d.get("nodeName") != self.node_name]

        try:
            await self._update(change, create=False)
        except _Missing:
            return

    async def _update(
        self, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], *, create: bool
    ) -> list[dict[str, Any]]:
        """Read the clique, apply ``change`` to its daemons, write them under its resourceVersion;
        again on a conflict. Creates the clique when ``create`` and it does not exist."""
        for _ in range(ATTEMPTS):
            current = await self._get()
            if current is None:
                if not create:
                    raise _Missing(self.name)
                daemons = change([])
                if await self._create(daemons):
                    return daemons
                continue  # another daemon created it meanwhile
            before = [dict(d) for d in current.get("daemons") or []]
            daemons = change(before)
            if daemons == before:
                return daemons
            version = str((current.get("metadata") or {}).get("resourceVersion") or "")
            if await self._patch(daemons, version=version):
                return daemons
        raise CliqueError(f"clique {self.name}: it kept changing under {ATTEMPTS} tries")

    async def _get(self) -> dict[str, Any] | None:
        return await get_namespaced_or_none(
            self._custom,
            group=cd.GROUP,
            version=cd.VERSION,
            namespace=self.namespace,
            plural=cd.CLIQUE_PLURAL,
            name=self.name,
            request_timeout=self._timeout,
            what=f"clique {self.name}",
            fail=CliqueError,
        )

    async def _create(self, daemons: list[dict[str, Any]]) -> bool:
        body = {
            "apiVersion": cd.API_VERSION,
            "kind": cd.CLIQUE_KIND,
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {cd.DOMAIN_LABEL: self.domain_uid, cd.CLIQUE_LABEL: self.clique_id},
            },
            "daemons": daemons,
        }
        try:
            await self._custom.create_namespaced_custom_object(
                cd.GROUP, cd.VERSION, self.namespace, cd.CLIQUE_PLURAL, body, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise CliqueError(f"creating clique {self.name}: {request_error_text(exc)}") from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise CliqueError(f"creating clique {self.name}: {request_error_text(exc)}") from exc
        return True

    async def _patch(self, daemons: list[dict[str, Any]], *, version: str) -> bool:
        """Replace the daemons list (a merge patch replaces lists whole), only at ``version``."""
        body = {"metadata": {"resourceVersion": version}, "daemons": daemons}
        try:
            # A merge patch: the client would pick a JSON patch for a custom object, and takes the
            # content type as a keyword its signature does not declare.
            await self._custom.patch_namespaced_custom_object(  # type: ignore[call-arg]
                cd.GROUP,
                cd.VERSION,
                self.namespace,
                cd.CLIQUE_PLURAL,
                self.name,
                body,
                _content_type="application/merge-patch+json",
                _request_timeout=self._timeout,
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            if exc.status == 404:
                raise _Missing(self.name) from exc
            raise CliqueError(f"writing clique {self.name}: {request_error_text(exc)}") from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise CliqueError(f"writing clique {self.name}: {request_error_text(exc)}") from exc
        return True


class _Missing(CliqueError):
    """The clique does not exist (any more)."""
