"""The API calls of ``dra-operator release-claims``: the claims that carry the operator's finalizer,
releasing one, and stopping the operator's Deployment.

Every way the API server can fail is one :class:`CannotAsk` or :class:`Refused` with its reason, so
the command above answers in one line without knowing the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException

from dra_api.kube import (
    ClusterConfigError,
    ClusterUnreachable,
    UnsupportedServer,
    first_resource_version,
    make_api_client,
)
from dra_api.names import OPERATOR_FINALIZER, RESOURCE_GROUP

PLURAL: Final = "resourceclaims"
MERGE_PATCH: Final = "application/merge-patch+json"
STOP_TIMEOUT_S: Final = 120.0
FIRST_REQUEST_TIMEOUT_S: Final = 60.0
"""An API server that does not answer the first request in this long is reported as unreachable."""


class CannotAsk(Exception):
    """The API server could not be asked (configuration, connection, an operator that would not stop)."""


class Refused(Exception):
    """The API server answered with an error."""


class ClaimGone(Exception):
    """The claim was deleted meanwhile."""


class ClaimChanged(Exception):
    """The claim changed since it was read."""


def _refused(exc: ApiException) -> Refused:
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body)
    return Refused(f"{exc.status} {exc.reason}: {body}")


class FinalizerApi:
    """The claims of every namespace, as one resource.k8s.io version serves them."""

    def __init__(self, api: client.ApiClient, *, version: str) -> None:
        # A CustomObjectsApi, typed as Any: its stubs do not know ``_content_type``.
        self._custom: Any = client.CustomObjectsApi(api)
        self._api = api
        self._version = version

    async def claims(self) -> list[dict[str, Any]]:
        try:
            listed: Any = await self._custom.list_cluster_custom_object(RESOURCE_GROUP, self._version, PLURAL)
        except ApiException as exc:
            raise _refused(exc) from exc
        return list(listed.get("items") or [])

    async def release(
        self,
        *,
        namespace: str,
        name: str,
        resource_version: str,
        finalizers: tuple[str, ...],
        allocated: bool,
    ) -> None:
        """Deallocate (status first, preconditioned on the version read), then drop the finalizer."""
        try:
            if allocated:
                written: Any = await self._custom.patch_namespaced_custom_object_status(
                    RESOURCE_GROUP,
                    self._version,
                    namespace,
                    PLURAL,
                    name,
                    {
                        "metadata": {"resourceVersion": resource_version},
                        "status": {"allocation": None, "devices": None, "reservedFor": None},
                    },
                    _content_type=MERGE_PATCH,
                )
                resource_version = str(written["metadata"]["resourceVersion"])
            await self._custom.patch_namespaced_custom_object(
                RESOURCE_GROUP,
                self._version,
                namespace,
                PLURAL,
                name,
                {
                    "metadata": {
                        "resourceVersion": resource_version,
                        "finalizers": [f for f in finalizers if f != OPERATOR_FINALIZER],
                    }
                },
                _content_type=MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status == 404:
                raise ClaimGone from exc
            if exc.status == 409:
                raise ClaimChanged from exc
            raise _refused(exc) from exc

    async def stop_operator(self, target: str) -> None:
        """Scale the operator's Deployment (``namespace/name``) to 0 and wait until none of its pods
        is left, terminating ones included: the Deployment stops counting a pod once it is
        terminating, but until it is gone its operator may still take over from the other and
        allocate a claim released meanwhile."""
        namespace, _, name = target.partition("/")
        apps: Any = client.AppsV1Api(self._api)
        core: Any = client.CoreV1Api(self._api)
        try:
            await apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": 0}})
            deadline = asyncio.get_running_loop().time() + STOP_TIMEOUT_S
            while True:
                deployment: Any = await apps.read_namespaced_deployment(name, namespace)
                labels = deployment.spec.selector.match_labels or {}
                selector = ",".join(f"{k}={v}" for k, v in labels.items())
                pods: Any = await core.list_namespaced_pod(namespace, label_selector=selector)
                if not deployment.status.replicas and not pods.items:
                    return
                if asyncio.get_running_loop().time() > deadline:
                    raise CannotAsk(
                        f"the operator {target} still runs {STOP_TIMEOUT_S:.0f} s after scaling it to 0"
                    )
                await asyncio.sleep(1)
        except ApiException as exc:
            raise _refused(exc) from exc


@asynccontextmanager
async def finalizer_api(kubeconfig: str | None) -> AsyncIterator[FinalizerApi]:
    """A :class:`FinalizerApi` from ``kubeconfig`` (None: the pod's ServiceAccount), closed after."""
    try:
        api = await make_api_client(kubeconfig=kubeconfig)
    except (ClusterConfigError, ClusterUnreachable, UnsupportedServer) as exc:
        raise CannotAsk(str(exc)) from exc
    except (ConfigException, OSError) as exc:
        raise CannotAsk(f"cannot ask the API server: {getattr(exc, 'reason', None) or exc}") from exc
    try:
        try:
            version = await first_resource_version(api, request_timeout_s=FIRST_REQUEST_TIMEOUT_S)
        except (ClusterConfigError, ClusterUnreachable, UnsupportedServer) as exc:
            raise CannotAsk(str(exc)) from exc
        except ApiException as exc:
            raise _refused(exc) from exc
        except OSError as exc:
            raise CannotAsk(f"cannot ask the API server: {exc}") from exc
        try:
            yield FinalizerApi(api, version=version)
        except OSError as exc:  # the connection lost on the way (aiohttp's errors are OSErrors)
            raise CannotAsk(f"cannot ask the API server: {exc}") from exc
    finally:
        await api.close()
