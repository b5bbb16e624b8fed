"""Fake sysfs and /dev trees for the simulated backend and the tests.

`write_pci_tree` lays out `sys/bus/pci/devices`, `sys/devices/pci<root>`, `sys/kernel/iommu_groups`
and `dev/` nodes the way Linux does, so the real backends read them unchanged; `make_device_node`
makes one /dev entry (``fakehw`` makes the NVIDIA driver's with it).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dra_node_agent.pci import split_address


@dataclass(frozen=True)
class FakePciFunction:
    """One PCI function to lay out in a fake sysfs tree."""

    address: str
    vendor: int
    device: int
    subsystem_device: int = 0
    class_code: int = 0x120000
    numa_node: int = -1
    iommu_group: int | None = None
    driver: str | None = None
    accel: str | None = None  # "accel0": the accel class device of a v2-v4 TPU
    pcie_root: str | None = None  # "pci0000:3a"; default: a root complex on the device's own bus


def _symlink(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


# Character device numbers of the fake /dev nodes. NVIDIA's are the driver's (195; nvidiactl 255);
# nvidia-uvm, nvidia-caps and vfio groups get a major at module load, so these are typical values;
# accel is the kernel's accel class (261); /dev/vfio/vfio is misc 10:196.
NVIDIA_MAJOR, NVIDIACTL_MINOR = 195, 255
NVIDIA_UVM_MAJOR, NVIDIA_CAPS_MAJOR = 510, 511
# IMEX channels (/dev/nvidia-caps-imex-channels/channel<N>) get a major at module load too.
IMEX_CHANNELS_MAJOR = 509
ACCEL_MAJOR, VFIO_GROUP_MAJOR, VFIO_CONTAINER = 261, 243, (10, 196)


def make_device_node(path: Path, *, major: int, minor: int, char_device: bool) -> None:
    """A character device at ``path`` when ``char_device`` and the process may create one (root,
    CAP_MKNOD), so that a container runtime can inject it as it would the real one; otherwise an
    empty file (test fixtures kept in version control, unprivileged runs)."""
    if char_device:
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISCHR(path.lstat().st_mode):
                path.unlink()
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        except FileExistsError:
            return
        except PermissionError:
            pass
        else:
            path.chmod(0o666)  # as the driver's nodes are; mknod's mode went through the umask
            return
    path.touch()


def write_pci_tree(root: Path, functions: Iterable[FakePciFunction], *, char_devices: bool = False) -> None:
    """Write `root/sys/...` and `root/dev/...` for `functions` (idempotent); `char_devices`: the
    /dev entries are character devices (see :func:`make_device_node`)."""
    sys_root = root / "sys"
    dev_root = root / "dev"
    vfio_used = False
    for fn in functions:
        slot, _ = split_address(fn.address)
        domain, bus, _ = slot.split(":")
        pcie = fn.pcie_root or f"pci{domain}:{bus}"
        device_dir = sys_root / "devices" / pcie / fn.address
        device_dir.mkdir(parents=True, exist_ok=True)
        (device_dir / "vendor").write_text(f"0x{fn.vendor:04x}\n")
        (device_dir / "device").write_text(f"0x{fn.device:04x}\n")
        (device_dir / "subsystem_device").write_text(f"0x{fn.subsystem_device:04x}\n")
        (device_dir / "class").write_text(f"0x{fn.class_code:06x}\n")
        (device_dir / "numa_node").write_text(f"{fn.numa_node}\n")
        _symlink(sys_root / "bus" / "pci" / "devices" / fn.address, device_dir)
        if fn.driver:
            driver_dir = sys_root / "bus" / "pci" / "drivers" / fn.driver
            driver_dir.mkdir(parents=True, exist_ok=True)
            (driver_dir / "bind").touch()  # as in sysfs; also keeps the folder in version control
            _symlink(device_dir / "driver", driver_dir)
        if fn.iommu_group is not None:
            group_dir = sys_root / "kernel" / "iommu_groups" / str(fn.iommu_group)
            (group_dir / "devices").mkdir(parents=True, exist_ok=True)
            _symlink(device_dir / "iommu_group", group_dir)
            _symlink(group_dir / "devices" / fn.address, device_dir)
            if fn.driver == "vfio-pci":
                vfio_used = True
                (dev_root / "vfio").mkdir(parents=True, exist_ok=True)
                make_device_node(
                    dev_root / "vfio" / str(fn.iommu_group),
                    major=VFIO_GROUP_MAJOR,
                    minor=fn.iommu_group,
                    char_device=char_devices,
                )
        if fn.accel:
            class_dir = device_dir / "accel" / fn.accel
            class_dir.mkdir(parents=True, exist_ok=True)
            _symlink(class_dir / "device", device_dir)
            _symlink(sys_root / "class" / "accel" / fn.accel, class_dir)
            dev_root.mkdir(parents=True, exist_ok=True)
            minor = int(fn.accel.removeprefix("accel") or 0)
            make_device_node(dev_root / fn.accel, major=ACCEL_MAJOR, minor=minor, char_device=char_devices)
    if vfio_used:
        major, minor = VFIO_CONTAINER
        make_device_node(dev_root / "vfio" / "vfio", major=major, minor=minor, char_device=char_devices)
