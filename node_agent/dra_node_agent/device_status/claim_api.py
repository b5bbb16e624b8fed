"""The two requests of a device status write: GET the claim, PUT its ``/status`` subresource.

A PUT carries the resourceVersion it read, so a claim changed meanwhile (the scheduler reserving
it, another driver's entries) fails with 409 and the write starts over from a fresh GET: nothing
anyone else wrote is lost. Its verb is ``update``, so RBAC needs nothing for ``patch``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, Protocol, TypeAlias

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api.kubeletapi.model import ClaimRef
from dra_api.names import RESOURCE_GROUP

PLURAL = "resourceclaims"

# What the requests raise: an HTTP error (``status``, ``reason``, ``body``), or a failure to get an
# answer at all. The writer knows them by these names, so that only client modules import the client.
HttpError: TypeAlias = ApiException
TRANSPORT_ERRORS: Final = (aiohttp.ClientError, TimeoutError)


def error_message(exc: ApiException) -> str:
    """The Status message of an API error, else its reason."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or "")


class ClaimStatusApi(Protocol):
    """Raises ``HttpError`` for an HTTP error, one of ``TRANSPORT_ERRORS`` otherwise."""

    async def get(self, ref: ClaimRef) -> dict[str, Any]: ...

    async def replace_status(self, ref: ClaimRef, body: Mapping[str, Any]) -> dict[str, Any]: ...


class KubeClaimStatusApi:
    """Through the agent's API client, in the served ``resource.k8s.io`` version; each request has
    a deadline."""

    def __init__(self, *, api: client.ApiClient, api_version: str, request_timeout: float) -> None:
        self._custom = client.CustomObjectsApi(api)
        self.api_version = api_version
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)

    async def get(self, ref: ClaimRef) -> dict[str, Any]:
        obj: Any = await self._custom.get_namespaced_custom_object(
            RESOURCE_GROUP, self.api_version, ref.namespace, PLURAL, ref.name, _request_timeout=self._timeout
        )
        return dict(obj)

    async def replace_status(self, ref: ClaimRef, body: Mapping[str, Any]) -> dict[str, Any]:
        obj: Any = await self._custom.replace_namespaced_custom_object_status(
            RESOURCE_GROUP,
            self.api_version,
            ref.namespace,
            PLURAL,
            ref.name,
            dict(body),
            _request_timeout=self._timeout,
        )
        return dict(obj)
