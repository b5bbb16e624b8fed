"""NVIDIA GPUs and MIG devices through NVML (`pynvml` from the nvidia-ml-py distribution).

Attribute names follow NVIDIA's DRA driver (`gpu.nvidia.com`): a full GPU is `gpu-<minor>` with
`type=gpu`; a GPU in MIG mode publishes its MIG devices (`gpu-<minor>-mig-<profile>-<gi profile id>-<start>`,
`type=mig`) instead of itself (``mig_discovery``). All NVML calls happen in `discover_sync`, which
the async `discover` runs in a worker thread; NVML is initialised and shut down around each pass.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
from pathlib import Path
from typing import Any, Final

import pynvml

from dra_api.names import GPU_DRIVER
from dra_node_agent.devices import (
    Attribute,
    ContainerEdits,
    DeviceNode,
    DiscoveredDevice,
    DiscoveredInventory,
    sorted_devices,
    string_attr,
    version_attr,
)
from dra_node_agent.discovery_config import SHARES_DISABLED
from dra_node_agent.discovery_config import consumable_shares as consumable_shares_mode
from dra_node_agent.nvidia import shares
from dra_node_agent.nvidia.driver_files import DriverFiles, scan_driver_root
from dra_node_agent.nvidia.mig_discovery import (
    DiscoveryPass,
    ParentGpu,
    add_mig_devices,
    add_placements,
    text,
)
from dra_node_agent.nvidia.passthrough_discovery import (
    guard_passthrough,
    passthrough_devices,
    standard_pci_attributes,
)
from dra_node_agent.pci_binding import SysfsWritten

log = logging.getLogger(__name__)

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


def _product_attributes(nvml: Any, handle: Any) -> dict[str, Attribute]:
    """What a GPU is: its product, brand, architecture and compute capability."""
    product = text(nvml.nvmlDeviceGetName(handle))
    brand = BRAND_NAMES.get(int(nvml.nvmlDeviceGetBrand(handle)), "Unknown")
    try:
        architecture = ARCHITECTURE_NAMES.get(int(nvml.nvmlDeviceGetArchitecture(handle)), "Unknown")
    except pynvml.NVMLError_NotSupported:
        architecture = "Unknown"
    major, minor_cc = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    return {
        "productName": string_attr(product[:64]),
        "brand": string_attr(brand),
        "architecture": string_attr(architecture),
        "cudaComputeCapability": version_attr(f"{int(major)}.{int(minor_cc)}"),
    }


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
        dev_root: str | Path = "/dev",
        passthrough: bool = False,
        sysfs_written: SysfsWritten | None = None,
        consumable_shares: str = SHARES_DISABLED,
    ) -> None:
        self._driver = driver
        # GPUs are also published for passthrough (``passthrough_discovery``); ``sysfs_written`` is
        # the simulated kernel that acts on the binding's sysfs writes (None on a host).
        self.passthrough = passthrough
        self.sysfs_written = sysfs_written
        self._dev_root = Path(dev_root)
        # NVML's product name of each GPU seen, by PCI address: a GPU bound to vfio-pci keeps it.
        self._product_names: dict[str, str] = {}
        # Whole GPUs published as shares of several claims (``shares``); None: one claim each.
        self.consumable_shares = consumable_shares_mode(consumable_shares)
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

    @property
    def sysfs_root(self) -> Path:
        return self._sysfs_root

    @property
    def proc_root(self) -> Path:
        return self._proc_root

    @property
    def dev_root(self) -> Path:
        """The host's /dev as the agent sees it (``host_dev_dir`` is the runtime's view)."""
        return self._dev_root

    @property
    def host_dev_dir(self) -> str:
        return self._host_dev_dir

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
        state = DiscoveryPass()
        try:
            driver_version = text(nvml.nvmlSystemGetDriverVersion())
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
        nvml_devices = list(state.devices)
        if self.passthrough:
            vfio = passthrough_devices(
                sysfs_root=self._sysfs_root,
                dev_root=self._dev_root,
                host_dev_dir=self._host_dev_dir,
                product_names=self._product_names,
                cuda_devices=nvml_devices,
                errors=state.errors,
            )
            state.devices, guards = guard_passthrough([*state.devices, *vfio])
            state.counter_sets.extend(guards)
        common = ContainerEdits()
        if nvml_devices:
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

    def _gpu(self, nvml: Any, *, index: int, system: dict[str, Attribute], state: DiscoveryPass) -> None:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = text(nvml.nvmlDeviceGetUUID(handle))
        minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
        shared = _product_attributes(nvml, handle)
        try:
            memory: int | None = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        except pynvml.NVMLError_NotSupported:
            memory = None  # NVIDIA's driver omits the capacity too
        bus_id = normalize_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
        try:
            mig_enabled = nvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        except pynvml.NVMLError_NotSupported:
            mig_enabled = False
        shared.update(system)
        shared.update(standard_pci_attributes(self._sysfs_root, bus_id))
        self._product_names[bus_id] = str(shared["productName"].value)
        parent_node = self._node(f"nvidia{minor}")

        if mig_enabled:
            if memory is None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # profile names need the total
            gpu = ParentGpu(
                handle=handle,
                uuid=uuid,
                minor=minor,
                bus_id=bus_id,
                total=memory,
                shared=shared,
                node=parent_node,
            )
            if self.dynamic_mig:
                add_placements(nvml, gpu, state)
            else:
                add_mig_devices(nvml, gpu, state, cap_nodes=self.mig_cap_nodes)
            return
        attributes = {"type": string_attr("gpu"), "uuid": string_attr(uuid), **shared}
        device = DiscoveredDevice(
            name=f"gpu-{minor}",
            kind="gpu",
            uuid=uuid,
            attributes=attributes,
            capacity={"memory": memory} if memory is not None else {},
            pci_bus_id=bus_id,
            local_id=str(minor),
            edits=ContainerEdits(device_nodes=(parent_node,)),
        )
        state.devices.append(shares.shared(device, self.consumable_shares))

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
        content = path.read_text()
    except OSError:
        return None
    for line in content.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor":
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None
