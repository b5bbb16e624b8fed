"""Which GPUs the prepared claims hold for passthrough, and which for containers.

A GPU bound to vfio-pci is no CUDA device while a virtual machine has it: its GPU and MIG devices
leave the ResourceSlice, and the health monitor stops watching them, until the claim gives it back.
The other way round, as NVIDIA's driver does, a GPU whose GPU or MIG devices claims hold is not
offered for passthrough meanwhile. ``Holds`` says so from the checkpoint's entries; the agent's
wiring filters what it publishes and watches by it. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dra_node_agent import checkpoint as cp
from dra_node_agent.devices import DiscoveredDevice


@dataclass(frozen=True)
class Holds:
    # PCI addresses of the GPUs claims hold for passthrough (bound to vfio-pci, or on the way).
    passed_through: frozenset[str] = frozenset()
    # PCI addresses of the GPUs whose GPU or MIG devices claims hold.
    in_containers: frozenset[str] = frozenset()

    def published(self, device: DiscoveredDevice) -> bool:
        """Whether the device belongs in the ResourceSlice now."""
        if device.kind == "vfio":
            return device.pci_bus_id not in self.in_containers
        return device.pci_bus_id is None or device.pci_bus_id not in self.passed_through

    def watched(self, device: DiscoveredDevice) -> bool:
        """Whether the health monitor watches the device now (never a GPU for passthrough: a VM owns
        its health, and NVML does not see a GPU that vfio-pci holds)."""
        if device.kind == "vfio":
            return False
        return device.pci_bus_id is None or device.pci_bus_id not in self.passed_through


def holds_of(entries: Iterable[cp.ClaimEntry], devices: Mapping[str, DiscoveredDevice]) -> Holds:
    """The holds of the recorded claims; a device's GPU is found in ``devices`` (its PCI address)."""
    passed: set[str] = set()
    used: set[str] = set()
    for entry in entries:
        for held in entry.devices:
            if held.vfio is not None:
                passed.add(held.vfio.pci_bus_id)
            elif (device := devices.get(held.device)) is not None and device.pci_bus_id is not None:
                used.add(device.pci_bus_id)
    return Holds(passed_through=frozenset(passed), in_containers=frozenset(used))
