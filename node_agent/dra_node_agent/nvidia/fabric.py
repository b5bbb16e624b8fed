"""The node's NVLink clique, from NVML's GPU fabric info (``nvmlDeviceGetGpuFabricInfo``).

A GB200 or GB300 NVL72 rack joins the GPUs of many nodes in one NVLink domain; NVML tells each GPU
its fabric's cluster UUID and its clique number. The node's clique ID is
``<cluster UUID>.<clique number>``, as NVIDIA's driver writes it, and every GPU of the node must
agree on it. The node has no clique ("") when the driver does not support fabric info, a GPU's
fabric state is NOT_SUPPORTED, or the cluster UUID is all zeros (NVLink within one node only, as on
an HGX H100).

Strict (NVIDIA's CrashOnNVLinkFabricErrors, on by default): a GPU whose fabric registration has not
completed, or completed with an error, is an error, and the compute-domain driver does not start
on that node; otherwise such a GPU counts as having no clique.
"""

from __future__ import annotations

import ctypes
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import pynvml

log = logging.getLogger(__name__)

_STATE_NAMES = {
    pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: "NOT_SUPPORTED",
    pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "NOT_STARTED",
    pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "IN_PROGRESS",
    pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "COMPLETED",
}


class FabricError(RuntimeError):
    """The node's NVLink fabric cannot be trusted to give a clique; the message says why."""


@dataclass(frozen=True)
class GpuFabric:
    """What NVML says of one GPU's fabric (None: fabric info is not supported)."""

    uuid: str
    cluster_uuid: str | None
    clique: int
    state: int
    status: int

    @property
    def state_name(self) -> str:
        return _STATE_NAMES.get(self.state, str(self.state))


def read_gpu_fabric(nvml: Any, handle: Any, *, gpu_uuid: str) -> GpuFabric | None:
    """One GPU's fabric info (blocking); None where the driver or the GPU has none to give."""
    info = pynvml.c_nvmlGpuFabricInfo_t()
    try:
        nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    except pynvml.NVMLError_NotSupported:
        return None
    except pynvml.NVMLError_FunctionNotFound:
        return None  # a driver older than the call
    raw = bytes(info.clusterUuid)
    cluster = None if raw == bytes(len(raw)) else str(uuid.UUID(bytes=raw))
    return GpuFabric(
        uuid=gpu_uuid,
        cluster_uuid=cluster,
        clique=int(info.cliqueId),
        state=int(info.state),
        status=int(info.status),
    )


def _clique_of(fabric: GpuFabric | None, *, strict: bool) -> str | None:
    """The clique one GPU says it is in; None for none. Raises ``FabricError`` when strict and the
    GPU's fabric is not usable."""
    if fabric is None or fabric.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        return None
    if fabric.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
        if strict:
            raise FabricError(
                f"GPU {fabric.uuid}: NVLink fabric registration is {fabric.state_name}, not COMPLETED "
                "(is the fabric manager running?)"
            )
        return None
    if fabric.status != pynvml.NVML_SUCCESS:
        if strict:
            raise FabricError(
                f"GPU {fabric.uuid}: NVLink fabric registration failed (NVML status {fabric.status})"
            )
        return None
    if fabric.cluster_uuid is None:
        return None  # NVLink within this node only: no multi-node clique
    return f"{fabric.cluster_uuid}.{fabric.clique}"


def clique_id(fabrics: list[GpuFabric | None], *, strict: bool) -> str:
    """The node's clique ID from its GPUs' fabric info ("" when none). Raises ``FabricError`` when
    the GPUs disagree, or (strict) when one's fabric is not usable."""
    found = {c for c in (_clique_of(f, strict=strict) for f in fabrics) if c is not None}
    if not found:
        return ""
    if len(found) > 1:
        raise FabricError(
            f"the GPUs of this node are in different NVLink cliques: {', '.join(sorted(found))}"
        )
    return found.pop()


def read_clique_id(nvml: Any, *, strict: bool) -> str:
    """The node's clique ID through NVML (blocking; NVML must be initialised)."""
    fabrics: list[GpuFabric | None] = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        gpu = nvml.nvmlDeviceGetUUID(handle)
        fabrics.append(
            read_gpu_fabric(nvml, handle, gpu_uuid=gpu.decode() if isinstance(gpu, bytes) else str(gpu))
        )
    return clique_id(fabrics, strict=strict)
