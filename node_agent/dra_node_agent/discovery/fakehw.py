"""Fake hardware for the simulated backend and the tests: an in-process NVML and fake sysfs//dev trees.

`FakeNvml` implements the `pynvml` functions the NVML backend calls, with pynvml's own exception
classes and return shapes (structs with the same field names). `write_pci_tree` lays out
`sys/bus/pci/devices`, `sys/devices/pci<root>`, `sys/kernel/iommu_groups` and `dev/` nodes the way
Linux does, so the real backends read them unchanged.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from .pci import split_address

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
    # Time-slicing at prepare (``gpu_sharing``).
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceSetComputeMode",
)

# Where a FakeNvml with a ``state_dir`` keeps what a real GPU would keep across agent restarts, one
# folder per GPU UUID: ``compute-mode`` (NVML's number) and ``timeslice`` (the simulated host
# ``nvidia-smi compute-policy`` writes it; 0 Default .. 3 Long). Tests read them back.
COMPUTE_MODE_FILE = "compute-mode"
TIME_SLICE_FILE = "timeslice"


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


@dataclass(frozen=True)
class FakeMig:
    profile: FakeMigProfile
    start: int
    gi_id: int
    ci_id: int
    uuid: str


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
    ) -> None:
        self.gpus = list(gpus)
        # Device state that outlives the process, as on hardware (None: in memory only).
        self.state_dir = state_dir
        if state_dir is not None:
            self._load_state(state_dir)
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

    def _gpu(self, handle: Any, function: str) -> FakeGpu:
        self._ready()
        if not isinstance(handle, _Handle):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        code = handle.gpu.failures.get(function)
        if code is not None:
            raise pynvml.NVMLError(code)
        return handle.gpu

    def _load_state(self, state_dir: Path) -> None:
        """Read back (or first write) each GPU's persisted settings (blocking file I/O)."""
        for gpu in self.gpus:
            folder = state_dir / gpu.uuid
            folder.mkdir(parents=True, exist_ok=True)
            for name, default in ((COMPUTE_MODE_FILE, gpu.compute_mode), (TIME_SLICE_FILE, 0)):
                path = folder / name
                if path.exists():
                    if name == COMPUTE_MODE_FILE:
                        gpu.compute_mode = int(path.read_text().strip() or default)
                else:
                    path.write_text(f"{default}\n")

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
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._ready()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle = _Handle(self.gpus[index])
        self._gpu(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        self._ready()
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
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
                    instanceCount=7 // p.slices,
                )
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return 7 if gpu.mig_mode else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not gpu.mig_mode:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.migs):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(gpu, gpu.migs[index])

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
                return _Handle(gpu, mig)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: _Handle) -> SimpleNamespace:
        mig = self._mig(gpu_instance, "nvmlGpuInstanceGetInfo")
        return SimpleNamespace(
            id=mig.gi_id,
            profileId=mig.profile.id,
            placement=SimpleNamespace(start=mig.start, size=mig.profile.slices),
        )


# --- sysfs and /dev --------------------------------------------------------------------------


@dataclass(frozen=True)
class FakePciFunction:
    """One PCI function to lay out in a fake sysfs tree."""

    address: str
    vendor: int
    device: int
    subsystem_device: int = 0
    class_code: int = 0x120000
    numa_node: int = -1
    iommu_group: int | None = None
    driver: str | None = None
    accel: str | None = None  # "accel0": the accel class device of a v2-v4 TPU
    pcie_root: str | None = None  # "pci0000:3a"; default: a root complex on the device's own bus


def _symlink(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


# Character device numbers of the fake /dev nodes. NVIDIA's are the driver's (195; nvidiactl 255);
# nvidia-uvm, nvidia-caps and vfio groups get a major at module load, so these are typical values;
# accel is the kernel's accel class (261); /dev/vfio/vfio is misc 10:196.
NVIDIA_MAJOR, NVIDIACTL_MINOR = 195, 255
NVIDIA_UVM_MAJOR, NVIDIA_CAPS_MAJOR = 510, 511
ACCEL_MAJOR, VFIO_GROUP_MAJOR, VFIO_CONTAINER = 261, 243, (10, 196)


def make_device_node(path: Path, *, major: int, minor: int, char_device: bool) -> None:
    """A character device at ``path`` when ``char_device`` and the process may create one (root,
    CAP_MKNOD), so that a container runtime can inject it as it would the real one; otherwise an
    empty file (test fixtures kept in version control, unprivileged runs)."""
    if char_device:
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISCHR(path.lstat().st_mode):
                path.unlink()
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        except FileExistsError:
            return
        except PermissionError:
            pass
        else:
            path.chmod(0o666)  # as the driver's nodes are; mknod's mode went through the umask
            return
    path.touch()


def write_pci_tree(root: Path, functions: Iterable[FakePciFunction], *, char_devices: bool = False) -> None:
    """Write `root/sys/...` and `root/dev/...` for `functions` (idempotent); `char_devices`: the
    /dev entries are character devices (see :func:`make_device_node`)."""
    sys_root = root / "sys"
    dev_root = root / "dev"
    vfio_used = False
    for fn in functions:
        slot, _ = split_address(fn.address)
        domain, bus, _ = slot.split(":")
        pcie = fn.pcie_root or f"pci{domain}:{bus}"
        device_dir = sys_root / "devices" / pcie / fn.address
        device_dir.mkdir(parents=True, exist_ok=True)
        (device_dir / "vendor").write_text(f"0x{fn.vendor:04x}\n")
        (device_dir / "device").write_text(f"0x{fn.device:04x}\n")
        (device_dir / "subsystem_device").write_text(f"0x{fn.subsystem_device:04x}\n")
        (device_dir / "class").write_text(f"0x{fn.class_code:06x}\n")
        (device_dir / "numa_node").write_text(f"{fn.numa_node}\n")
        _symlink(sys_root / "bus" / "pci" / "devices" / fn.address, device_dir)
        if fn.driver:
            driver_dir = sys_root / "bus" / "pci" / "drivers" / fn.driver
            driver_dir.mkdir(parents=True, exist_ok=True)
            (driver_dir / "bind").touch()  # as in sysfs; also keeps the folder in version control
            _symlink(device_dir / "driver", driver_dir)
        if fn.iommu_group is not None:
            group_dir = sys_root / "kernel" / "iommu_groups" / str(fn.iommu_group)
            (group_dir / "devices").mkdir(parents=True, exist_ok=True)
            _symlink(device_dir / "iommu_group", group_dir)
            _symlink(group_dir / "devices" / fn.address, device_dir)
            if fn.driver == "vfio-pci":
                vfio_used = True
                (dev_root / "vfio").mkdir(parents=True, exist_ok=True)
                make_device_node(
                    dev_root / "vfio" / str(fn.iommu_group),
                    major=VFIO_GROUP_MAJOR,
                    minor=fn.iommu_group,
                    char_device=char_devices,
                )
        if fn.accel:
            class_dir = device_dir / "accel" / fn.accel
            class_dir.mkdir(parents=True, exist_ok=True)
            _symlink(class_dir / "device", device_dir)
            _symlink(sys_root / "class" / "accel" / fn.accel, class_dir)
            dev_root.mkdir(parents=True, exist_ok=True)
            minor = int(fn.accel.removeprefix("accel") or 0)
            make_device_node(dev_root / fn.accel, major=ACCEL_MAJOR, minor=minor, char_device=char_devices)
    if vfio_used:
        major, minor = VFIO_CONTAINER
        make_device_node(dev_root / "vfio" / "vfio", major=major, minor=minor, char_device=char_devices)


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
            gi_minor, ci_minor = mig_capability_minors(gpu.minor, mig.gi_id, mig.ci_id)
            base = root / "proc" / "driver" / "nvidia" / "capabilities" / f"gpu{gpu.minor}" / "mig"
            for path, minor in (
                (base / f"gi{mig.gi_id}" / "access", gi_minor),
                (base / f"gi{mig.gi_id}" / f"ci{mig.ci_id}" / "access", ci_minor),
            ):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
                (dev_root / "nvidia-caps").mkdir(exist_ok=True)
                make_device_node(
                    dev_root / "nvidia-caps" / f"nvidia-cap{minor}",
                    major=NVIDIA_CAPS_MAJOR,
                    minor=minor,
                    char_device=char_devices,
                )


def mig_capability_minors(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """Deterministic capability minors, spaced like the driver's mig-minors table."""
    gi_minor = 3 + gpu_minor * 105 + gi_id * 9
    return gi_minor, gi_minor + 1 + ci_id
