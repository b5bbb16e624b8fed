"""GPUs published for passthrough to virtual machines (NVIDIA's ``PassthroughSupport``).

With the agent's ``--passthrough-support``, every NVIDIA GPU function (a display or 3D controller,
not an SR-IOV virtual function) is also published as ``gpu-vfio-<index>``, its index in bus order
among them, as NVIDIA's driver names them: ``type=vfio`` and NVIDIA's attributes (``uuid``, derived
from the PCI address, ``deviceID``, ``vendorID``, ``productName``, ``iommuFDEnabled``, the standard
PCI attributes) with ``addressableMemory`` as capacity, plus ``iommuGroup``, which NVIDIA's driver
does not publish. A GPU is published so while it is free to be rebound: held by the NVIDIA driver
without MIG devices (as NVIDIA's), by vfio-pci already, or by no driver; the group's node is what a claim's
container gets (``nvidia.passthrough`` binds the GPU at prepare). Blocking sysfs reads: run in a
thread, as discovery is.
"""

from __future__ import annotations

import dataclasses
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from dra_api.names import STANDARD_ATTRIBUTE_DOMAIN
from dra_node_agent.devices import (
    Attribute,
    ContainerEdits,
    CounterSet,
    DeviceNode,
    DiscoveredDevice,
    bool_attr,
    int_attr,
    string_attr,
)
from dra_node_agent.pci import (
    addressable_memory,
    bound_driver,
    iommu_enabled,
    iommu_group,
    is_virtual_function,
    list_functions,
    pci_device_dir,
    pcie_root,
    read_hex,
    read_int,
)

VFIO_TYPE: Final = "vfio"
NVIDIA_DRIVER: Final = "nvidia"
VFIO_PCI: Final = "vfio-pci"
NVIDIA_VENDOR: Final = 0x10DE
# go-nvlib's name for a device its PCI database does not know.
UNKNOWN_DEVICE: Final = "UNKNOWN_DEVICE"
_GPU_CLASSES: Final = (0x0300, 0x0302)  # VGA and 3D controllers (class code >> 8)


def standard_pci_attributes(sysfs_root: Path, bus_id: str) -> dict[str, Attribute]:
    """``resource.kubernetes.io/`` pciBusID, pcieRoot and numaNode, as NVIDIA's driver sets them."""
    attributes = {f"{STANDARD_ATTRIBUTE_DOMAIN}/pciBusID": string_attr(bus_id)}
    root = pcie_root(sysfs_root, bus_id)
    if root is not None:
        attributes[f"{STANDARD_ATTRIBUTE_DOMAIN}/pcieRoot"] = string_attr(root)
    # -1 (no NUMA affinity, or a single-node machine) and a missing entry leave it out, not a guess.
    numa = read_int(pci_device_dir(sysfs_root, bus_id) / "numa_node")
    if numa is not None and numa >= 0:
        attributes[f"{STANDARD_ATTRIBUTE_DOMAIN}/numaNode"] = int_attr(numa)
    return attributes


def nvidia_gpu_functions(sysfs_root: Path) -> list[str]:
    """The NVIDIA GPU functions of the host in bus order (go-nvlib's ``GetGPUs``)."""
    found = []
    for address in list_functions(sysfs_root):
        folder = pci_device_dir(sysfs_root, address)
        klass = read_hex(folder / "class")
        if read_hex(folder / "vendor") != NVIDIA_VENDOR or klass is None or klass >> 8 not in _GPU_CLASSES:
            continue
        if not is_virtual_function(sysfs_root, address):
            found.append(address)
    return found


def vfio_uuid(address: str) -> str:
    """The device's UUID: a name-based (SHA-1, DNS namespace) UUID of its PCI address, NVIDIA's."""
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, address))


def passthrough_devices(
    *,
    sysfs_root: Path,
    dev_root: Path,
    host_dev_dir: str,
    product_names: Mapping[str, str],
    cuda_devices: Sequence[DiscoveredDevice],
    errors: list[str],
) -> list[DiscoveredDevice]:
    """One device per GPU that may be passed through; what stops the others goes to ``errors``.

    ``product_names`` are NVML's names by PCI address (a GPU vfio-pci holds is none of NVML's:
    the name it had, or go-nvlib's unknown); ``cuda_devices`` are the devices NVML found.
    """
    if not iommu_enabled(sysfs_root):
        errors.append(
            "passthrough: the kernel has no IOMMU groups (IOMMU off?); no GPU is published for passthrough"
        )
        return []
    iommufd = (dev_root / "iommu").exists()
    with_migs = {d.pci_bus_id for d in cuda_devices if d.kind == "mig"}
    devices = []
    for index, address in enumerate(nvidia_gpu_functions(sysfs_root)):
        driver = bound_driver(sysfs_root, address)
        # None: between two binding steps (a crash there is undone at start-up, after discovery).
        if driver not in (NVIDIA_DRIVER, VFIO_PCI, None) or address in with_migs:
            continue  # another driver's, or partitioned: its MIG devices are published instead
        group = iommu_group(sysfs_root, address)
        if group is None:
            errors.append(f"passthrough: GPU {address} has no IOMMU group; not published for passthrough")
            continue
        attributes = {
            "type": string_attr(VFIO_TYPE),
            "uuid": string_attr(vfio_uuid(address)),
            "deviceID": string_attr(f"0x{read_hex(pci_device_dir(sysfs_root, address) / 'device') or 0:04x}"),
            "vendorID": string_attr(f"0x{NVIDIA_VENDOR:04x}"),
            "productName": string_attr(product_names.get(address, UNKNOWN_DEVICE)[:64]),
            "iommuFDEnabled": bool_attr(iommufd),
            "iommuGroup": int_attr(group),
            **standard_pci_attributes(sysfs_root, address),
        }
        memory = addressable_memory(sysfs_root, address)
        node = DeviceNode(path=f"/dev/vfio/{group}", host_path=f"{host_dev_dir}/vfio/{group}")
        devices.append(
            DiscoveredDevice(
                name=f"gpu-vfio-{index}",
                kind=VFIO_TYPE,
                uuid=vfio_uuid(address),
                attributes=attributes,
                capacity={"addressableMemory": memory} if memory is not None else {},
                pci_bus_id=address,
                local_id=str(group),
                edits=ContainerEdits(device_nodes=(node,)),
            )
        )
    return devices


GUARD_COUNTER: Final = "whole-gpu"


def guard_passthrough(
    devices: Sequence[DiscoveredDevice],
) -> tuple[list[DiscoveredDevice], list[CounterSet]]:
    """``devices`` with each GPU's ``gpu-vfio-<index>`` and ``gpu-<minor>`` made to consume the one
    counter of a set of their own (``gpu-vfio-<index>-counter-set``, ``whole-gpu: 1``), so that no
    allocator gives the two to two claims; and those sets. The set is named after the passthrough
    device, which is published whichever driver holds the GPU, so it stays put while a claim moves
    the GPU to vfio-pci and back. (The settings refuse passthrough beside dynamic MIG and shares,
    whose devices would need more of the counters than this.)"""
    sets = {
        d.pci_bus_id: CounterSet(name=f"{d.name}-counter-set", counters={GUARD_COUNTER: 1}, guard=True)
        for d in devices
        if d.kind == VFIO_TYPE and d.pci_bus_id is not None
    }
    guarded = []
    for device in devices:
        guard = sets.get(device.pci_bus_id) if device.pci_bus_id is not None else None
        takes_whole_gpu = device.kind == VFIO_TYPE or (device.kind == "gpu" and device.consumes is None)
        if guard is not None and takes_whole_gpu:
            device = dataclasses.replace(device, consumes=guard)
        guarded.append(device)
    return guarded, list(sets.values())
