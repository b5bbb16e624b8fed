"""One driver on this node as prepare sees it: what it publishes and the tools it sets devices up with.

The planner, the device set-up and the claim steps share one ``DriverNode``, so a rediscovery
(``use_inventory``) or a tool swapped in reaches all of them at once. The tools are the vendor's
(its record, ``vendor_record``, builds them); prepare knows them only by their protocols.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dra_node_agent.claim_context import ClaimContextSource
from dra_node_agent.device_setup import DomainMembership, MigInstances, MpsControl, Passthrough, TimeSlicing
from dra_node_agent.devices import DiscoveredDevice, DiscoveredInventory


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
    # Binds GPUs to vfio-pci for passthrough and back (GPU drivers); None: such devices are refused.
    passthrough: Passthrough | None = None
    # Works out the vendor's context of a claim (TPU drivers: a multi-host pod's worker identity).
    claim_context: ClaimContextSource[Any] | None = None
    # Joins the node to the domains its claims name (NVIDIA's compute-domain driver).
    domains: DomainMembership | None = None
    devices: dict[str, DiscoveredDevice] = field(init=False)

    def __post_init__(self) -> None:
        self.devices = self.inventory.by_name()

    def use_inventory(self, inventory: DiscoveredInventory) -> None:
        """Use a newer discovery result for claims prepared from now on."""
        self.inventory = inventory
        self.devices = inventory.by_name()
