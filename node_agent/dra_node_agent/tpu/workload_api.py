"""The TPU's API client: the pods, Jobs and ResourceSlices ``multihost.TpuWorkerResolver`` reads,
and the Events it writes about pods. The resolver knows them by its protocols (``WorkloadSource``,
``PodEventSink``); only this module of the TPU package talks to the API server.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api.events import event_body
from dra_api.names import RESOURCE_GROUP
from dra_node_agent.tpu.workers import SliceWorkload, WorkloadError

logger = logging.getLogger(__name__)


class KubeWorkloads:
    """``WorkloadSource`` over the API server."""

    def __init__(self, *, api: client.ApiClient, api_version: str) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._api_version = api_version

    async def pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        obj = await self._read(f"pod {namespace}/{name}", self._core.read_namespaced_pod(name, namespace))
        result: dict[str, Any] = self._api.sanitize_for_serialization(obj)
        return result

    async def job(self, namespace: str, name: str) -> Mapping[str, Any]:
        read = self._custom.get_namespaced_custom_object("batch", "v1", namespace, "jobs", name)
        return dict(await self._read(f"Job {namespace}/{name}", read))

    async def resource_slices(self, driver: str) -> list[Mapping[str, Any]]:
        listing = self._custom.list_cluster_custom_object(
            RESOURCE_GROUP, self._api_version, "resourceslices", field_selector=f"spec.driver={driver}"
        )
        body = await self._read(f"ResourceSlices of {driver}", listing)
        return list(body.get("items") or [])

    @staticmethod
    async def _read(what: str, call: Any) -> Any:
        try:
            return await call
        except ApiException as exc:
            raise WorkloadError(f"reading {what} failed: {exc.status} {exc.reason}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise WorkloadError(f"reading {what} failed: {exc!r}") from exc


class PodEvents:
    """Writes core/v1 Events about pods (``kubectl describe pod`` shows them); logs failures."""

    def __init__(self, *, api: client.ApiClient, node_name: str, component: str) -> None:
        self._core = client.CoreV1Api(api)
        self._node_name = node_name
        self._component = component
        self.written = 0

    async def record(self, *, workload: SliceWorkload, type: str, reason: str, message: str) -> None:
        involved = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": workload.namespace,
            "name": workload.pod,
            "uid": workload.pod_uid,
        }
        # The client takes the plain dict where its signature names its model class.
        body: Any = event_body(
            involved=involved,
            namespace=workload.namespace,
            type_=type,
            reason=reason,
            message=message,
            component=self._component,
            instance=self._node_name,
            host=self._node_name,
        )
        try:
            await self._core.create_namespaced_event(workload.namespace, body)
            self.written += 1
        except Exception as exc:  # an Event is best effort; prepare has answered already
            logger.warning("cannot record %s Event %s on pod %s: %s", type, reason, workload.pod, exc)
