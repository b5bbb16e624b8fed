"""What NVIDIA brings to a GPU driver of this node: its ``vendor_record.VendorRecord``.

NVML discovery (enabled when NVML initialises, or forced on), the NVML health probe, time-slicing
through the driver's nvidia-smi, per-claim MPS daemons from the driver root's control tool,
dynamic MIG instances when that mode is on, GPUs bound to vfio-pci for passthrough and back,
and ``NVIDIA_VISIBLE_DEVICES=void`` in every GPU claim's spec. The simulated record runs these
same parts over its fake NVML.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pynvml

from dra_api.kubeletapi.socketpaths import MAX_SOCKET_PATH_BYTES
from dra_node_agent.device_setup import MpsOptions
from dra_node_agent.discovery_config import DiscoveryConfig
from dra_node_agent.nvidia import mps
from dra_node_agent.nvidia.container_env import NvidiaEnv
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.nvidia.dynamic_mig import DynamicMig
from dra_node_agent.nvidia.gpu_sharing import GpuSharing, NvmlComputeModes
from dra_node_agent.nvidia.health_probe import NvmlHealthProbe
from dra_node_agent.nvidia.passthrough import VfioPassthrough
from dra_node_agent.vendor_record import ProbeOptions, VendorRecord

log = logging.getLogger(__name__)


def nvml_usable(backend: NvmlBackend) -> bool:
    """Whether NVML initialises (blocking; init and shutdown once)."""
    nvml = backend.nvml_module()
    try:
        nvml.nvmlInitWithFlags(pynvml.NVML_INIT_FLAG_NO_GPUS)
    except (pynvml.NVMLError, OSError) as err:
        log.info("NVIDIA backend not enabled: NVML does not initialise (%s)", err)
        return False
    try:
        nvml.nvmlShutdown()
    except pynvml.NVMLError as err:
        log.warning("NVML shutdown failed: %s", err)
    return True


def backends(config: DiscoveryConfig) -> list[NvmlBackend]:
    """The NVML backend, when it is forced on or NVML initialises here."""
    backend = NvmlBackend(
        driver=config.gpu_driver,
        driver_root=config.driver_root,
        host_driver_root=config.host_driver_root,
        cdi_hook_path=config.cdi_hook_path,
        sysfs_root=config.sysfs_root,
        proc_root=config.proc_root,
        host_dev_dir=config.host_dev_dir,
        dev_root=config.dev_root,
        dynamic_mig=config.dynamic_mig,
        passthrough=config.passthrough,
        consumable_shares=config.consumable_shares,
    )
    return [backend] if config.selects("nvidia", detected=lambda: nvml_usable(backend)) else []


def health_probe(backend: NvmlBackend, options: ProbeOptions) -> NvmlHealthProbe:
    return NvmlHealthProbe(
        nvml=backend.nvml_module(),
        ignored_xids=options.ignored_xids,
        temperature_limit=options.temperature_limit,
    )


def time_slicing(backend: NvmlBackend) -> GpuSharing:
    """Time-slicing on these GPUs (looks for nvidia-smi under the driver root)."""
    return GpuSharing(
        compute_modes=NvmlComputeModes(backend),
        nvidia_smi=backend.nvidia_smi(),
        driver_root=backend.driver_root,
        env=backend.tool_env(),
    )


def mps_daemons(backend: NvmlBackend, root: Path, options: MpsOptions | None) -> mps.MpsDaemons:
    """Per-claim MPS daemons from the driver root's tools, kept under ``root``, run as ``options``
    say (their shm size and cgroup; the defaults without)."""
    return mps.MpsDaemons(
        root=root,
        control=mps.find_control_tool(backend.driver_root),
        driver_root=backend.driver_root,
        env=backend.tool_env(),
        # The simulated stand-in makes a FIFO, not unix sockets: its paths may be long.
        socket_path_max=None if backend.simulated else MAX_SOCKET_PATH_BYTES,
        options=options,
    )


def mig_instances(backend: NvmlBackend) -> DynamicMig | None:
    """Creates and destroys dynamic MIG instances on these GPUs (None: dynamic MIG is off)."""
    return DynamicMig(backend) if backend.dynamic_mig else None


RECORD: VendorRecord[NvmlBackend] = VendorRecord(
    name=NvmlBackend.vendor,
    backends=backends,
    health_probe=health_probe,
    time_slicing=time_slicing,
    mps_daemons=mps_daemons,
    mig_instances=mig_instances,
    passthrough=VfioPassthrough.of,
    container_env=lambda backend: NvidiaEnv(),
)
