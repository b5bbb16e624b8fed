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


# --- passthrough: IOMMU groups, drivers, BARs ------------------------------------------------

# Bounds of what is read from sysfs: PCI functions on one host, members of one IOMMU group (a group
# is one PCIe hierarchy without ACS; hosts have dozens of functions in one at most), BARs per function.
MAX_PCI_FUNCTIONS = 4096
MAX_GROUP_MEMBERS = 256
_BARS = 6
_BAR_MEM_TYPE_MASK, _BAR_MEM_TYPE_64 = 0x06, 0x04
_IOMMU_GROUP = re.compile(r"^[0-9]{1,9}$")


def valid_address(address: str) -> bool:
    return _ADDRESS.fullmatch(address) is not None


def _address_key(address: str) -> int:
    return int(address.replace(":", "").replace(".", ""), 16)


def list_functions(sysfs_root: Path) -> list[str]:
    """Every PCI function's address, in bus order (at most ``MAX_PCI_FUNCTIONS``)."""
    try:
        names = os.listdir(sysfs_root / "bus" / "pci" / "devices")
    except OSError:
        return []
    found = [n for n in names if valid_address(n)]
    return sorted(found, key=_address_key)[:MAX_PCI_FUNCTIONS]


def bound_driver(sysfs_root: Path, address: str) -> str | None:
    """The driver a function is bound to ("nvidia", "vfio-pci"); None when it has none."""
    return link_basename(pci_device_dir(sysfs_root, address) / "driver")


def iommu_group(sysfs_root: Path, address: str) -> int | None:
    """The function's IOMMU group; None when the IOMMU is off (or the link is malformed)."""
    name = link_basename(pci_device_dir(sysfs_root, address) / "iommu_group")
    return int(name) if name is not None and _IOMMU_GROUP.fullmatch(name) else None


def iommu_enabled(sysfs_root: Path) -> bool:
    """Whether the kernel made any IOMMU group (no groups: the IOMMU is off or absent)."""
    try:
        with os.scandir(sysfs_root / "kernel" / "iommu_groups") as entries:
            return any(True for _ in entries)
    except OSError:
        return False


class GroupTooLarge(ValueError):
    """An IOMMU group with more members than ``MAX_GROUP_MEMBERS``."""


def iommu_group_members(sysfs_root: Path, group: int) -> list[str]:
    """The PCI functions of an IOMMU group, in bus order; ``GroupTooLarge`` past the bound."""
    folder = sysfs_root / "kernel" / "iommu_groups" / str(group) / "devices"
    found: list[str] = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if len(found) >= MAX_GROUP_MEMBERS:
                raise GroupTooLarge(f"IOMMU group {group} has more than {MAX_GROUP_MEMBERS} members")
            if valid_address(entry.name):
                found.append(entry.name)
    return sorted(found, key=_address_key)


def vfio_cdev(sysfs_root: Path, address: str) -> str | None:
    """The function's VFIO character device under /dev/vfio/devices ("vfio3") while vfio-pci holds
    it on a kernel with IOMMUFD's device interface; None otherwise."""
    try:
        names = os.listdir(pci_device_dir(sysfs_root, address) / "vfio-dev")
    except OSError:
        return None
    cdevs = sorted(n for n in names if re.fullmatch(r"vfio[0-9]{1,6}", n))
    return cdevs[0] if cdevs else None


def is_virtual_function(sysfs_root: Path, address: str) -> bool:
    """An SR-IOV virtual function has a ``physfn`` link to its physical function."""
    return os.path.lexists(pci_device_dir(sysfs_root, address) / "physfn")


def addressable_memory(sysfs_root: Path, address: str) -> int | None:
    """The 64-bit memory BARs' total size rounded up to a power of two, as go-nvlib sums them for
    NVIDIA's ``addressableMemory``; None when the ``resource`` file cannot be read."""
    try:
        lines = (pci_device_dir(sysfs_root, address) / "resource").read_text().splitlines()[:_BARS]
    except OSError:
        return None
    total = 0
    for line in lines:
        try:
            start, end, flags = (int(v, 16) for v in line.split())
        except ValueError:
            return None
        if end > start and flags & _BAR_MEM_TYPE_MASK == _BAR_MEM_TYPE_64:
            total += end - start + 1
    return 1 << (total - 1).bit_length() if total else 0
