"""What every part of :class:`~dra_operator.client.kubeapi.KubeApi` shares: the client and its
session, the resource.k8s.io version served, the write fence, and the requests that skip the
generated client (a plain GET, a merge patch, a POST), the writes through the operator's own
keep-alive connections where it has them (:mod:`dra_operator.client.http11`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api.names import RESOURCE_GROUP
from dra_operator.client.errors import NotActive, api_error, translate
from dra_operator.client.http11 import ConnectionPool, pool_for, ssl_context_for

MERGE_PATCH = "application/merge-patch+json"
# The API server ends a request after its --request-timeout (60 s by default); a write waits a
# little longer for that answer before it gives up on the connection.
WRITE_TIMEOUT_S = 70.0


def write_pool(api: client.ApiClient) -> ConnectionPool | None:
    """Keep-alive connections for the writes, set up from the client's configuration; None where
    the configuration needs aiohttp (a proxy)."""
    config = api.configuration
    if not config.host:
        return None
    context = ssl_context_for(
        ca_file=config.ssl_ca_cert,
        cert_file=config.cert_file,
        key_file=config.key_file,
        verify=config.verify_ssl,
        strict=not config.disable_strict_ssl_verification,
    )
    rest: Any = api.rest_client  # its proxy: the configuration's, or the environment's (dra_api.kube)
    return pool_for(
        config.host,
        proxy=rest.proxy or config.proxy,
        ssl_context=context,
        server_hostname=config.tls_server_name,
        timeout_s=WRITE_TIMEOUT_S,
    )


class Connection:
    """The state the parts of :class:`~dra_operator.client.kubeapi.KubeApi` share, and the
    requests they send past the generated client."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        resource_version: str,
        instance: str,
        writes: ConnectionPool | None = None,
    ) -> None:
        self.api = api
        self.writes = writes
        """Where writes go; None: through the client's aiohttp session."""
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

    async def close_writes(self) -> None:
        if self.writes is not None:
            await self.writes.close()

    async def _merge_patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A merge patch of ``path``; the object the server returns."""
        data = await self._write("PATCH", path, body, content_type=MERGE_PATCH)
        obj: dict[str, Any] = json.loads(data)
        return obj

    async def _write(self, method: str, path: str, body: Mapping[str, Any], *, content_type: str) -> bytes:
        """Send a JSON body; the reply's body. Every allocation is one of these, so it skips the
        generated client's layers (which copy the body recursively, and quote and check every
        parameter), through :attr:`writes` where set, else the client's own REST session, with
        the client's headers and authentication either way. Errors are raised as the generated
        client raises them (status, reason, body, headers), then translated
        (:class:`~dra_operator.client.errors.Conflict`, :class:`~dra_operator.client.errors.Gone`)."""
        api = self.api
        headers: dict[str, Any] = {
            **api.default_headers,
            "Accept": "application/json",
            "Content-Type": content_type,
        }
        if api.cookie:
            headers["Cookie"] = api.cookie
        await api.update_params_for_auth(headers, [], ["BearerToken"])
        if self.writes is not None:
            reply = await self.writes.request(method, path, headers=headers, body=json.dumps(body).encode())
            status, reason, reply_headers, data = reply.status, reply.reason, reply.headers, reply.body
        else:
            raw = await api.rest_client.request(
                method,
                f"{api.configuration.host}{path}",
                headers=headers,
                body=dict(body),
                _preload_content=False,
            )
            try:
                data = await raw.read()
            finally:
                raw.release()
            status, reason, reply_headers = raw.status, raw.reason, raw.headers
        if not 200 <= status <= 299:
            error: Any = ApiException(status=status, reason=reason)  # stubs: body is bytes, headers a proxy
            error.body = data.decode("utf-8", "replace")
            error.headers = reply_headers
            translated = translate(error)
            if translated is error:
                raise error
            raise translated from error
        return data
