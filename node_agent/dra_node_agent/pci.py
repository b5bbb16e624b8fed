"""Small sysfs PCI readers shared by the NVIDIA and TPU backends (blocking; call from a thread)."""

from __future__ import annotations

import os
import re
from pathlib import Path

_PCIE_ROOT = re.compile(r"^pci([0-9a-f]{4}):([0-9a-f]{2})$")
_ADDRESS = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")


def split_address(address: str) -> tuple[str, int]:
    """ "0000:c0:02.1" -> ("0000:c0:02", 1): the slot and the PCI function number."""
    match = _ADDRESS.fullmatch(address)
    if not match:
        raise ValueError(f"PCI address {address!r}: expected dddd:bb:dd.f")
    return f"{match[1]}:{match[2]}:{match[3]}", int(match[4])


def pci_device_dir(sysfs_root: Path, address: str) -> Path:
    return sysfs_root / "bus" / "pci" / "devices" / address


def pcie_root(sysfs_root: Path, address: str) -> str | None:
    """The PCIe root complex of a device ("pci0000:3a"), from where its sysfs link points."""
    link = pci_device_dir(sysfs_root, address)
    try:
        target = os.path.realpath(link, strict=True)
    except OSError:
        return None
    for part in Path(target).parts:
        if _PCIE_ROOT.fullmatch(part):
            return part
    return None


def read_hex(path: Path) -> int | None:
    """Read a sysfs hex attribute such as `vendor` ("0x1ae0"); None if absent or malformed."""
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def link_basename(path: Path) -> str | None:
    """Basename of a symlink's target (`iommu_group` -> "12", `driver` -> "vfio-pci")."""
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None
