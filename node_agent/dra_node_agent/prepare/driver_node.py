"""One driver on this node as prepare sees it: what it publishes and the tools it sets devices up with.

The planner, the device set-up and the claim steps share one ``DriverNode``, so a rediscovery
(``use_inventory``) or a tool swapped in reaches all of them at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from dra_node_agent.claim_reader import ClaimAllocation
from dra_node_agent.device_setup import MigInstances, MpsControl, TimeSlicing
from dra_node_agent.devices import DiscoveredDevice, DiscoveredInventory, TpuHostInfo, TpuWorkers
from dra_node_agent.opaqueconfig import TpuConfig


class TpuWorkerSource(Protocol):
    """Multi-host TPU worker identity for a claim (``tpu.multihost.TpuWorkerResolver``); raises
    ``ClaimError`` when it cannot be told right."""

    async def resolve(
        self, *, allocation: ClaimAllocation, host: TpuHostInfo, chips: int, config: TpuConfig | None
    ) -> TpuWorkers | None: ...


@dataclass
class DriverNode:
    driver: str
    node_name: str
    inventory: DiscoveredInventory
    # Applies GpuConfig time-slicing (GPU drivers); None: a config asking for it is refused.
    gpu_sharing: TimeSlicing | None = None
    # Runs a claim's MPS control daemon (GPU drivers); None: a config asking for MPS is refused.
    mps: MpsControl[Any] | None = None
    # Creates and destroys the instances of dynamic MIG placements (GPU drivers in that mode).
    dynamic_mig: MigInstances | None = None
    # Derives the worker identity of a pod on a multi-host TPU slice from its Job (TPU drivers).
    tpu_workers: TpuWorkerSource | None = None
    devices: dict[str, DiscoveredDevice] = field(init=False)

    def __post_init__(self) -> None:
        self.devices = self.inventory.by_name()

    def use_inventory(self, inventory: DiscoveredInventory) -> None:
        """Use a newer discovery result for claims prepared from now on."""
        self.inventory = inventory
        self.devices = inventory.by_name()
