"""Dynamic MIG: the GPU and compute instance of a published placement, made at prepare and
destroyed at unprepare, through NVML.

A placement (``MigPlacement``: GPU, GPU-instance profile, start) names at most one live GPU
instance, so every operation finds its instance by placement rather than by recorded IDs: undoing
an interrupted prepare needs nothing but the device name, and a crash between the NVML call and the
checkpoint write leaves nothing that cannot be found again. Each call opens and closes its own NVML
session (blocking: callers run it in a thread).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import pynvml

from dra_node_agent.device_setup import LiveInstance, MigInstance
from dra_node_agent.devices import ContainerEdits, DiscoveredDevice, MigPlacement
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.nvidia.gpu_sharing import SharingError

logger = logging.getLogger(__name__)

# GPU- and compute-instance IDs are small (at most 7 instances of 8 memory slices); probing a few
# more than any product hands out finds every instance without ctypes handle arrays.
MAX_GPU_INSTANCE_ID: Final = 32
MAX_COMPUTE_INSTANCE_ID: Final = 8
_ABSENT: Final = (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT)


class MigError(SharingError):
    """An NVML call on a MIG instance failed; the message says which and why (a device set-up
    error like the sharing ones: unprepare keeps the claim recorded and the kubelet retries)."""


def _absent(err: pynvml.NVMLError) -> bool:
    return getattr(err, "value", None) in _ABSENT


class DynamicMig:
    """Creates and destroys the MIG instances of dynamic placements on one node's GPUs."""

    def __init__(self, backend: NvmlBackend) -> None:
        self._backend = backend

    @contextmanager
    def _session(self) -> Iterator[Any]:
        nvml = self._backend.open_nvml()
        try:
            yield nvml
        finally:
            try:
                nvml.nvmlShutdown()
            except pynvml.NVMLError as err:
                logger.warning("NVML shutdown failed: %s", err)

    # --- create ------------------------------------------------------------------------------

    def create(self, placement: MigPlacement) -> MigInstance:
        """Create the GPU instance at ``placement`` and one compute instance spanning it.

        An instance already there (a retried prepare after a crash) is kept and returned. A
        failure leaves no GPU instance behind. Raises ``MigError``.
        """
        where = _describe(placement)
        try:
            with self._session() as nvml:
                parent = nvml.nvmlDeviceGetHandleByUUID(placement.parent_uuid)
                found = self._find(nvml, parent, placement)
                if found is not None:
                    instance = self._device_of(nvml, parent, found)
                    if instance is not None:
                        logger.info("%s: already there as %s (kept)", where, instance.uuid)
                        return instance
                    self._destroy_gi(nvml, parent, found)  # a GPU instance without compute: redo
                wanted = pynvml.c_nvmlGpuInstancePlacement_t()
                wanted.start = placement.start
                wanted.size = placement.size
                gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                    parent, placement.profile_id, ctypes.byref(wanted)
                )
                gi_id = int(nvml.nvmlGpuInstanceGetInfo(gi).id)
                try:
                    info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gi, placement.compute_profile, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                    )
                    nvml.nvmlGpuInstanceCreateComputeInstance(gi, int(info.id))
                    instance = self._device_of(nvml, parent, gi_id)
                    if instance is None:
                        raise MigError(f"{where}: NVML lists no MIG device for GPU instance {gi_id}")
                except (pynvml.NVMLError, MigError):
                    self._destroy_gi(nvml, parent, gi_id)
                    raise
        except pynvml.NVMLError as err:
            raise MigError(f"{where}: creating the MIG device failed: {err}") from err
        except OSError as err:
            raise MigError(f"{where}: NVML is not usable: {err}") from err
        logger.info("%s: created MIG device %s (GPU instance %d)", where, instance.uuid, instance.gi_id)
        return instance

    def existing(self, placement: MigPlacement) -> MigInstance | None:
        """The MIG device at ``placement`` if there is one, changing nothing (what an admin-access
        claim observes). Raises ``MigError``."""
        where = _describe(placement)
        try:
            with self._session() as nvml:
                parent = nvml.nvmlDeviceGetHandleByUUID(placement.parent_uuid)
                found = self._find(nvml, parent, placement)
                return None if found is None else self._device_of(nvml, parent, found)
        except pynvml.NVMLError as err:
            raise MigError(f"{where}: looking up the MIG device failed: {err}") from err
        except OSError as err:
            raise MigError(f"{where}: NVML is not usable: {err}") from err

    def edits(self, device: DiscoveredDevice, instance: MigInstance) -> DiscoveredDevice:
        """The published device as the live instance: its UUID and the capability nodes that grant
        access to it (read from /proc, as for static MIG devices)."""
        assert device.mig_placement is not None
        minor = device.mig_placement.parent_minor
        nodes = self._backend.mig_cap_nodes(minor=minor, gi_id=instance.gi_id, ci_id=instance.ci_id)
        return dataclasses.replace(
            device,
            uuid=instance.uuid,
            local_id=f"{minor}:{instance.gi_id}:{instance.ci_id}",
            edits=device.edits.merged(ContainerEdits(device_nodes=tuple(nodes))),
        )

    # --- destroy and list --------------------------------------------------------------------

    def destroy(self, placement: MigPlacement) -> bool:
        """Destroy the instance at ``placement`` (its compute instances first); False if there was
        none. Raises ``MigError`` (a process still using it: NVML says in use)."""
        try:
            with self._session() as nvml:
                parent = nvml.nvmlDeviceGetHandleByUUID(placement.parent_uuid)
                gi_id = self._find(nvml, parent, placement)
                if gi_id is None:
                    return False
                self._destroy_gi(nvml, parent, gi_id)
        except pynvml.NVMLError as err:
            raise MigError(f"{_describe(placement)}: destroying the MIG device failed: {err}") from err
        except OSError as err:
            raise MigError(f"{_describe(placement)}: NVML is not usable: {err}") from err
        logger.info("%s: destroyed MIG device (GPU instance %d)", _describe(placement), gi_id)
        return True

    def live(self, parent_uuids: Sequence[str]) -> list[LiveInstance]:
        """Every GPU instance on these GPUs. Raises ``MigError``."""
        found: list[LiveInstance] = []
        try:
            with self._session() as nvml:
                for parent_uuid in parent_uuids:
                    parent = nvml.nvmlDeviceGetHandleByUUID(parent_uuid)
                    for gi_id, info in self._instances(nvml, parent):
                        found.append(
                            LiveInstance(
                                parent_uuid=parent_uuid,
                                profile_id=int(info.profileId),
                                start=int(info.placement.start),
                                gi_id=gi_id,
                            )
                        )
        except (pynvml.NVMLError, OSError) as err:
            raise MigError(f"listing MIG instances failed: {err}") from err
        return found

    def destroy_live(self, instance: LiveInstance) -> None:
        """Destroy one listed instance. Raises ``MigError``."""
        try:
            with self._session() as nvml:
                parent = nvml.nvmlDeviceGetHandleByUUID(instance.parent_uuid)
                self._destroy_gi(nvml, parent, instance.gi_id)
        except (pynvml.NVMLError, OSError) as err:
            raise MigError(
                f"GPU {instance.parent_uuid}: destroying GPU instance {instance.gi_id} failed: {err}"
            ) from err

    # --- NVML helpers (inside a session) -----------------------------------------------------

    def _instances(self, nvml: Any, parent: Any) -> Iterator[tuple[int, Any]]:
        for gi_id in range(MAX_GPU_INSTANCE_ID + 1):
            try:
                gi = nvml.nvmlDeviceGetGpuInstanceById(parent, gi_id)
            except pynvml.NVMLError as err:
                if _absent(err):
                    continue
                raise
            yield gi_id, nvml.nvmlGpuInstanceGetInfo(gi)

    def _find(self, nvml: Any, parent: Any, placement: MigPlacement) -> int | None:
        for gi_id, info in self._instances(nvml, parent):
            if int(info.profileId) == placement.profile_id and int(info.placement.start) == placement.start:
                return gi_id
        return None

    def _device_of(self, nvml: Any, parent: Any, gi_id: int) -> MigInstance | None:
        """The MIG device (compute instance) of a GPU instance, if it has one."""
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(parent))):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
            except pynvml.NVMLError as err:
                if _absent(err):
                    continue
                raise
            if int(nvml.nvmlDeviceGetGpuInstanceId(mig)) != gi_id:
                continue
            uuid = nvml.nvmlDeviceGetUUID(mig)
            return MigInstance(
                gi_id=gi_id,
                ci_id=int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
                uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
            )
        return None

    def _destroy_gi(self, nvml: Any, parent: Any, gi_id: int) -> None:
        gi = nvml.nvmlDeviceGetGpuInstanceById(parent, gi_id)
        for ci_id in range(MAX_COMPUTE_INSTANCE_ID):
            try:
                ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
            except pynvml.NVMLError as err:
                if _absent(err):
                    continue
                raise
            nvml.nvmlComputeInstanceDestroy(ci)
        nvml.nvmlGpuInstanceDestroy(gi)


def _describe(placement: MigPlacement) -> str:
    return f"GPU {placement.parent_uuid} MIG profile {placement.profile_id} at memory slice {placement.start}"
