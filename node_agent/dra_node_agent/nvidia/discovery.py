"""NVIDIA GPUs and MIG devices through NVML (`pynvml` from the nvidia-ml-py distribution).

Attribute names follow NVIDIA's DRA driver (`gpu.nvidia.com`): a full GPU is `gpu-<minor>` with
`type=gpu`; a GPU in MIG mode publishes its MIG devices (`gpu-<minor>-mig-<profile>-<gi profile id>-<start>`,
`type=mig`) instead of itself. All NVML calls happen in `discover_sync`, which the async
`discover` runs in a worker thread; NVML is initialised and shut down around each pass.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pynvml

from dra_api.names import GPU_DRIVER, STANDARD_ATTRIBUTE_DOMAIN
from dra_node_agent.devices import (
    Attribute,
    ContainerEdits,
    CounterSet,
    DeviceNode,
    DiscoveredDevice,
    DiscoveredInventory,
    MigPlacement,
    dns_label,
    int_attr,
    sorted_devices,
    string_attr,
    version_attr,
)
from dra_node_agent.nvidia.driver_files import DriverFiles, scan_driver_root
from dra_node_agent.pci import pci_device_dir, pcie_root, read_int

log = logging.getLogger(__name__)

MIB = 1 << 20
GIB = 1 << 30

# go-nvlib's spellings, so CEL selectors written for NVIDIA's driver match.
BRAND_NAMES = {
    0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
    7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS", 11: "NvidiaCloudGaming",
    12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia", 15: "GeForceRTX", 16: "TitanRTX",
}  # fmt: skip
ARCHITECTURE_NAMES = {
    2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
    8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell",
}  # fmt: skip

# GPU-instance profile indices whose names carry a media-engine or graphics suffix (go-nvlib).
_PROFILE_SUFFIXES = {
    0x7: "+me", 0x8: "+me", 0xA: "+gfx", 0xB: "+gfx", 0xC: "+gfx",
    0xD: "-me", 0xE: "-me", 0xF: "+me.all", 0x10: "+me.all", 0x11: "+gfx",
}  # fmt: skip

# Where NVIDIA's own tools look for libnvidia-ml.so.1 under a driver root.
_LIBRARY_DIRS = (
    "",
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
)
NVML_LIBRARY = "libnvidia-ml.so.1"
# Where a driver root holds nvidia-smi (host install, GPU Operator's /run/nvidia/driver).
NVIDIA_SMI_PATHS = ("usr/bin/nvidia-smi", "bin/nvidia-smi", "usr/local/bin/nvidia-smi")
# Where a driver root holds the MPS control tool.
MPS_CONTROL_PATHS: Final = ("usr/bin/nvidia-cuda-mps-control", "bin/nvidia-cuda-mps-control")

# Errors that mean "no usable NVIDIA driver here" rather than a fault worth shouting about.
_ABSENT_ERRORS = (
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
)


def find_nvml_library(driver_root: Path) -> Path | None:
    """libnvidia-ml.so.1 under `driver_root`, searched like NVIDIA's drivers do."""
    for sub in _LIBRARY_DIRS:
        candidate = driver_root / sub / NVML_LIBRARY
        if candidate.exists():
            return candidate.resolve()
    return None


def mig_profile_name(
    *, gi_slices: int, ci_slices: int, memory_mib: int, total_bytes: int, profile_index: int | None
) -> str:
    """NVIDIA's MIG profile name, e.g. "1g.10gb", "1c.2g.20gb", "1g.10gb+me".

    The memory figure is rounded to eighths of the whole GPU, as go-nvlib does, so the name matches
    what `nvidia-smi` and NVIDIA's driver print.
    """
    total_gb = math.ceil(total_bytes / GIB)
    eighths = math.ceil(memory_mib * MIB / total_bytes * 8)
    # Halves round up, as Go's math.Round does (Python's round() would make the H200's 3g.71gb 3g.70gb).
    gb = math.floor(eighths / 8 * total_gb + 0.5)
    base = f"{gi_slices}g.{gb}gb"
    if ci_slices != gi_slices:
        base = f"{ci_slices}c.{base}"
    return base + _PROFILE_SUFFIXES.get(profile_index if profile_index is not None else -1, "")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def normalize_bus_id(raw: str | bytes) -> str:
    """NVML's "00000000:3B:00.0" (or legacy "0000:3B:00.0") -> sysfs form "0000:3b:00.0"."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    text = text.strip().rstrip("\x00").lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        raise ValueError(f"PCI bus ID {text!r}: missing domain")
    if len(domain) > 4:
        domain = domain[-4:]
    return f"{domain.zfill(4)}:{rest}"


@dataclass
class _Pass:
    """State of one discovery pass."""

    devices: list[DiscoveredDevice] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    counter_sets: list[CounterSet] = field(default_factory=list)


# NVML compute-instance profile by compute slices: dynamic MIG makes one compute instance spanning
# its GPU instance, as NVIDIA's driver does.
COMPUTE_PROFILE_BY_SLICES: Final = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}
# A GPU-instance profile's engines: (counter of a dynamic-MIG GPU's counter set, named after the
# capacity as NVIDIA's driver names it; the capacity; the NVML profile-info field). The counter set
# also holds ``memory`` and one ``memory-slice-<i>`` per memory slice (a placement consumes those it
# covers).
_ENGINES: Final = (
    ("multiprocessors", "multiprocessors", "multiprocessorCount"),
    ("copy-engines", "copyEngines", "copyEngineCount"),
    ("decoders", "decoders", "decoderCount"),
    ("encoders", "encoders", "encoderCount"),
    ("jpeg-engines", "jpegEngines", "jpegCount"),
    ("ofa-engines", "ofaEngines", "ofaCount"),
)


def possible_placements(nvml: Any, handle: Any, profile_id: int) -> list[tuple[int, int]]:
    """(start, size) of each placement of a GPU-instance profile (pynvml wants ctypes arrays)."""
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    if count.value == 0:
        return []
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
    return [(int(p.start), int(p.size)) for p in array[: count.value]]


class NvmlBackend:
    """Discovers GPUs (and MIG devices) for driver `gpu.nvidia.com` through NVML.

    `nvml` is the module-like object whose `nvml*` functions are called; it defaults to `pynvml`
    (tests monkeypatch that module; the simulated backend passes a fake built from a profile).
    `driver_root` is where the driver's libraries live (a containerised driver: /run/nvidia/driver);
    `sysfs_root` and `proc_root` are read for PCIe roots and MIG capability minors. CDI specs name
    device nodes under `host_dev_dir`, the host's /dev as the container runtime sees it (the agent
    may see it elsewhere, at `dev_root`), and mount the driver's files (``driver_files``) from
    `host_driver_root`, the driver root as the runtime sees it; with `cdi_hook_path` (the host's
    nvidia-cdi-hook) they carry NVIDIA's hooks rather than the libraries' links as mounts.
    """

    # The record that builds the rest of what this vendor brings (``nvidia.record``).
    vendor: Final = "nvidia"

    def __init__(
        self,
        *,
        driver: str = GPU_DRIVER,
        nvml: Any = None,
        driver_root: str | Path = "/",
        sysfs_root: str | Path = "/sys",
        proc_root: str | Path = "/proc",
        host_dev_dir: str = "/dev",
        host_driver_root: str = "/",
        cdi_hook_path: str | None = None,
        simulated: bool = False,
        dynamic_mig: bool = False,
    ) -> None:
        self._driver = driver
        self._host_driver_root = host_driver_root
        self._cdi_hook_path = cdi_hook_path
        self._driver_files: DriverFiles | None = None
        # MIG-enabled GPUs publish every placement of every profile, created at prepare (dynamic_mig).
        self.dynamic_mig = dynamic_mig
        self._nvml = nvml
        self._driver_root = Path(driver_root)
        self._sysfs_root = Path(sysfs_root)
        self._proc_root = Path(proc_root)
        self._host_dev_dir = host_dev_dir.rstrip("/")
        self._simulated = simulated
        self._reported_absent = False

    @property
    def driver(self) -> str:
        return self._driver

    @property
    def driver_root(self) -> Path:
        return self._driver_root

    @property
    def simulated(self) -> bool:
        return self._simulated

    async def discover(self) -> DiscoveredInventory:
        return await asyncio.to_thread(self.discover_sync)

    def nvml_module(self) -> Any:
        return self._nvml if self._nvml is not None else pynvml

    def discover_sync(self) -> DiscoveredInventory:
        """One blocking discovery pass (NVML init, enumerate, shutdown)."""
        nvml = self.nvml_module()
        if nvml is pynvml:
            self._preload_library()
        try:
            nvml.nvmlInitWithFlags(pynvml.NVML_INIT_FLAG_NO_GPUS)
        except pynvml.NVMLError as err:
            return self._unavailable(err)
        except OSError as err:  # a broken library file surfaces as OSError from ctypes
            return self._unavailable(err)
        self._reported_absent = False
        try:
            return self._enumerate(nvml)
        finally:
            try:
                nvml.nvmlShutdown()
            except pynvml.NVMLError as err:
                log.warning("NVML shutdown failed: %s", err)

    def tool_env(self) -> dict[str, str]:
        """Environment for the driver's tools (nvidia-smi, MPS) run from a mounted driver root: they
        load NVML and CUDA from there, not from the agent's image."""
        library = find_nvml_library(self._driver_root) if str(self._driver_root) != "/" else None
        return {"LD_LIBRARY_PATH": str(library.parent)} if library is not None else {}

    def nvidia_smi(self) -> Path | None:
        """The driver's nvidia-smi under the driver root (for the settings NVML has no setter for)."""
        for relative in NVIDIA_SMI_PATHS:
            candidate = self._driver_root / relative
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        return None

    def open_nvml(self) -> Any:
        """An NVML session with the GPUs attached (blocking); the caller must ``nvmlShutdown``."""
        nvml = self.nvml_module()
        if nvml is pynvml:
            self._preload_library()
        nvml.nvmlInitWithFlags(0)
        return nvml

    def _preload_library(self) -> None:
        # pynvml loads "libnvidia-ml.so.1" from the default search path unless a handle is set.
        if str(self._driver_root) == "/" or getattr(pynvml, "nvmlLib", None) is not None:
            return
        library = find_nvml_library(self._driver_root)
        if library is None:
            log.debug(
                "no %s under driver root %s; using the default search path", NVML_LIBRARY, self._driver_root
            )
            return
        try:
            pynvml.nvmlLib = ctypes.CDLL(str(library))
        except OSError as err:
            log.warning("cannot load %s: %s", library, err)

    def _unavailable(self, err: Exception) -> DiscoveredInventory:
        if not self._reported_absent:
            absent = isinstance(err, OSError) or getattr(err, "value", None) in _ABSENT_ERRORS
            level = logging.INFO if absent else logging.ERROR
            log.log(level, "NVML is not usable (%s); publishing no NVIDIA devices", err)
            self._reported_absent = True
        return DiscoveredInventory(driver=self._driver, available=False, errors=(f"NVML: {err}",))

    def _enumerate(self, nvml: Any) -> DiscoveredInventory:
        state = _Pass()
        try:
            driver_version = _text(nvml.nvmlSystemGetDriverVersion())
            count = int(nvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as err:
            log.error("NVML system query failed: %s", err)
            return DiscoveredInventory(driver=self._driver, available=False, errors=(f"NVML: {err}",))
        system: dict[str, Attribute] = {}
        try:
            system["driverVersion"] = version_attr(driver_version)
        except ValueError:
            state.errors.append(f"driver version {driver_version!r} is not numeric; attribute omitted")
        try:
            cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
            system["cudaDriverVersion"] = version_attr(f"{cuda // 1000}.{(cuda % 1000) // 10}")
        except pynvml.NVMLError as err:
            state.errors.append(f"CUDA driver version: {err}")
        for index in range(count):
            try:
                self._gpu(nvml, index=index, system=system, state=state)
            except pynvml.NVMLError as err:
                message = f"GPU at NVML index {index}: {err}; skipped"
                log.warning("%s", message)
                state.errors.append(message)
        common = ContainerEdits()
        if state.devices:
            common = ContainerEdits(
                device_nodes=tuple(
                    self._node(name) for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
                )
            ).merged(self._driver_edits(driver_version))
        return DiscoveredInventory(
            driver=self._driver,
            devices=sorted_devices(state.devices),
            common_edits=common,
            errors=tuple(state.errors),
            simulated=self._simulated,
            counter_sets=tuple(state.counter_sets),
        )

    def _driver_edits(self, version: str) -> ContainerEdits:
        """The driver's libraries and tools for every claim's spec, scanned once per driver version."""
        if self._driver_files is None or self._driver_files.version != version:
            self._driver_files = scan_driver_root(self._driver_root, version=version)
        return self._driver_files.container_edits(
            host_root=self._host_driver_root, hook_path=self._cdi_hook_path
        )

    def _node(self, relative: str) -> DeviceNode:
        return DeviceNode(path=f"/dev/{relative}", host_path=f"{self._host_dev_dir}/{relative}")

    def _gpu(self, nvml: Any, *, index: int, system: dict[str, Attribute], state: _Pass) -> None:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
        product = _text(nvml.nvmlDeviceGetName(handle))
        brand = BRAND_NAMES.get(int(nvml.nvmlDeviceGetBrand(handle)), "Unknown")
        try:
            architecture = ARCHITECTURE_NAMES.get(int(nvml.nvmlDeviceGetArchitecture(handle)), "Unknown")
        except pynvml.NVMLError_NotSupported:
            architecture = "Unknown"
        major, minor_cc = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        try:
            memory: int | None = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        except pynvml.NVMLError_NotSupported:
            memory = None  # NVIDIA's driver omits the capacity too
        bus_id = normalize_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
        try:
            mig_enabled = nvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        except pynvml.NVMLError_NotSupported:
            mig_enabled = False

        shared: dict[str, Attribute] = {
            "productName": string_attr(product[:64]),
            "brand": string_attr(brand),
            "architecture": string_attr(architecture),
            "cudaComputeCapability": version_attr(f"{int(major)}.{int(minor_cc)}"),
            **system,
            # NVIDIA's driver dropped its own pcieBusID for the standard attribute; so does this one.
            f"{STANDARD_ATTRIBUTE_DOMAIN}/pciBusID": string_attr(bus_id),
        }
        root = pcie_root(self._sysfs_root, bus_id)
        if root is not None:
            shared[f"{STANDARD_ATTRIBUTE_DOMAIN}/pcieRoot"] = string_attr(root)
        # As NVIDIA's driver: the NUMA node sysfs gives the PCI function; -1 (no NUMA affinity, or
        # a single-node machine) and a missing entry leave the attribute out rather than guess.
        numa = read_int(pci_device_dir(self._sysfs_root, bus_id) / "numa_node")
        if numa is not None and numa >= 0:
            shared[f"{STANDARD_ATTRIBUTE_DOMAIN}/numaNode"] = int_attr(numa)
        parent_node = self._node(f"nvidia{minor}")

        if mig_enabled and memory is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # profile names need the total
        if mig_enabled and self.dynamic_mig:
            assert memory is not None
            self._mig_placements(
                nvml,
                parent=handle,
                total=memory,
                parent_uuid=uuid,
                minor=minor,
                bus_id=bus_id,
                shared=shared,
                parent_node=parent_node,
                state=state,
            )
            return
        if mig_enabled:
            assert memory is not None
            self._mig_devices(
                nvml,
                parent=handle,
                parent_uuid=uuid,
                minor=minor,
                bus_id=bus_id,
                total=memory,
                shared=shared,
                parent_node=parent_node,
                state=state,
            )
            return
        attributes = {"type": string_attr("gpu"), "uuid": string_attr(uuid), **shared}
        state.devices.append(
            DiscoveredDevice(
                name=f"gpu-{minor}",
                kind="gpu",
                uuid=uuid,
                attributes=attributes,
                capacity={"memory": memory} if memory is not None else {},
                pci_bus_id=bus_id,
                local_id=str(minor),
                edits=ContainerEdits(device_nodes=(parent_node,)),
            )
        )

    def _gi_profile_indices(self, nvml: Any, handle: Any) -> dict[int, int]:
        """GPU-instance profile id -> profile index (the index decides the +me/-me/+gfx suffix)."""
        found: dict[int, int] = {}
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                continue
            found.setdefault(int(info.id), index)
        return found

    def _mig_placements(
        self,
        nvml: Any,
        *,
        parent: Any,
        total: int,
        parent_uuid: str,
        minor: int,
        bus_id: str,
        shared: dict[str, Attribute],
        parent_node: DeviceNode,
        state: _Pass,
    ) -> None:
        """Dynamic MIG: one counter set for the GPU and one device per profile placement.

        The counter set holds the whole GPU (the largest profile's engines and memory, one counter
        per memory slice); each placement consumes its profile's engines and memory and the memory
        slices it covers, so the scheduler never picks two that the GPU could not hold at once.
        """
        profiles: list[tuple[int, Any, list[tuple[int, int]]]] = []
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, index)
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                continue
            if int(info.instanceCount) == 0 or int(info.sliceCount) not in COMPUTE_PROFILE_BY_SLICES:
                continue
            placements = possible_placements(nvml, parent, int(info.id))
            if placements:
                profiles.append((index, info, placements))
        if not profiles:
            state.errors.append(
                f"GPU {parent_uuid}: MIG is on but NVML lists no GPU-instance profile; skipped"
            )
            return
        set_name = f"gpu-{minor}-counter-set"
        counters: dict[str, int] = {}
        for counter, _, field_name in _ENGINES:
            counters[counter] = max(int(getattr(info, field_name)) for _, info, _ in profiles)
        counters["memory"] = max(int(info.memorySizeMB) for _, info, _ in profiles) * MIB
        memory_slices = max(start + size for _, _, placements in profiles for start, size in placements)
        for i in range(memory_slices):
            counters[f"memory-slice-{i}"] = 1
        state.counter_sets.append(CounterSet(name=set_name, counters=counters))
        for index, info, placements in profiles:
            gi_slices = int(info.sliceCount)
            profile = mig_profile_name(
                gi_slices=gi_slices,
                ci_slices=gi_slices,
                memory_mib=int(info.memorySizeMB),
                total_bytes=total,
                profile_index=index,
            )
            engines = {
                (counter, name): int(getattr(info, field_name)) for counter, name, field_name in _ENGINES
            }
            capacity = {name: value for (_, name), value in engines.items()}
            capacity["memory"] = int(info.memorySizeMB) * MIB
            attributes = {
                "type": string_attr("mig"),
                "parentUUID": string_attr(parent_uuid),
                "profile": string_attr(profile),
                **shared,
            }
            for start, size in placements:
                uses = {counter: value for (counter, _), value in engines.items() if value}
                uses["memory"] = capacity["memory"]
                uses.update({f"memory-slice-{i}": 1 for i in range(start, start + size)})
                state.devices.append(
                    DiscoveredDevice(
                        name=f"gpu-{minor}-mig-{dns_label(profile)}-{int(info.id)}-{start}",
                        kind="mig",
                        uuid="",
                        attributes=attributes,
                        capacity=capacity,
                        pci_bus_id=bus_id,
                        parent_uuid=parent_uuid,
                        local_id=f"{minor}:{int(info.id)}:{start}",
                        edits=ContainerEdits(device_nodes=(parent_node,)),
                        mig_placement=MigPlacement(
                            parent_uuid=parent_uuid,
                            parent_minor=minor,
                            profile_id=int(info.id),
                            start=start,
                            size=size,
                            compute_profile=COMPUTE_PROFILE_BY_SLICES[gi_slices],
                        ),
                        consumes=CounterSet(name=set_name, counters=uses),
                    )
                )

    def _mig_devices(
        self,
        nvml: Any,
        *,
        parent: Any,
        parent_uuid: str,
        minor: int,
        bus_id: str,
        total: int,
        shared: dict[str, Attribute],
        parent_node: DeviceNode,
        state: _Pass,
    ) -> None:
        profiles = self._gi_profile_indices(nvml, parent)
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(parent))):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
            except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
                continue  # empty slot
            try:
                state.devices.append(
                    self._mig_device(
                        nvml,
                        mig=mig,
                        parent=parent,
                        parent_uuid=parent_uuid,
                        minor=minor,
                        bus_id=bus_id,
                        total=total,
                        shared=shared,
                        parent_node=parent_node,
                        profiles=profiles,
                    )
                )
            except pynvml.NVMLError as err:
                message = f"MIG device {slot} of GPU {parent_uuid}: {err}; skipped"
                log.warning("%s", message)
                state.errors.append(message)

    def _mig_device(
        self,
        nvml: Any,
        *,
        mig: Any,
        parent: Any,
        parent_uuid: str,
        minor: int,
        bus_id: str,
        total: int,
        shared: dict[str, Attribute],
        parent_node: DeviceNode,
        profiles: dict[int, int],
    ) -> DiscoveredDevice:
        uuid = _text(nvml.nvmlDeviceGetUUID(mig))
        gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
        ci_id = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
        attrs = nvml.nvmlDeviceGetAttributes(mig)
        gi_info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(parent, gi_id))
        gi_slices = int(attrs.gpuInstanceSliceCount)
        ci_slices = int(attrs.computeInstanceSliceCount)
        profile = mig_profile_name(
            gi_slices=gi_slices,
            ci_slices=ci_slices,
            memory_mib=int(attrs.memorySizeMB),
            total_bytes=total,
            profile_index=profiles.get(int(gi_info.profileId)),
        )
        start = int(gi_info.placement.start)
        # NVIDIA's canonical name: parent minor, profile, GPU-instance profile ID, placement start.
        name = f"gpu-{minor}-mig-{dns_label(profile)}-{int(gi_info.profileId)}-{start}"
        if ci_slices != gi_slices:
            name += f"-{ci_id}"  # several compute instances share this GPU instance
        attributes = {
            "type": string_attr("mig"),
            "uuid": string_attr(uuid),
            "parentUUID": string_attr(parent_uuid),
            "profile": string_attr(profile),
            **shared,
        }
        capacity = {
            "multiprocessors": int(attrs.multiprocessorCount),
            "copyEngines": int(attrs.sharedCopyEngineCount),
            "decoders": int(attrs.sharedDecoderCount),
            "encoders": int(attrs.sharedEncoderCount),
            "jpegEngines": int(attrs.sharedJpegCount),
            "ofaEngines": int(attrs.sharedOfaCount),
            "memory": int(attrs.memorySizeMB) * MIB,
        }
        nodes = [parent_node, *self.mig_cap_nodes(minor=minor, gi_id=gi_id, ci_id=ci_id)]
        return DiscoveredDevice(
            name=name,
            kind="mig",
            uuid=uuid,
            attributes=attributes,
            capacity=capacity,
            pci_bus_id=bus_id,
            parent_uuid=parent_uuid,
            local_id=f"{minor}:{gi_id}:{ci_id}",
            edits=ContainerEdits(device_nodes=tuple(nodes)),
        )

    def mig_cap_nodes(self, *, minor: int, gi_id: int, ci_id: int) -> list[DeviceNode]:
        """The /dev/nvidia-caps nodes granting access to one GPU and compute instance."""
        base = self._proc_root / "driver" / "nvidia" / "capabilities" / f"gpu{minor}" / "mig"
        nodes = []
        for access in (base / f"gi{gi_id}" / "access", base / f"gi{gi_id}" / f"ci{ci_id}" / "access"):
            cap_minor = _device_file_minor(access)
            if cap_minor is None:
                log.debug("no MIG capability file %s; the container gets the parent node only", access)
                continue
            nodes.append(self._node(f"nvidia-caps/nvidia-cap{cap_minor}"))
        return nodes


def _device_file_minor(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor":
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None
