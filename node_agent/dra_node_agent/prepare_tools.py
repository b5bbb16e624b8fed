"""The prepare-time tools of a driver's devices, built from the discovery backend that found them.

Discovery only discovers; what changes a device's state at prepare (a GPU's time slice, a claim's
MPS daemon, a dynamic MIG instance) is built here, from the driver install that NVML discovery found
(on a simulated node, the NVML backend it runs over its fake hardware), and so is the environment
the devices' vendor adds to a claim's CDI spec. Each returns None where the devices have no such
tool (TPUs, the simulated NIC driver). All blocking: callers use a thread.
"""

from __future__ import annotations

from pathlib import Path

from dra_api.kubeletapi.socketpaths import MAX_SOCKET_PATH_BYTES
from dra_node_agent.cdi import VendorEnv
from dra_node_agent.device_status import VendorStatusData
from dra_node_agent.devices import DiscoveryBackend
from dra_node_agent.nvidia import mps
from dra_node_agent.nvidia.container_env import NvidiaEnv
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.nvidia.dynamic_mig import DynamicMig
from dra_node_agent.nvidia.gpu_sharing import GpuSharing, NvmlComputeModes
from dra_node_agent.settings import MPS_DAEMON_MEMORY_MIN, MPS_SHM_SIZE_MIN, Settings, quantity_bytes
from dra_node_agent.simulated.discovery import SimulatedBackend
from dra_node_agent.tpu.container_env import TpuEnv
from dra_node_agent.tpu.discovery import TpuBackend
from dra_node_agent.tpu.status_data import TpuStatusData


def nvml_backend(backend: DiscoveryBackend) -> NvmlBackend | None:
    """The NVML backend behind ``backend``: itself, or the one a simulated GPU profile runs."""
    if isinstance(backend, NvmlBackend):
        return backend
    if isinstance(backend, SimulatedBackend):
        return backend.nvml_backend()
    return None


def tpu_backend(backend: DiscoveryBackend) -> TpuBackend | None:
    """The TPU backend behind ``backend``: itself, or the one a simulated TPU profile runs."""
    if isinstance(backend, TpuBackend):
        return backend
    if isinstance(backend, SimulatedBackend):
        return backend.tpu_backend()
    return None


def vendor_env(backend: DiscoveryBackend) -> VendorEnv | None:
    """The environment these devices' vendor adds to a claim's CDI spec (None: the simulated NIC
    driver, whose devices carry all they need in their own edits)."""
    if nvml_backend(backend) is not None:
        return NvidiaEnv()
    if tpu_backend(backend) is not None:
        return TpuEnv()
    return None


def status_data(backend: DiscoveryBackend) -> VendorStatusData | None:
    """What these devices' vendor adds to the data of a claim's device status (None: the UUID and
    PCI bus ID every device gets are all there is, as for GPUs)."""
    if tpu_backend(backend) is not None:
        return TpuStatusData()
    return None


def gpu_sharing(backend: DiscoveryBackend) -> GpuSharing | None:
    """Time-slicing on these GPUs (looks for nvidia-smi under the driver root)."""
    nvml = nvml_backend(backend)
    if nvml is None:
        return None
    return GpuSharing(
        compute_modes=NvmlComputeModes(nvml),
        nvidia_smi=nvml.nvidia_smi(),
        driver_root=nvml.driver_root,
        env=nvml.tool_env(),
    )


def mps_daemons(
    backend: DiscoveryBackend, root: Path, options: mps.MpsOptions | None = None
) -> mps.MpsDaemons | None:
    """Per-claim MPS daemons from the driver root's tools, kept under ``root``, run as ``options``
    say (their shm size and cgroup; the defaults without)."""
    nvml = nvml_backend(backend)
    if nvml is None:
        return None
    return mps.MpsDaemons(
        root=root,
        control=mps.find_control_tool(nvml.driver_root),
        driver_root=nvml.driver_root,
        env=nvml.tool_env(),
        # The simulated stand-in makes a FIFO, not unix sockets: its paths may be long.
        socket_path_max=None if nvml.simulated else MAX_SOCKET_PATH_BYTES,
        options=options,
    )


def mps_options(settings: Settings) -> mps.MpsOptions:
    """The MPS daemons' shm size, memory limit and cgroup from the agent's settings."""
    return mps.MpsOptions(
        shm_size=quantity_bytes("mps_shm_size", settings.mps_shm_size, least=MPS_SHM_SIZE_MIN),
        memory_limit=quantity_bytes(
            "mps_daemon_memory_limit", settings.mps_daemon_memory_limit, least=MPS_DAEMON_MEMORY_MIN
        ),
        cgroup_parent=settings.mps_cgroup_parent,
        cgroup_root=settings.cgroup_root,
    )


def mig_instances(backend: DiscoveryBackend) -> DynamicMig | None:
    """Creates and destroys dynamic MIG instances on these GPUs (None: dynamic MIG is off)."""
    nvml = nvml_backend(backend)
    return DynamicMig(nvml) if nvml is not None and nvml.dynamic_mig else None
