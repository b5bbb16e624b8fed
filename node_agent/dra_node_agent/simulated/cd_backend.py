"""NVIDIA's compute-domain driver over a simulated GPU node (``simulated.discovery``'s fake NVML).

The real ``ComputeDomainBackend`` reads the fake GPUs' NVLink fabric info and the fake /proc, so a
simulated node publishes what a GB200 tray (a clique) or an H100 host (no clique) would.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Final

from dra_api import computedomains as cd
from dra_node_agent.devices import ContainerEdits, DiscoveredInventory, Mount
from dra_node_agent.nvidia import cd_record
from dra_node_agent.nvidia.cd_discovery import ComputeDomainBackend
from dra_node_agent.simulated.discovery import SIMULATED_DRIVER_ROOT, SimulatedBackend, SimulatedHardware
from dra_node_agent.simulated.health_probe import FAULTS_FOLDER
from dra_node_agent.simulated.host_tools import IMEX_FAULTS, IMEX_FAULTS_MOUNT


class SimulatedComputeDomainBackend:
    """NVIDIA's compute-domain driver over a simulated GPU node's fake NVML: the real
    ``ComputeDomainBackend`` reads the fake GPUs' fabric info and the fake /proc. Its daemons'
    containers also get the node's IMEX fault folder (read-only), where a test makes the node's
    simulated nvidia-imex fail."""

    vendor: Final = "simulated"

    def __init__(self, gpus: SimulatedBackend, *, host_managed: bool, strict_fabric: bool) -> None:
        self._gpus = gpus
        self._host_managed = host_managed
        self._strict = strict_fabric
        self._hardware: SimulatedHardware | None = None
        self._lock = threading.Lock()

    @property
    def driver(self) -> str:
        return cd.DRIVER

    async def discover(self) -> DiscoveredInventory:
        return await asyncio.to_thread(self.discover_sync)

    def discover_sync(self) -> DiscoveredInventory:
        backend = self.hardware().backend
        assert isinstance(backend, ComputeDomainBackend)
        return backend.discover_sync()

    def hardware(self) -> SimulatedHardware:
        """The GPU node's fake hardware, with the compute-domain driver's backend and record (and no
        NVML of its own: its devices have no GPU health)."""
        with self._lock:
            if self._hardware is None:
                gpus = self._gpus.hardware()
                assert gpus.nvml is not None
                faults = gpus.root / FAULTS_FOLDER / IMEX_FAULTS
                faults.mkdir(parents=True, exist_ok=True)
                driver_root = gpus.root / SIMULATED_DRIVER_ROOT
                backend = ComputeDomainBackend(
                    nvml=gpus.nvml,
                    driver_root=driver_root,
                    host_driver_root=str(driver_root),
                    proc_root=gpus.root / "proc",
                    host_managed=self._host_managed,
                    strict_fabric=self._strict,
                    simulated=True,
                    simulated_daemon_edits=ContainerEdits(
                        mounts=(Mount(host_path=str(faults), container_path=IMEX_FAULTS_MOUNT),)
                    ),
                )
                self._hardware = dataclasses.replace(
                    gpus, nvml=None, backend=backend, vendor=cd_record.RECORD
                )
            return self._hardware
