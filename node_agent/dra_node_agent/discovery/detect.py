"""Choosing the discovery backends for this node: explicit, simulated, or auto-detected.

Auto-detection enables NVIDIA when NVML initialises and TPUs when any PCI device is a Google TPU.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import pynvml

from dra_api.names import GPU_DRIVER, TPU_DRIVER
from dra_node_agent.devices import DiscoveryBackend
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.simulated.discovery import Profile, SimulatedBackend, load_profile
from dra_node_agent.tpu.discovery import TpuBackend, google_tpu_present

log = logging.getLogger(__name__)

BACKEND_CHOICES = ("auto", "nvidia", "tpu")


@dataclass(frozen=True)
class DiscoveryConfig:
    """What the agent's Settings decide about discovery.

    node_name: this node; seeds simulated and TPU UUIDs.
    backends: "auto" (detect), or any of "nvidia", "tpu" to force them on.
    simulated_profiles: profile names or paths; when set, only simulated backends run (at most one
        per driver: GPU, TPU, and the simulated NIC driver a `nic:` profile names).
    gpu_driver / tpu_driver: the driver names devices are published under.
    driver_root: where the NVIDIA driver's files live (/run/nvidia/driver for a containerised driver).
    host_driver_root: the same as the container runtime sees it (the host side of CDI driver mounts).
    cdi_hook_path: the host's nvidia-cdi-hook, for NVIDIA's hooks in GPU specs; None for none.
    dev_root / sysfs_root / proc_root: the host's /dev, /sys and /proc as the agent sees them.
    host_dev_dir: the host's /dev as the container runtime sees it (device paths in CDI specs).
    tpu_topology: the TPU slice topology when the host does not say (e.g. "4x4x4" for a multi-host slice).
    tpu_env_path: the Cloud TPU `tpu-env` file (simulated TPU hosts read it too); None to ignore.
    simulation_dir: where simulated fake trees are written (a temporary directory if None).
    dynamic_mig: MIG-enabled GPUs publish their placements, instances made at prepare.
    """

    node_name: str
    backends: tuple[str, ...] = ("auto",)
    simulated_profiles: tuple[str, ...] = ()
    gpu_driver: str = GPU_DRIVER
    tpu_driver: str = TPU_DRIVER
    driver_root: str = "/"
    host_driver_root: str = "/"
    cdi_hook_path: str | None = None
    dev_root: str = "/dev"
    dynamic_mig: bool = False
    sysfs_root: str = "/sys"
    proc_root: str = "/proc"
    host_dev_dir: str = "/dev"
    tpu_topology: str | None = None
    tpu_env_path: str | None = "/etc/tpu/tpu-env"
    simulation_dir: str | None = None

    def __post_init__(self) -> None:
        unknown = [b for b in self.backends if b not in BACKEND_CHOICES]
        if unknown:
            raise ValueError(
                f"discovery backends: unknown backend {unknown[0]!r} (choose from {BACKEND_CHOICES})"
            )


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


def _nvml_backend(config: DiscoveryConfig) -> NvmlBackend:
    return NvmlBackend(
        driver=config.gpu_driver,
        driver_root=config.driver_root,
        host_driver_root=config.host_driver_root,
        cdi_hook_path=config.cdi_hook_path,
        sysfs_root=config.sysfs_root,
        proc_root=config.proc_root,
        host_dev_dir=config.host_dev_dir,
        dynamic_mig=config.dynamic_mig,
    )


def _tpu_backend(config: DiscoveryConfig) -> TpuBackend:
    return TpuBackend(
        node_name=config.node_name,
        driver=config.tpu_driver,
        sysfs_root=config.sysfs_root,
        dev_root=config.dev_root,
        topology=config.tpu_topology,
        tpu_env_path=config.tpu_env_path,
        host_dev_dir=config.host_dev_dir,
    )


def simulated_profiles(config: DiscoveryConfig) -> list[tuple[Profile, str]]:
    """Each simulated profile with the driver it publishes for (blocking: reads the files).
    ``ValueError`` (a ``ProfileError`` for one profile) when one cannot be loaded or two publish
    for one driver; the command line calls it to refuse such settings before it starts anything."""
    chosen: list[tuple[Profile, str]] = []
    for ref in config.simulated_profiles:
        profile = load_profile(ref)
        if profile.nvidia is not None:
            driver = config.gpu_driver
        elif profile.tpu is not None:
            driver = config.tpu_driver
        else:
            driver = profile.driver  # the simulated NIC driver's name is the profile's
        if any(driver == taken for _, taken in chosen):
            raise ValueError(f"simulated profiles: two profiles publish for driver {driver!r}; use one")
        chosen.append((profile, driver))
    return chosen


def _simulated_backends(config: DiscoveryConfig) -> list[DiscoveryBackend]:
    backends: list[DiscoveryBackend] = []
    for index, (profile, driver) in enumerate(simulated_profiles(config)):
        state_dir = Path(config.simulation_dir) / f"{index}-{profile.name}" if config.simulation_dir else None
        backends.append(
            SimulatedBackend(
                profile=profile,
                node_name=config.node_name,
                state_dir=state_dir,
                driver=driver,
                tpu_env_path=config.tpu_env_path if profile.tpu is not None else None,
                dynamic_mig=config.dynamic_mig,
                cdi_hook_path=config.cdi_hook_path,
            )
        )
    return backends


def select_backends_sync(config: DiscoveryConfig) -> list[DiscoveryBackend]:
    """The backends to run on this node (blocking: probes NVML and sysfs)."""
    if config.simulated_profiles:
        return _simulated_backends(config)
    backends: list[DiscoveryBackend] = []
    auto = "auto" in config.backends
    nvidia = _nvml_backend(config)
    if "nvidia" in config.backends or (auto and nvml_usable(nvidia)):
        backends.append(nvidia)
    if "tpu" in config.backends or (auto and google_tpu_present(config.sysfs_root)):
        backends.append(_tpu_backend(config))
    if not backends:
        log.info("no accelerator found on this node; no devices will be published")
    return backends


async def select_backends(config: DiscoveryConfig) -> list[DiscoveryBackend]:
    return await asyncio.to_thread(select_backends_sync, config)
