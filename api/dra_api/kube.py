"""Kubernetes client construction and discovery of the served resource.k8s.io version.

Both components talk to the API with ``kubernetes_asyncio``. Which ``resource.k8s.io`` version a
server serves is discovered at start-up, never assumed (``v1`` on 1.34+, ``v1beta2``/``v1beta1``
on older or specially configured servers).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from aiohttp import hdrs
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client, config
from yarl import URL

from dra_api.names import RESOURCE_GROUP, RESOURCE_VERSIONS

log = logging.getLogger(__name__)


class UnsupportedServer(RuntimeError):
    """The API server serves none of the resource.k8s.io versions this project speaks."""


async def make_api_client(
    *, kubeconfig: str | Path | None = None, context: str | None = None
) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, or from the in-cluster ServiceAccount when none is given."""
    configuration = client.Configuration()
    if kubeconfig is not None:
        await config.load_kube_config(
            config_file=str(kubeconfig), context=context, client_configuration=configuration
        )
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    api = client.ApiClient(configuration=configuration)
    _look_up_proxy_once(api)
    return api


def _look_up_proxy_once(api: client.ApiClient) -> None:
    """kubernetes_asyncio's HTTP session trusts the environment, so aiohttp looks up the proxy
    variables and ``~/.netrc`` in a worker thread on every request: two thread round trips per API
    call, a measurable share of the operator's CPU under load. The proxy (``HTTPS_PROXY`` and
    ``NO_PROXY``, as aiohttp reads them) is looked up once here instead, and the session stops
    trusting the environment. Nothing else changes: the API is never reached with netrc logins."""
    rest: Any = api.rest_client
    if not rest.proxy:
        with contextlib.suppress(LookupError):
            proxy, proxy_auth = get_env_proxy_for_url(URL(str(api.configuration.host)))
            rest.proxy = str(proxy)
            if proxy_auth is not None:
                rest.proxy_headers = {
                    **(rest.proxy_headers or {}),
                    hdrs.PROXY_AUTHORIZATION: proxy_auth.encode(),
                }
    rest.pool_manager._trust_env = False


async def served_resource_versions(api: client.ApiClient) -> list[str]:
    """The versions of resource.k8s.io the server serves, in server order."""
    groups: Any = await client.ApisApi(api).get_api_versions()
    for group in groups.groups or []:
        if group.name == RESOURCE_GROUP:
            return [v.version for v in group.versions]
    return []


async def preferred_resource_version(api: client.ApiClient) -> str:
    """The newest resource.k8s.io version both the server and this project speak."""
    served = await served_resource_versions(api)
    for version in RESOURCE_VERSIONS:
        if version in served:
            log.info("server serves %s/%s (all served: %s)", RESOURCE_GROUP, version, ", ".join(served))
            return version
    raise UnsupportedServer(
        f"the API server serves {RESOURCE_GROUP} versions {served or 'none'}; this driver needs one of "
        f"{', '.join(RESOURCE_VERSIONS)} (Kubernetes 1.34+ serves v1 by default)"
    )
