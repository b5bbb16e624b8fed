"""The kernel's side of the fake sysfs tree: what writing ``driver_override``, a driver's ``bind``
and its ``unbind`` do to a PCI function, as Linux does it.

``pci_binding.PciDriverBinding`` writes the files of the fake tree as it would the host's; the
simulated hardware hands it a ``FakePciKernel`` that it calls after each write, which then moves the
function's ``driver`` link, makes or removes what vfio-pci shows (the group's /dev/vfio/<group>, the
IOMMUFD cdev) and refuses what the kernel refuses, with its errno:

- ``bind`` of a function that has a driver: EBUSY; of one whose driver_override names another
  driver, or which the driver does not match (vfio-pci matches nothing without an override; the
  NVIDIA driver, NVIDIA display controllers): ENODEV;
- ``unbind`` of a function the driver does not hold: ENODEV.

The fake NVML reads the same ``driver`` links: a GPU that the NVIDIA driver does not hold is not
one of its GPUs (``fakehw``).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from dra_node_agent.pci import bound_driver, iommu_group, iommu_group_members, read_hex
from dra_node_agent.pci_binding import NO_OVERRIDE
from dra_node_agent.simulated.faketree import NVIDIA_DRIVER, VFIO_PCI, add_vfio_nodes, remove_vfio_nodes

_NVIDIA_VENDOR, _DISPLAY_CLASS = 0x10DE, 0x03


class FakePciKernel:
    """Acts on writes to the fake sysfs tree under ``root``/sys (called after each one)."""

    def __init__(self, root: Path, *, char_devices: bool, iommufd: bool) -> None:
        self.root = root
        self.sysfs = root / "sys"
        self.char_devices = char_devices
        self.iommufd = iommufd
        self.writes: list[tuple[str, str]] = []  # (file relative to sys, text): what tests read back

    def __call__(self, path: Path, text: str) -> None:
        relative = path.relative_to(self.sysfs)
        self.writes.append((str(relative), text))
        value = text.strip()
        if path.name == "driver_override":
            path.write_text(f"{value or NO_OVERRIDE}\n")
        elif relative.parts[:3] == ("bus", "pci", "drivers") and path.name in ("bind", "unbind"):
            path.write_text("")  # sysfs's bind and unbind read back empty
            driver = relative.parts[3]
            if path.name == "bind":
                self._bind(value, driver)
            else:
                self._unbind(value, driver)

    def _device_dir(self, address: str) -> Path:
        device_dir = self.sysfs / "bus" / "pci" / "devices" / address
        if not device_dir.exists():
            raise OSError(errno.ENODEV, f"no PCI function {address}")
        return device_dir

    def _bind(self, address: str, driver: str) -> None:
        device_dir = self._device_dir(address)
        if bound_driver(self.sysfs, address) is not None:
            raise OSError(errno.EBUSY, f"{address} already has a driver")
        override = (device_dir / "driver_override").read_text().strip()
        if override != NO_OVERRIDE and override != driver:
            raise OSError(errno.ENODEV, f"{address}: driver_override is {override}, not {driver}")
        if override == NO_OVERRIDE and not self._matches(device_dir, driver):
            raise OSError(errno.ENODEV, f"{driver} does not match {address}")
        real = device_dir.resolve()
        (real / "driver").symlink_to(os.path.relpath(self.sysfs / "bus" / "pci" / "drivers" / driver, real))
        group = iommu_group(self.sysfs, address)
        if driver == VFIO_PCI and group is not None:
            add_vfio_nodes(
                self.root, address, group=group, char_devices=self.char_devices, iommufd=self.iommufd
            )

    def _unbind(self, address: str, driver: str) -> None:
        device_dir = self._device_dir(address)
        if bound_driver(self.sysfs, address) != driver:
            raise OSError(errno.ENODEV, f"{driver} does not hold {address}")
        (device_dir / "driver").unlink()
        group = iommu_group(self.sysfs, address)
        if driver == VFIO_PCI and group is not None:
            still = any(
                bound_driver(self.sysfs, member) == VFIO_PCI
                for member in iommu_group_members(self.sysfs, group)
            )
            remove_vfio_nodes(self.root, address, group=group, group_still_bound=still)

    @staticmethod
    def _matches(device_dir: Path, driver: str) -> bool:
        if driver != NVIDIA_DRIVER:
            return False
        vendor = read_hex(device_dir / "vendor")
        klass = read_hex(device_dir / "class")
        return vendor == _NVIDIA_VENDOR and klass is not None and klass >> 16 == _DISPLAY_CLASS
