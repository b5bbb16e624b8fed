"""A simulated NIC driver: a test and demo stand-in, not a network driver of this product.

It exists so that a claim aligning an accelerator with a NIC of another driver
(``constraints: matchAttribute: resource.kubernetes.io/pcieRoot`` or ``.../numaNode``) can run
end to end on a node without such a NIC driver: the agent publishes it as a third driver (its own
name, default ``nic.sim.accel-dra.dev``, its own pool and slices) from a profile's ``nic:`` section.
Preparing one of its NICs moves no network interface into the pod; the container gets environment
only (``DRA_SIM_NIC_<n>_IFNAME``, ``..._PCIE_ROOT``, ``..._NUMA_NODE``), so a test can see which
NIC it got. A real NIC driver (e.g. kubernetes-sigs/dranet, ``dra.net``) publishes the same
standard attributes, which is what the alignment relies on.

The NICs are laid out in a fake sysfs tree like the simulated GPUs, and their PCIe root and NUMA
node are read back with the readers the GPU and TPU backends use, so the values a claim matches
across drivers come out of one code path.
"""

from __future__ import annotations

import asyncio
import re
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dra_api.names import STANDARD_ATTRIBUTE_DOMAIN
from dra_node_agent.devices import (
    Attribute,
    ContainerEdits,
    DiscoveredDevice,
    DiscoveredInventory,
    bool_attr,
    int_attr,
    sorted_devices,
    string_attr,
)
from dra_node_agent.pci import pci_device_dir, pcie_root, read_int
from dra_node_agent.simulated.faketree import FakePciFunction

NIC_DRIVER = "nic.sim.accel-dra.dev"
MELLANOX_VENDOR = 0x15B3
CONNECTX7_DEVICE = 0x1021
ETHERNET_CLASS = 0x020000
ENV_PREFIX = "DRA_SIM_NIC_"
_IF_NAME = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,14}$")  # Linux IFNAMSIZ: 15 characters


@dataclass(frozen=True)
class SimNic:
    """One simulated NIC of a profile; ``pcie_root`` None puts it on a root of its own bus."""

    if_name: str
    pci_bus_id: str
    pcie_root: str | None
    numa_node: int
    rdma: bool


@dataclass(frozen=True)
class NicProfile:
    driver: str
    nics: tuple[SimNic, ...]


def valid_if_name(name: str) -> bool:
    return bool(_IF_NAME.fullmatch(name))


def nic_pci_functions(profile: NicProfile) -> list[FakePciFunction]:
    return [
        FakePciFunction(
            address=nic.pci_bus_id,
            vendor=MELLANOX_VENDOR,
            device=CONNECTX7_DEVICE,
            class_code=ETHERNET_CLASS,
            numa_node=nic.numa_node,
            driver="mlx5_core",
            pcie_root=nic.pcie_root,
        )
        for nic in profile.nics
    ]


class SimulatedNicBackend:
    """Discovery of a NIC profile's NICs over the fake sysfs tree at ``sysfs_root`` (written by
    the simulated backend); UUIDs derive from the node name, as for simulated GPUs."""

    # No record of its own: it runs inside the simulated backend, whose record builds nothing for it
    # (no health probe, no tools, no environment).
    vendor: Final = "simulated-nic"

    def __init__(self, *, driver: str, profile: NicProfile, sysfs_root: Path, node_name: str) -> None:
        self._driver = driver
        self._profile = profile
        self._sysfs_root = sysfs_root
        self._node_name = node_name

    @property
    def driver(self) -> str:
        return self._driver

    async def discover(self) -> DiscoveredInventory:
        return await asyncio.to_thread(self.discover_sync)

    def discover_sync(self) -> DiscoveredInventory:
        """Blocking sysfs reads; call from a worker thread."""
        devices = [self._device(index, nic) for index, nic in enumerate(self._profile.nics)]
        return DiscoveredInventory(driver=self._driver, devices=sorted_devices(devices), simulated=True)

    def _device(self, index: int, nic: SimNic) -> DiscoveredDevice:
        attributes: dict[str, Attribute] = {
            "type": string_attr("nic"),
            "ifName": string_attr(nic.if_name),
            "rdma": bool_attr(nic.rdma),
            f"{STANDARD_ATTRIBUTE_DOMAIN}/pciBusID": string_attr(nic.pci_bus_id),
        }
        env = [f"{ENV_PREFIX}{index}_IFNAME={nic.if_name}"]
        root = pcie_root(self._sysfs_root, nic.pci_bus_id)
        if root is not None:
            attributes[f"{STANDARD_ATTRIBUTE_DOMAIN}/pcieRoot"] = string_attr(root)
            env.append(f"{ENV_PREFIX}{index}_PCIE_ROOT={root}")
        numa = read_int(pci_device_dir(self._sysfs_root, nic.pci_bus_id) / "numa_node")
        if numa is not None and numa >= 0:
            attributes[f"{STANDARD_ATTRIBUTE_DOMAIN}/numaNode"] = int_attr(numa)
            env.append(f"{ENV_PREFIX}{index}_NUMA_NODE={numa}")
        uuid = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"sim://{self._node_name}/nic/{nic.pci_bus_id}"))
        return DiscoveredDevice(
            name=f"nic-{index}",
            kind="nic",
            uuid=uuid,
            attributes=attributes,
            pci_bus_id=nic.pci_bus_id,
            local_id=str(index),
            edits=ContainerEdits(env=tuple(env)),
        )
