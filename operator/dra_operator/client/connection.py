"""What every part of :class:`~dra_operator.client.kubeapi.KubeApi` shares: the client and its
session, the resource.k8s.io version served, the write fence, and the two requests that skip the
generated client (a plain GET, a merge patch)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api.names import RESOURCE_GROUP
from dra_operator.client.errors import NotActive, api_error, translate

MERGE_PATCH = "application/merge-patch+json"


class Connection:
    """The state the parts of :class:`~dra_operator.client.kubeapi.KubeApi` share, and the
    requests they send past the generated client."""

    def __init__(self, api: client.ApiClient, *, resource_version: str, instance: str) -> None:
        self.api = api
        self.version = resource_version
        self.instance = instance
        # Typed as Any: the client's stubs know neither _content_type nor plain-dict bodies.
        self.custom: Any = client.CustomObjectsApi(api)
        self.core: Any = client.CoreV1Api(api)
        self.taint_rule_version: str | None = None
        """The resource.k8s.io version that serves DeviceTaintRules (``discover_taint_rules``);
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
            raise await api_error(raw)
        data: dict[str, Any] = await raw.json()
        return data

    async def _merge_patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A merge patch of ``path``; the object the server returns. Every allocation is one of
        these, so it skips the generated client's layers (which copy the body recursively, and quote
        and check every parameter) and sends the JSON through the client's own REST session,
        headers and authentication. Errors are raised as the generated client raises them (status,
        reason, body, headers), then translated (:class:`~dra_operator.client.errors.Conflict`,
        :class:`~dra_operator.client.errors.Gone`)."""
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
            translated = translate(error)
            if translated is error:
                raise error
            raise translated from error
        obj: dict[str, Any] = json.loads(data)
        return obj
