"""Fake NVIDIA hardware for the simulated backend and the tests: an in-process NVML, and the
/dev nodes and /proc MIG capability files of its GPUs.

`FakeNvml` implements the `pynvml` functions the NVML backend calls, with pynvml's own exception
classes and return shapes (structs with the same field names). The fake PCI tree they sit in is
``faketree``'s.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

import pynvml

from dra_node_agent.nvidia.mig_discovery import COMPUTE_PROFILE_BY_SLICES
from dra_node_agent.pci import bound_driver, split_address
from dra_node_agent.simulated.faketree import (
    IMEX_CHANNELS_MAJOR,
    NVIDIA_CAPS_MAJOR,
    NVIDIA_DRIVER,
    NVIDIA_MAJOR,
    NVIDIA_UVM_MAJOR,
    NVIDIACTL_MINOR,
    make_device_node,
)

# Every pynvml function the NVML backend uses; tests monkeypatch exactly these onto `pynvml`.
NVML_FUNCTIONS = (
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetName",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetAttributes",
    "nvmlDeviceGetGpuInstanceById",
    "nvmlGpuInstanceGetInfo",
    # Time-slicing at prepare (``nvidia.gpu_sharing``).
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceSetComputeMode",
    # Dynamic MIG at prepare and unprepare (``nvidia.dynamic_mig``).
    "nvmlDeviceGetGpuInstancePossiblePlacements",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlGpuInstanceGetComputeInstanceById",
    "nvmlComputeInstanceGetInfo",
    "nvmlComputeInstanceDestroy",
    "nvmlGpuInstanceDestroy",
    # The NVLink fabric (``nvidia.fabric``: the compute-domain driver's clique).
    "nvmlDeviceGetGpuFabricInfo",
)

# Where a FakeNvml with a ``state_dir`` keeps what a real GPU would keep across agent restarts, one
# folder per GPU UUID: ``compute-mode`` (NVML's number) and ``timeslice`` (the simulated host
# ``nvidia-smi compute-policy`` writes it; 0 Default .. 3 Long). Tests read them back.
COMPUTE_MODE_FILE = "compute-mode"
TIME_SLICE_FILE = "timeslice"
# The GPU's MIG instances once one was created or destroyed (JSON list), as the driver keeps them.
MIG_INSTANCES_FILE = "mig-instances.json"
# Highest GPU-instance ID NVML hands out on these products.
MAX_GPU_INSTANCE_ID = 14


@dataclass(frozen=True)
class FakeMigProfile:
    """One GPU-instance profile of a product (A100 40GB "1g.5gb": index 0, id 19, 1 slice...)."""

    index: int
    id: int
    slices: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int = 0
    encoders: int = 0
    jpeg: int = 0
    ofa: int = 0
    instances: int = 0  # most at once (0: 7 // slices)
    placements: tuple[int, ...] = ()  # possible starts, in memory slices (dynamic MIG)
    placement_size: int = 0  # memory slices one instance covers (0: ``slices``)

    @property
    def size(self) -> int:
        return self.placement_size or self.slices

    @property
    def max_instances(self) -> int:
        return self.instances or 7 // self.slices


@dataclass(frozen=True)
class FakeMig:
    """A GPU instance and its compute instance; ``ci_id`` -1: no compute instance (yet)."""

    profile: FakeMigProfile
    start: int
    gi_id: int
    ci_id: int
    uuid: str

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile.index,
            "start": self.start,
            "gi": self.gi_id,
            "ci": self.ci_id,
            "uuid": self.uuid,
        }


@dataclass(frozen=True)
class FakeFabric:
    """One GPU's NVLink fabric as NVML tells it: cluster UUID, clique, registration state, status."""

    cluster_uuid: str
    clique: int
    state: int = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    status: int = pynvml.NVML_SUCCESS


@dataclass
class FakeGpu:
    uuid: str
    name: str
    minor: int
    pci_bus_id: str  # sysfs form, "0000:3b:00.0"
    memory_total: int
    brand: int = pynvml.NVML_BRAND_NVIDIA
    architecture: int = pynvml.NVML_DEVICE_ARCH_HOPPER
    compute_capability: tuple[int, int] = (9, 0)
    mig_mode: int | None = None  # None: the GPU is not MIG-capable (NVML says NotSupported)
    mig_profiles: tuple[FakeMigProfile, ...] = ()
    migs: tuple[FakeMig, ...] = ()
    # pynvml function name -> NVML error code to raise for this GPU (fault injection).
    failures: dict[str, int] = field(default_factory=dict)
    compute_mode: int = pynvml.NVML_COMPUTEMODE_DEFAULT
    # None: the driver gives no fabric info for this GPU (NVML says NotSupported).
    fabric: FakeFabric | None = None


_COMPUTE_MODES = (
    pynvml.NVML_COMPUTEMODE_DEFAULT,
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD,
    pynvml.NVML_COMPUTEMODE_PROHIBITED,
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
)


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGpu
    mig: FakeMig | None = None
    kind: str = "device"  # "device" (GPU or MIG device), "gi" or "ci" (instance handles)


class FakeNvml:
    """An in-process stand-in for the `pynvml` module, driven by `FakeGpu` records."""

    def __init__(
        self,
        *,
        gpus: Sequence[FakeGpu],
        driver_version: str = "580.95.05",
        cuda_driver_version: int = 13000,
        init_error: int | None = None,
        state_dir: Path | None = None,
        node_root: Path | None = None,
        char_devices: bool = False,
        sysfs_root: Path | None = None,
    ) -> None:
        self.gpus = list(gpus)
        # The fake sysfs tree whose `driver` links say which GPUs the NVIDIA driver holds (None:
        # all): a GPU bound to another driver (vfio-pci, for passthrough) is none of NVML's.
        self.sysfs_root = sysfs_root
        # Where a created MIG instance's /proc capability files and /dev/nvidia-caps nodes go, as
        # the kernel driver makes them (None: nowhere); ``char_devices`` as for write_nvidia_nodes.
        self.node_root = node_root
        self.char_devices = char_devices
        # Device state that outlives the process, as on hardware (None: in memory only).
        self.state_dir = state_dir
        if state_dir is not None:
            _load_gpu_state(self.gpus, state_dir)
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.init_error = init_error
        self.init_count = 0
        self.shutdown_count = 0
        self._refcount = 0

    def install(self, module: Any, setattr_fn: Any = setattr) -> None:
        """Put this fake's functions onto `module` (pytest: `install(pynvml, monkeypatch.setattr)`)."""
        for name in NVML_FUNCTIONS:
            setattr_fn(module, name, getattr(self, name))

    # --- helpers -------------------------------------------------------------------------------
    def _ready(self) -> None:
        if self._refcount <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _held(self, gpu: FakeGpu) -> bool:
        """Whether the NVIDIA driver holds the GPU (NVML sees only those)."""
        if self.sysfs_root is None or not (self.sysfs_root / "bus/pci/devices" / gpu.pci_bus_id).exists():
            return True
        return bound_driver(self.sysfs_root, gpu.pci_bus_id) == NVIDIA_DRIVER

    def _visible(self) -> list[FakeGpu]:
        return [gpu for gpu in self.gpus if self._held(gpu)]

    def _gpu(self, handle: Any, function: str) -> FakeGpu:
        self._ready()
        if not isinstance(handle, _Handle):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not self._held(handle.gpu):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)  # a handle from before an unbind
        code = handle.gpu.failures.get(function)
        if code is not None:
            raise pynvml.NVMLError(code)
        return handle.gpu

    def _save_migs(self, gpu: FakeGpu) -> None:
        if self.state_dir is None:
            return
        path = self.state_dir / gpu.uuid / MIG_INSTANCES_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([m.to_json() for m in gpu.migs]) + "\n")

    # --- library -------------------------------------------------------------------------------
    def nvmlInitWithFlags(self, flags: int) -> None:
        del flags
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.init_count += 1
        self._refcount += 1

    def nvmlShutdown(self) -> None:
        self._ready()
        self.shutdown_count += 1
        self._refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._ready()
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._ready()
        return self.cuda_driver_version

    # --- devices -------------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        self._ready()
        return len(self._visible())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._ready()
        visible = self._visible()
        if not 0 <= index < len(visible):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle = _Handle(visible[index])
        self._gpu(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        self._ready()
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self._visible():
            if gpu.uuid == wanted:
                handle = _Handle(gpu)
                self._gpu(handle, "nvmlDeviceGetHandleByUUID")
                return handle
            for mig in gpu.migs:
                if mig.uuid == wanted:
                    return _Handle(gpu, mig)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetComputeMode(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetComputeMode").compute_mode

    def nvmlDeviceSetComputeMode(self, handle: _Handle, mode: int) -> None:
        gpu = self._gpu(handle, "nvmlDeviceSetComputeMode")
        if handle.mig is not None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # a GPU-wide setting
        if mode not in _COMPUTE_MODES:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.compute_mode = mode
        if self.state_dir is not None:
            (self.state_dir / gpu.uuid / COMPUTE_MODE_FILE).write_text(f"{mode}\n")

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        gpu = self._gpu(handle, "nvmlDeviceGetUUID")
        return handle.mig.uuid if handle.mig else gpu.uuid

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetMinorNumber").minor

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetBrand(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetBrand").brand

    def nvmlDeviceGetArchitecture(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetArchitecture").architecture

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        return self._gpu(handle, "nvmlDeviceGetCudaComputeCapability").compute_capability

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: Any = None) -> SimpleNamespace:
        del version
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        total = handle.mig.profile.memory_mib << 20 if handle.mig else gpu.memory_total
        return SimpleNamespace(total=total, free=total, used=0)

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        slot, function = split_address(gpu.pci_bus_id)
        domain, bus, device = slot.split(":")
        return SimpleNamespace(
            busId=f"0000{domain}:{bus}:{device}.{function}".upper(),
            busIdLegacy=f"{domain}:{bus}:{device}.{function}".upper(),
            domain=int(domain, 16),
            bus=int(bus, 16),
            device=int(device, 16),
        )

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        if gpu.mig_mode is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: _Handle, profile: int, version: int = 2
    ) -> SimpleNamespace:
        del version
        gpu = self._gpu(handle, "nvmlDeviceGetGpuInstanceProfileInfo")
        for p in gpu.mig_profiles:
            if p.index == profile:
                return SimpleNamespace(
                    id=p.id,
                    sliceCount=p.slices,
                    memorySizeMB=p.memory_mib,
                    multiprocessorCount=p.multiprocessors,
                    copyEngineCount=p.copy_engines,
                    decoderCount=p.decoders,
                    encoderCount=p.encoders,
                    jpegCount=p.jpeg,
                    ofaCount=p.ofa,
                    instanceCount=p.max_instances,
                )
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _profile_by_id(self, gpu: FakeGpu, profile_id: int) -> FakeMigProfile:
        for p in gpu.mig_profiles:
            if p.id == profile_id:
                return p
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: _Handle, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        """As pynvml: ``placementsRef`` None asks for the count (written through ``countRef``,
        a ``ctypes.byref``); otherwise fills the array of ``c_nvmlGpuInstancePlacement_t``."""
        gpu = self._gpu(handle, "nvmlDeviceGetGpuInstancePossiblePlacements")
        if not gpu.mig_mode:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile_by_id(gpu, profileId)
        count = _deref(countRef)
        if placementsRef is not None:
            if count.value < len(profile.placements):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, start in enumerate(profile.placements):
                placementsRef[i].start = start
                placementsRef[i].size = profile.size
        count.value = len(profile.placements)
        return 0

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: _Handle, profileId: int, placement: Any
    ) -> _Handle:
        gpu = self._gpu(handle, "nvmlDeviceCreateGpuInstanceWithPlacement")
        if not gpu.mig_mode:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile_by_id(gpu, profileId)
        wanted = _deref(placement)
        start, size = int(wanted.start), int(wanted.size)
        if start not in profile.placements or size != profile.size:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        taken = {s for m in gpu.migs for s in range(m.start, m.start + m.profile.size)}
        same = sum(1 for m in gpu.migs if m.profile.id == profileId)
        if taken & set(range(start, start + size)) or same >= profile.max_instances:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        used = {m.gi_id for m in gpu.migs}
        gi_id = next(i for i in range(1, MAX_GPU_INSTANCE_ID + 1) if i not in used)
        mig = FakeMig(profile=profile, start=start, gi_id=gi_id, ci_id=-1, uuid="")
        gpu.migs = (*gpu.migs, mig)
        self._save_migs(gpu)
        return _Handle(gpu, mig, "gi")

    def _instance(self, handle: _Handle, kind: str, function: str) -> FakeMig:
        self._gpu(handle, function)
        mig = handle.mig
        if handle.kind != kind or mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        current = next((m for m in handle.gpu.migs if m.gi_id == mig.gi_id), None)
        if current is None or (kind == "ci" and current.ci_id != mig.ci_id):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)  # destroyed meanwhile
        return current

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpuInstance: _Handle, profile: int, engProfile: int, version: int = 2
    ) -> SimpleNamespace:
        del version
        mig = self._instance(gpuInstance, "gi", "nvmlGpuInstanceGetComputeInstanceProfileInfo")
        slices = next((k for k, v in COMPUTE_PROFILE_BY_SLICES.items() if v == profile), None)
        if slices is None or engProfile != 0 or slices > mig.profile.slices:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        share = mig.profile.multiprocessors * slices // mig.profile.slices
        return SimpleNamespace(
            id=profile,
            sliceCount=slices,
            instanceCount=mig.profile.slices // slices,
            multiprocessorCount=share,
        )

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: _Handle, profileId: int) -> _Handle:
        mig = self._instance(gpuInstance, "gi", "nvmlGpuInstanceCreateComputeInstance")
        gpu = gpuInstance.gpu
        if mig.ci_id >= 0:
            # One compute instance per GPU instance is all this fake models (the agent makes one).
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        if COMPUTE_PROFILE_BY_SLICES.get(mig.profile.slices) != profileId:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        made = dataclasses.replace(
            mig,
            ci_id=0,
            uuid="MIG-"
            + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"{gpu.uuid}/{mig.gi_id}/{time.time_ns()}")),
        )
        gpu.migs = tuple(made if m.gi_id == mig.gi_id else m for m in gpu.migs)
        self._save_migs(gpu)
        if self.node_root is not None:
            write_mig_nodes(self.node_root, gpu, made, char_devices=self.char_devices)
        return _Handle(gpu, made, "ci")

    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance: _Handle, computeInstanceId: int) -> _Handle:
        mig = self._instance(gpuInstance, "gi", "nvmlGpuInstanceGetComputeInstanceById")
        if mig.ci_id < 0 or mig.ci_id != computeInstanceId:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(gpuInstance.gpu, mig, "ci")

    def nvmlComputeInstanceGetInfo(self, computeInstance: _Handle) -> SimpleNamespace:
        mig = self._instance(computeInstance, "ci", "nvmlComputeInstanceGetInfo")
        gpu = computeInstance.gpu
        return SimpleNamespace(
            device=_Handle(gpu),
            gpuInstance=_Handle(gpu, mig, "gi"),
            id=mig.ci_id,
            profileId=COMPUTE_PROFILE_BY_SLICES[mig.profile.slices],
            placement=SimpleNamespace(start=0, size=mig.profile.slices),
        )

    def nvmlComputeInstanceDestroy(self, computeInstance: _Handle) -> int:
        mig = self._instance(computeInstance, "ci", "nvmlComputeInstanceDestroy")
        gpu = computeInstance.gpu
        gpu.migs = tuple(
            dataclasses.replace(m, ci_id=-1, uuid="") if m.gi_id == mig.gi_id else m for m in gpu.migs
        )
        self._save_migs(gpu)
        if self.node_root is not None:
            remove_mig_nodes(self.node_root, gpu, mig)
        return 0

    def nvmlGpuInstanceDestroy(self, gpuInstance: _Handle) -> int:
        mig = self._instance(gpuInstance, "gi", "nvmlGpuInstanceDestroy")
        if mig.ci_id >= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)  # its compute instances go first
        gpu = gpuInstance.gpu
        gpu.migs = tuple(m for m in gpu.migs if m.gi_id != mig.gi_id)
        self._save_migs(gpu)
        return 0

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return 7 if gpu.mig_mode else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not gpu.mig_mode:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        devices = [m for m in gpu.migs if m.ci_id >= 0]  # a GPU instance alone is no MIG device
        if index >= len(devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(gpu, devices[index])

    def _mig(self, handle: _Handle, function: str) -> FakeMig:
        self._gpu(handle, function)
        if handle.mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        return self._mig(handle, "nvmlDeviceGetGpuInstanceId").gi_id

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        return self._mig(handle, "nvmlDeviceGetComputeInstanceId").ci_id

    def nvmlDeviceGetAttributes(self, handle: _Handle) -> SimpleNamespace:
        mig = self._mig(handle, "nvmlDeviceGetAttributes")
        p = mig.profile
        return SimpleNamespace(
            multiprocessorCount=p.multiprocessors,
            sharedCopyEngineCount=p.copy_engines,
            sharedDecoderCount=p.decoders,
            sharedEncoderCount=p.encoders,
            sharedJpegCount=p.jpeg,
            sharedOfaCount=p.ofa,
            gpuInstanceSliceCount=p.slices,
            computeInstanceSliceCount=p.slices,
            memorySizeMB=p.memory_mib,
        )

    def nvmlDeviceGetGpuInstanceById(self, handle: _Handle, gpu_instance_id: int) -> _Handle:
        gpu = self._gpu(handle, "nvmlDeviceGetGpuInstanceById")
        for mig in gpu.migs:
            if mig.gi_id == gpu_instance_id:
                return _Handle(gpu, mig, "gi")
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetGpuFabricInfo(self, handle: _Handle, gpuFabricInfo: Any) -> int:
        """As pynvml: fills the ``c_nvmlGpuFabricInfo_t`` the caller passes (by reference)."""
        gpu = self._gpu(handle, "nvmlDeviceGetGpuFabricInfo")
        if gpu.fabric is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = _deref(gpuFabricInfo)
        raw = uuidlib.UUID(gpu.fabric.cluster_uuid).bytes
        for i, byte in enumerate(raw):
            info.clusterUuid[i] = byte
        info.cliqueId = gpu.fabric.clique
        info.state = gpu.fabric.state
        info.status = gpu.fabric.status
        return 0

    def nvmlGpuInstanceGetInfo(self, gpu_instance: _Handle) -> SimpleNamespace:
        mig = self._instance(gpu_instance, "gi", "nvmlGpuInstanceGetInfo")
        return SimpleNamespace(
            id=mig.gi_id,
            profileId=mig.profile.id,
            placement=SimpleNamespace(start=mig.start, size=mig.profile.size),
        )


def _load_gpu_state(gpus: Sequence[FakeGpu], state_dir: Path) -> None:
    """Read back (or first write) each GPU's persisted settings (blocking file I/O)."""
    for gpu in gpus:
        folder = state_dir / gpu.uuid
        folder.mkdir(parents=True, exist_ok=True)
        for name, default in ((COMPUTE_MODE_FILE, gpu.compute_mode), (TIME_SLICE_FILE, 0)):
            path = folder / name
            if path.exists():
                if name == COMPUTE_MODE_FILE:
                    gpu.compute_mode = int(path.read_text().strip() or default)
            else:
                path.write_text(f"{default}\n")
        instances = folder / MIG_INSTANCES_FILE
        if instances.exists():
            by_index = {p.index: p for p in gpu.mig_profiles}
            gpu.migs = tuple(
                FakeMig(by_index[m["profile"]], m["start"], m["gi"], m["ci"], m["uuid"])
                for m in json.loads(instances.read_text())
            )


def _deref(value: Any) -> Any:
    """The object behind a ``ctypes.byref`` (pynvml's callers pass those), or the value itself."""
    return getattr(value, "_obj", value)


# --- NVIDIA /dev nodes and MIG capabilities -------------------------------------------------


def write_nvidia_nodes(root: Path, gpus: Sequence[FakeGpu], *, char_devices: bool = False) -> None:
    """Fake /dev/nvidia* nodes and the /proc MIG capability files for `gpus` under `root`;
    `char_devices`: the /dev entries are character devices (see :func:`make_device_node`)."""
    dev_root = root / "dev"
    dev_root.mkdir(parents=True, exist_ok=True)
    for name, major, minor in (
        ("nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR),
        ("nvidia-uvm", NVIDIA_UVM_MAJOR, 0),
        ("nvidia-uvm-tools", NVIDIA_UVM_MAJOR, 1),
    ):
        make_device_node(dev_root / name, major=major, minor=minor, char_device=char_devices)
    for gpu in gpus:
        make_device_node(
            dev_root / f"nvidia{gpu.minor}", major=NVIDIA_MAJOR, minor=gpu.minor, char_device=char_devices
        )
        for mig in gpu.migs:
            if mig.ci_id >= 0:
                write_mig_nodes(root, gpu, mig, char_devices=char_devices)


# /proc/devices of a host with NVIDIA's driver and IMEX channels (nvidia-caps-imex-channels).
PROC_DEVICES: Final = f"""Character devices:
  1 mem
{NVIDIA_MAJOR} nvidia
{NVIDIA_MAJOR} nvidiactl
{NVIDIA_UVM_MAJOR} nvidia-uvm
{NVIDIA_CAPS_MAJOR} nvidia-caps
{IMEX_CHANNELS_MAJOR} nvidia-caps-imex-channels

Block devices:
  8 sd
"""
# The fabric-imex-mgmt capability's minor (below the MIG capabilities' minors).
IMEX_MGMT_MINOR: Final = 4


def write_fabric_nodes(root: Path, *, with_fabric: bool, char_devices: bool) -> None:
    """/proc/devices, and with a multi-node fabric the fabric-imex-mgmt capability (its /proc file
    and /dev/nvidia-caps node), as a driver with IMEX support lays them out."""
    proc = root / "proc"
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "devices").write_text(PROC_DEVICES)
    if not with_fabric:
        return
    capability = proc / "driver" / "nvidia" / "capabilities" / "fabric-imex-mgmt"
    capability.parent.mkdir(parents=True, exist_ok=True)
    capability.write_text(f"DeviceFileMinor: {IMEX_MGMT_MINOR}\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    (root / "dev" / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    make_device_node(
        root / "dev" / "nvidia-caps" / f"nvidia-cap{IMEX_MGMT_MINOR}",
        major=NVIDIA_CAPS_MAJOR,
        minor=IMEX_MGMT_MINOR,
        char_device=char_devices,
    )


def _mig_capabilities(root: Path, gpu: FakeGpu, gi_id: int) -> Path:
    return root / "proc" / "driver" / "nvidia" / "capabilities" / f"gpu{gpu.minor}" / "mig" / f"gi{gi_id}"


def write_mig_nodes(root: Path, gpu: FakeGpu, mig: FakeMig, *, char_devices: bool) -> None:
    """The /proc capability files and /dev/nvidia-caps nodes of one MIG device, as the driver makes them."""
    gi_minor, ci_minor = mig_capability_minors(gpu.minor, mig.gi_id, mig.ci_id)
    base = _mig_capabilities(root, gpu, mig.gi_id)
    for path, minor in ((base / "access", gi_minor), (base / f"ci{mig.ci_id}" / "access", ci_minor)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
        (root / "dev" / "nvidia-caps").mkdir(parents=True, exist_ok=True)
        make_device_node(
            root / "dev" / "nvidia-caps" / f"nvidia-cap{minor}",
            major=NVIDIA_CAPS_MAJOR,
            minor=minor,
            char_device=char_devices,
        )


def remove_mig_nodes(root: Path, gpu: FakeGpu, mig: FakeMig) -> None:
    """Drop a destroyed MIG device's capability files (the /dev nodes stay, as on a host)."""
    shutil.rmtree(_mig_capabilities(root, gpu, mig.gi_id), ignore_errors=True)


def mig_capability_minors(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """Deterministic capability minors, spaced like the driver's mig-minors table."""
    gi_minor = 3 + gpu_minor * 105 + gi_id * 9
    return gi_minor, gi_minor + 1 + ci_id
