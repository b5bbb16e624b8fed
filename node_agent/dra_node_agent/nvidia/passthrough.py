"""A whole GPU for a virtual machine: from the NVIDIA driver to vfio-pci at prepare, and back.

As NVIDIA's driver does it (``VfioPciManager``, go-nvlib's ``nvpassthrough``), through sysfs:
``driver_override`` set to vfio-pci, the NVIDIA driver's ``unbind``, vfio-pci's ``bind``; back,
the override set to the NVIDIA driver, vfio-pci's ``unbind``, the NVIDIA driver's ``bind``, and
the override cleared (NVIDIA's leaves it set; cleared, the host's own probing works as before).
Each step reads where the GPU is first, so a call goes on from wherever a crash left it.

Before the first step the GPU's IOMMU group is checked, since a VM is given the whole group
(``/dev/vfio/<group>``) and the kernel hands it over only when every function of it is free: each
other function must have no driver, or one that leaves DMA to its owner (pci-stub, pcieport); one
held by vfio-pci already would reach the VM too, and one held by any other driver (another GPU,
an audio function, a NIC) is in use on the host. A process holding the GPU's /dev/nvidia<minor>
(under ``proc_root``) is in the way too: unbinding a GPU in use blocks. Refusals name what is in
the way. Every method blocks: prepare calls them in a thread.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from dra_node_agent.checkpoint import PassthroughRecord
from dra_node_agent.device_setup import DeviceSetupError
from dra_node_agent.devices import ContainerEdits, DeviceNode, DiscoveredDevice
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.nvidia.passthrough_discovery import NVIDIA_DRIVER, VFIO_PCI
from dra_node_agent.opaqueconfig import IommuConfig
from dra_node_agent.pci import GroupTooLarge, iommu_group, iommu_group_members, vfio_cdev
from dra_node_agent.pci_binding import BindingError, PciDriverBinding, SysfsWritten

logger = logging.getLogger(__name__)

# Drivers that leave a function's DMA to whoever owns its group (the kernel's driver_managed_dma).
GROUP_SAFE_DRIVERS: Final = frozenset({"pci-stub", "pcieport"})
# At most this many open files are looked at for a process holding the GPU (a best effort, as
# NVIDIA's fuser check: past it the GPU is taken to be free).
MAX_OPEN_FILES_SCANNED: Final = 200_000


class VfioPassthrough:
    """The ``device_setup.Passthrough`` of NVIDIA GPUs."""

    def __init__(
        self,
        *,
        sysfs_root: Path,
        dev_root: Path,
        host_dev_dir: str,
        proc_root: Path,
        written: SysfsWritten | None = None,
    ) -> None:
        self._sysfs = sysfs_root
        self._dev_root = dev_root
        self._host_dev_dir = host_dev_dir.rstrip("/")
        self._proc_root = proc_root
        self._pci = PciDriverBinding(sysfs_root, written=written)

    @classmethod
    def of(cls, backend: NvmlBackend) -> VfioPassthrough:
        return cls(
            sysfs_root=backend.sysfs_root,
            dev_root=backend.dev_root,
            host_dev_dir=backend.host_dev_dir,
            proc_root=backend.proc_root,
            written=backend.sysfs_written,
        )

    def group_members(self, target: PassthroughRecord) -> list[str]:
        try:
            members = iommu_group_members(self._sysfs, target.iommu_group)
        except (OSError, GroupTooLarge) as exc:
            raise DeviceSetupError(
                f"GPU {target.pci_bus_id}: IOMMU group {target.iommu_group}: {exc}"
            ) from exc
        if target.pci_bus_id not in members:
            raise DeviceSetupError(
                f"GPU {target.pci_bus_id} is not in IOMMU group {target.iommu_group} any more "
                f"(its group is {iommu_group(self._sysfs, target.pci_bus_id)})"
            )
        return members

    def check(self, target: PassthroughRecord, *, gpu_minor: int | None) -> None:
        where = f"GPU {target.pci_bus_id} (IOMMU group {target.iommu_group})"
        if not self._pci.driver_loaded(VFIO_PCI):
            raise DeviceSetupError(
                f"{where}: the vfio-pci driver is not loaded on this node (modprobe vfio-pci)"
            )
        driver = self._pci.driver(target.pci_bus_id)
        if driver not in (NVIDIA_DRIVER, VFIO_PCI, None):
            raise DeviceSetupError(
                f"{where} is bound to driver {driver}, expected {VFIO_PCI} or {NVIDIA_DRIVER}"
            )
        in_use = [
            f"{member} (driver {held})"
            for member in self.group_members(target)
            if member != target.pci_bus_id and (held := self._holder(member)) is not None
        ]
        if in_use:
            raise DeviceSetupError(
                f"{where}: a virtual machine is given the whole IOMMU group, and it also holds "
                f"{', '.join(in_use)}, in use on this node; only a GPU whose group it can have alone "
                "is passed through"
            )
        if driver == NVIDIA_DRIVER and gpu_minor is not None:
            holders = self._processes_holding(f"nvidia{gpu_minor}")
            if holders:
                raise DeviceSetupError(
                    f"{where}: /dev/nvidia{gpu_minor} is open in process(es) {', '.join(holders)}; the "
                    "NVIDIA driver cannot let a GPU go while a process uses it"
                )

    def _holder(self, member: str) -> str | None:
        """The driver of another function of the group that keeps the group from a VM; None if it
        leaves it free."""
        driver = self._pci.driver(member)
        return None if driver is None or driver in GROUP_SAFE_DRIVERS else driver

    def _processes_holding(self, node: str) -> list[str]:
        """PIDs (at most 5 named) with /dev/<node> open, from ``proc_root``'s fd links."""
        wanted = (f"/dev/{node}",)
        found: list[str] = []
        scanned = 0
        try:
            pids = [p for p in os.listdir(self._proc_root) if p.isdigit()]
        except OSError:
            return []
        for pid in pids:
            try:
                fds = os.listdir(self._proc_root / pid / "fd")
            except OSError:
                continue  # gone, or not ours to read
            for fd in fds:
                scanned += 1
                if scanned > MAX_OPEN_FILES_SCANNED:
                    return found
                try:
                    target = os.readlink(self._proc_root / pid / "fd" / fd)
                except OSError:
                    continue
                if target.endswith(wanted):
                    found.append(pid)
                    break
            if len(found) >= 5:
                break
        return found

    def release(self, target: PassthroughRecord) -> None:
        address = target.pci_bus_id
        self._step(
            target, "set driver_override to vfio-pci", lambda: self._pci.set_override(address, VFIO_PCI)
        )
        if self._pci.driver(address) not in (VFIO_PCI, None):
            self._step(target, "unbind it from its driver", lambda: self._pci.unbind(address))

    def bind(self, target: PassthroughRecord) -> None:
        address = target.pci_bus_id
        if self._pci.driver(address) != VFIO_PCI:
            self._step(target, "bind it to vfio-pci", lambda: self._pci.bind(address, VFIO_PCI))

    def restore(self, target: PassthroughRecord) -> None:
        address = target.pci_bus_id
        if self._pci.driver(address) != NVIDIA_DRIVER:
            self._step(
                target,
                "set driver_override to nvidia",
                lambda: self._pci.set_override(address, NVIDIA_DRIVER),
            )
            if self._pci.driver(address) is not None:
                self._step(target, "unbind it from vfio-pci", lambda: self._pci.unbind(address))
            self._step(target, "bind it to the NVIDIA driver", lambda: self._pci.bind(address, NVIDIA_DRIVER))
        if self._pci.override(address) is not None:
            self._step(target, "clear driver_override", lambda: self._pci.set_override(address, None))

    def edits(
        self, device: DiscoveredDevice, target: PassthroughRecord, iommu: IommuConfig
    ) -> tuple[DiscoveredDevice, ContainerEdits]:
        iommufd = iommu.backend_policy == "PreferIommuFD" and (self._dev_root / "iommu").exists()
        if iommufd:
            cdev = vfio_cdev(self._sysfs, target.pci_bus_id)
            if cdev is None:
                raise DeviceSetupError(
                    f"GPU {target.pci_bus_id}: vfio-pci holds it, but it has no IOMMUFD cdev"
                )
            node = self._node(f"vfio/devices/{cdev}")
        else:
            node = self._node(f"vfio/{target.iommu_group}")
        common: tuple[DeviceNode, ...] = ()
        if iommu.enable_api_device:
            common = (self._node("iommu" if iommufd else "vfio/vfio"),)
        device = dataclasses.replace(device, edits=ContainerEdits(device_nodes=(node,)))
        return device, ContainerEdits(device_nodes=common)

    def _node(self, relative: str) -> DeviceNode:
        return DeviceNode(path=f"/dev/{relative}", host_path=f"{self._host_dev_dir}/{relative}")

    @staticmethod
    def _step(target: PassthroughRecord, what: str, step: Callable[[], None]) -> None:
        try:
            step()
        except BindingError as exc:
            raise DeviceSetupError(f"GPU {target.pci_bus_id}: cannot {what}: {exc.strerror or exc}") from exc
        logger.info("GPU %s: %s", target.pci_bus_id, what)
