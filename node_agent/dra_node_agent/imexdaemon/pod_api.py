"""The daemon's one call outside its clique: the clique label on its own pod, which the controller
reads (an empty value: a node without NVLink fabric, whose daemon's readiness is its pod's)."""

from __future__ import annotations

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api import computedomains as cd
from dra_api.kube import ApiClient, request_error_text


class PodLabelError(Exception):
    """The label could not be written; the message says why."""


async def label_own_pod(*, api: ApiClient, namespace: str, name: str, clique_id: str) -> None:
    """Set ``resource.nvidia.com/computeDomain.cliqueID`` on the daemon's pod (a merge patch of
    that one label: the admission policy allows nothing else)."""
    body = {"metadata": {"labels": {cd.CLIQUE_LABEL: clique_id}}}
    try:
        await client.CoreV1Api(api).patch_namespaced_pod(
            name, namespace, body, _request_timeout=aiohttp.ClientTimeout(total=10.0)
        )
    except ApiException as exc:
        raise PodLabelError(f"labelling pod {namespace}/{name}: {request_error_text(exc)}") from exc
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise PodLabelError(f"labelling pod {namespace}/{name}: {request_error_text(exc)}") from exc
