"""The right health probe for a discovery backend (NVML, TPU sysfs, or their simulated versions)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from dra_node_agent.discovery.base import DiscoveryBackend
from dra_node_agent.discovery.nvml import NvmlBackend
from dra_node_agent.discovery.simulated import SimulatedBackend
from dra_node_agent.discovery.tpu import TpuBackend
from dra_node_agent.health.nvml_probe import DEFAULT_IGNORED_XIDS, NvmlHealthProbe
from dra_node_agent.health.probe import HealthProbe
from dra_node_agent.health.simulate import FakeNvmlHealth, FaultDirectory, SimulatedNvmlProbe
from dra_node_agent.health.tpu_probe import TpuHealthProbe

# Under the simulated backend's state folder: where a demo drops fault files (see FaultDirectory).
FAULTS_FOLDER = "faults"


def probe_for(
    backend: DiscoveryBackend,
    *,
    ignored_xids: Iterable[int] = DEFAULT_IGNORED_XIDS,
    temperature_limit: float | None = None,
) -> HealthProbe | None:
    """A probe watching ``backend``'s devices; None for a backend this package does not know."""
    if isinstance(backend, SimulatedBackend):
        hardware = backend.hardware()
        if hardware.nvml is not None:
            nvml = FakeNvmlHealth.wrapping(hardware.nvml)
            return SimulatedNvmlProbe(
                faults=FaultDirectory(path=hardware.root / FAULTS_FOLDER, nvml=nvml),
                nvml=nvml,
                ignored_xids=ignored_xids,
                temperature_limit=temperature_limit,
            )
        if backend.profile().tpu is not None:
            return TpuHealthProbe(sysfs_root=hardware.root / "sys", dev_root=hardware.root / "dev")
        return None  # the simulated NIC driver (a test stand-in) reports no health
    if isinstance(backend, NvmlBackend):
        return NvmlHealthProbe(
            nvml=backend.nvml_module(), ignored_xids=ignored_xids, temperature_limit=temperature_limit
        )
    if isinstance(backend, TpuBackend):
        sysfs: Path = getattr(backend, "_sysfs_root", Path("/sys"))
        dev: Path = getattr(backend, "_dev_root", Path("/dev"))
        return TpuHealthProbe(sysfs_root=sysfs, dev_root=dev)
    return None
