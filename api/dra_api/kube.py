"""Kubernetes client construction and discovery of the served resource.k8s.io version.

Both components talk to the API with ``kubernetes_asyncio``. Which ``resource.k8s.io`` version a
server serves is discovered at start-up, never assumed (``v1`` on 1.34+, ``v1beta2``/``v1beta1``
on older or specially configured servers).

Start-up errors are one line each, for the command lines to print: :class:`ClusterConfigError` when
no connection can be configured at all (retrying cannot help), :class:`ClusterUnreachable` when the
API server did not answer the first request (it may still come up), :class:`UnsupportedServer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

import aiohttp
import yaml
from aiohttp import hdrs
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException
from yarl import URL

from dra_api.names import RESOURCE_GROUP, RESOURCE_VERSIONS

log = logging.getLogger(__name__)

# The client as modules that only hand it on name it, so that only client modules import
# kubernetes_asyncio (an import contract of each program).
ApiClient: TypeAlias = client.ApiClient


class UnsupportedServer(RuntimeError):
    """The API server serves none of the resource.k8s.io versions this project speaks."""


class ClusterConfigError(RuntimeError):
    """No connection to an API server can be configured: a kubeconfig file that is missing or
    malformed, or none given outside a pod. Retrying cannot help; the message is one line."""


class ClusterUnreachable(RuntimeError):
    """The API server did not answer a start-up request: refused, timed out, TLS or HTTP error."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def check_connection_config(kubeconfig: str | Path | None) -> None:
    """Raise :class:`ClusterConfigError` unless a connection can be configured: each kubeconfig
    file named (``KUBECONFIG`` style, separated by ``os.pathsep``; as kubectl, missing entries of
    a list are skipped, but one must exist) is a readable YAML mapping, or, with none, this runs in
    a pod. Blocking and local: for a command line to check before it starts anything.

    kubernetes_asyncio skips a missing file silently and then fails on the empty configuration
    ("Expected key current-context"), and outside a pod says only "Service host/port is not set"."""
    if kubeconfig is None:
        if not (os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("KUBERNETES_SERVICE_PORT")):
            raise ClusterConfigError(
                "no kubeconfig given (--kubeconfig or KUBECONFIG) and not running in a pod "
                "(KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set)"
            )
        try:
            config.load_incluster_config(client_configuration=client.Configuration())  # type: ignore[no-untyped-call]
        except ConfigException as exc:
            raise ClusterConfigError(f"in-cluster configuration: {_one_line(exc)}") from None
        return
    paths = [Path(p) for p in str(kubeconfig).split(os.pathsep) if p]
    existing = [p for p in paths if p.exists()]
    if not existing:
        raise ClusterConfigError(f"kubeconfig {kubeconfig}: no such file")
    for path in existing:
        _check_kubeconfig_file(path)


def _check_kubeconfig_file(path: Path) -> None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else _one_line(exc)
        raise ClusterConfigError(f"kubeconfig {path}: cannot read it: {reason}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or _one_line(exc)
        raise ClusterConfigError(f"kubeconfig {path}: not valid YAML{at}: {problem}") from None
    if not isinstance(doc, dict):
        raise ClusterConfigError(
            f"kubeconfig {path}: not a kubeconfig (expected a mapping with clusters, contexts and users)"
        )


async def make_api_client(
    *, kubeconfig: str | Path | None = None, context: str | None = None
) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, or from the in-cluster ServiceAccount when none is given.

    Raises :class:`ClusterConfigError` when the configuration cannot work (see
    :func:`check_connection_config`, which it applies first)."""
    check_connection_config(kubeconfig)
    configuration = client.Configuration()
    try:
        if kubeconfig is not None:
            await config.load_kube_config(
                config_file=str(kubeconfig), context=context, client_configuration=configuration
            )
        else:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    # kubernetes_asyncio reports a kubeconfig's missing keys as ConfigException, wrong shapes
    # (a list where a mapping belongs) as TypeError and bad base64 data as ValueError.
    except (ConfigException, TypeError, ValueError) as exc:
        raise ClusterConfigError(f"kubeconfig {kubeconfig}: {_one_line(exc)}") from None
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


async def first_resource_version(api: client.ApiClient, *, request_timeout_s: float) -> str:
    """:func:`preferred_resource_version` as a program's first request: an API server that does not
    answer it within ``request_timeout_s`` seconds, or answers with an error, raises
    :class:`ClusterUnreachable`, one line naming the server and what went wrong.
    :class:`UnsupportedServer` passes through."""
    server = api.configuration.host
    try:
        return await asyncio.wait_for(preferred_resource_version(api), request_timeout_s)
    except TimeoutError:
        raise ClusterUnreachable(
            f"the API server {server} did not answer within {request_timeout_s:g} s"
        ) from None
    except ApiException as exc:
        raise ClusterUnreachable(
            f"the API server {server} refused the discovery request: HTTP {exc.status} {exc.reason}"
        ) from None
    except aiohttp.ClientConnectorError as exc:
        # Its text repeats the address; the errno says it plainly ("Connection refused"). TLS
        # errors carry OpenSSL's codes in errno, so they keep their own text.
        code = exc.os_error.errno
        tls = isinstance(exc, aiohttp.ClientSSLError)
        if isinstance(code, int) and code in errno.errorcode and not tls:
            reason = os.strerror(code)
        else:
            reason = _one_line(exc)
        raise ClusterUnreachable(f"cannot reach the API server {server}: {reason}") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise ClusterUnreachable(
            f"cannot reach the API server {server}: {_one_line(exc) or type(exc).__name__}"
        ) from None


def request_error_text(exc: BaseException) -> str:
    """A failed request's reason on one line: ``HTTP <status> <reason>``, or the client error."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return _one_line(exc)[:200] or type(exc).__name__


async def get_namespaced_or_none(
    custom: Any,
    *,
    group: str,
    version: str,
    namespace: str,
    plural: str,
    name: str,
    request_timeout: aiohttp.ClientTimeout,
    what: str,
    fail: Callable[[str], Exception],
) -> dict[str, Any] | None:
    """A namespaced custom object (``custom``: a ``CustomObjectsApi``) as JSON; None when it does
    not exist. Any other failure is raised as ``fail("reading <what>: <reason>")``."""
    try:
        obj = await custom.get_namespaced_custom_object(
            group, version, namespace, plural, name, _request_timeout=request_timeout
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise fail(f"reading {what}: {request_error_text(exc)}") from exc
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise fail(f"reading {what}: {request_error_text(exc)}") from exc
    return dict(obj)
