"""Whether the API server keeps device taints in ResourceSlices (DRADeviceTaints: beta and on in 1.36).

A server with the gate off drops the field silently, so the only reliable test is to ask it: a
dry-run create of a one-device slice with a taint, and a look at what came back. Nothing is stored.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes_asyncio import client

from dra_api.names import RESOURCE_GROUP

logger = logging.getLogger(__name__)


async def server_keeps_device_taints(
    api: client.ApiClient, *, api_version: str, driver: str, node_name: str
) -> bool | None:
    """True or False from a dry-run create; None when the server could not be asked."""
    device: dict[str, Any] = {
        "name": "taint-probe",
        "taints": [{"key": f"{driver}/probe", "value": "dry-run", "effect": "NoSchedule"}],
    }
    if api_version == "v1beta1":
        device = {"name": "taint-probe", "basic": {"taints": device["taints"]}}
    body = {
        "apiVersion": f"{RESOURCE_GROUP}/{api_version}",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node_name}-{driver}-taint-probe-"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 0, "resourceSliceCount": 1},
            "devices": [device],
        },
    }
    custom = client.CustomObjectsApi(api)
    try:
        written: Any = await custom.create_cluster_custom_object(
            RESOURCE_GROUP, api_version, "resourceslices", body, dry_run="All"
        )
    except Exception as exc:  # RBAC, admission or network: the caller keeps its default
        logger.warning("cannot ask the API server whether it keeps device taints: %s", exc)
        return None
    devices = (written.get("spec") or {}).get("devices") or []
    first = devices[0] if devices else {}
    taints = first.get("taints") or (first.get("basic") or {}).get("taints")
    return bool(taints)
