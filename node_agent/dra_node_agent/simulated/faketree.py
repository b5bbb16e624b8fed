"""Fake sysfs and /dev trees for the simulated backend and the tests.

`write_pci_tree` lays out `sys/bus/pci/devices`, `sys/devices/pci<root>`, `sys/kernel/iommu_groups`,
`sys/bus/pci/drivers` and `dev/` nodes the way Linux does, so the real backends read them unchanged;
`make_device_node` makes one /dev entry (``fakehw`` makes the NVIDIA driver's with it). What a
function bound to vfio-pci shows (its group's node, its IOMMUFD cdev) is made by `add_vfio_nodes`,
which ``fakekernel`` calls too when it binds one.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dra_node_agent.pci import link_basename, split_address


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
    # Memory BARs as sysfs's `resource` lists them: (size in bytes, flags); none: no file.
    bars: tuple[tuple[int, int], ...] = ()


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
VFIO_CDEV_MAJOR, IOMMU_DEVICE = 242, (10, 124)
VFIO_PCI, NVIDIA_DRIVER = "vfio-pci", "nvidia"
# BAR flags as sysfs prints them: a 32-bit memory BAR, and a 64-bit prefetchable one.
BAR_MEM32, BAR_MEM64_PREFETCH = 0x40200, 0x14220C


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


def write_pci_tree(
    root: Path,
    functions: Iterable[FakePciFunction],
    *,
    char_devices: bool = False,
    drivers: Iterable[str] = (),
    iommufd: bool = False,
) -> None:
    """Write `root/sys/...` and `root/dev/...` for `functions` (idempotent); `char_devices`: the
    /dev entries are character devices (see :func:`make_device_node`). `drivers` are loaded beside
    the functions' own (their sysfs folders exist; vfio-pci's brings /dev/vfio/vfio); `iommufd`: the
    kernel has IOMMUFD (/dev/iommu, and a cdev per function vfio-pci holds)."""
    sys_root = root / "sys"
    dev_root = root / "dev"
    functions = list(functions)
    loaded = {*drivers, *(fn.driver for fn in functions if fn.driver)}
    for driver in loaded:
        driver_dir = sys_root / "bus" / "pci" / "drivers" / driver
        driver_dir.mkdir(parents=True, exist_ok=True)
        for name in ("bind", "unbind"):  # as in sysfs; also keeps the folder in version control
            (driver_dir / name).touch()
    if VFIO_PCI in loaded:
        major, minor = VFIO_CONTAINER
        (dev_root / "vfio").mkdir(parents=True, exist_ok=True)
        make_device_node(dev_root / "vfio" / "vfio", major=major, minor=minor, char_device=char_devices)
    if iommufd:
        dev_root.mkdir(parents=True, exist_ok=True)
        major, minor = IOMMU_DEVICE
        make_device_node(dev_root / "iommu", major=major, minor=minor, char_device=char_devices)
    for fn in functions:
        _write_function(root, fn, char_devices=char_devices, iommufd=iommufd)


def _write_function(root: Path, fn: FakePciFunction, *, char_devices: bool, iommufd: bool) -> None:
    sys_root = root / "sys"
    dev_root = root / "dev"
    slot, _ = split_address(fn.address)
    domain, bus, _ = slot.split(":")
    pcie = fn.pcie_root or f"pci{domain}:{bus}"
    device_dir = sys_root / "devices" / pcie / fn.address
    # Laid out again at every agent start: a function's binding is the kernel's state, which
    # outlives the agent, so only a new function gets its driver from the profile.
    fresh = not device_dir.exists()
    device_dir.mkdir(parents=True, exist_ok=True)
    (device_dir / "vendor").write_text(f"0x{fn.vendor:04x}\n")
    (device_dir / "device").write_text(f"0x{fn.device:04x}\n")
    (device_dir / "subsystem_device").write_text(f"0x{fn.subsystem_device:04x}\n")
    (device_dir / "class").write_text(f"0x{fn.class_code:06x}\n")
    (device_dir / "numa_node").write_text(f"{fn.numa_node}\n")
    if not (device_dir / "driver_override").exists():
        (device_dir / "driver_override").write_text("(null)\n")
    if fn.bars:
        (device_dir / "resource").write_text(_resource_text(fn.bars))
    _symlink(sys_root / "bus" / "pci" / "devices" / fn.address, device_dir)
    if fn.driver and fresh:
        _symlink(device_dir / "driver", sys_root / "bus" / "pci" / "drivers" / fn.driver)
    if fn.iommu_group is not None:
        group_dir = sys_root / "kernel" / "iommu_groups" / str(fn.iommu_group)
        (group_dir / "devices").mkdir(parents=True, exist_ok=True)
        _symlink(device_dir / "iommu_group", group_dir)
        _symlink(group_dir / "devices" / fn.address, device_dir)
        if link_basename(device_dir / "driver") == VFIO_PCI:
            add_vfio_nodes(root, fn.address, group=fn.iommu_group, char_devices=char_devices, iommufd=iommufd)
    if fn.accel:
        class_dir = device_dir / "accel" / fn.accel
        class_dir.mkdir(parents=True, exist_ok=True)
        _symlink(class_dir / "device", device_dir)
        _symlink(sys_root / "class" / "accel" / fn.accel, class_dir)
        dev_root.mkdir(parents=True, exist_ok=True)
        minor = int(fn.accel.removeprefix("accel") or 0)
        make_device_node(dev_root / fn.accel, major=ACCEL_MAJOR, minor=minor, char_device=char_devices)


def _resource_text(bars: tuple[tuple[int, int], ...]) -> str:
    """sysfs's `resource`: one "start end flags" line per BAR (six, then the ROM), laid out from 4 GiB."""
    lines, start = [], 1 << 32
    for size, flags in bars:
        lines.append(f"0x{start:016x} 0x{start + size - 1:016x} 0x{flags:016x}")
        start += size
    lines += ["0x0000000000000000 0x0000000000000000 0x0000000000000000"] * (7 - len(bars))
    return "\n".join(lines) + "\n"


def add_vfio_nodes(root: Path, address: str, *, group: int, char_devices: bool, iommufd: bool) -> None:
    """What vfio-pci makes when it takes a function: its group's /dev/vfio/<group>, and with IOMMUFD
    the function's cdev (sysfs `vfio-dev/vfio<N>`, /dev/vfio/devices/vfio<N>)."""
    vfio = root / "dev" / "vfio"
    vfio.mkdir(parents=True, exist_ok=True)
    make_device_node(vfio / str(group), major=VFIO_GROUP_MAJOR, minor=group, char_device=char_devices)
    if not iommufd:
        return
    (vfio / "devices").mkdir(exist_ok=True)
    device_dir = root / "sys" / "bus" / "pci" / "devices" / address
    mine = sorted((device_dir / "vfio-dev").glob("vfio*"))
    if mine:
        index = int(mine[0].name.removeprefix("vfio"))
    else:
        used = {p.name for p in (vfio / "devices").iterdir()}
        index = next(i for i in range(len(used) + 1) if f"vfio{i}" not in used)
        (device_dir / "vfio-dev" / f"vfio{index}").mkdir(parents=True, exist_ok=True)
    make_device_node(
        vfio / "devices" / f"vfio{index}", major=VFIO_CDEV_MAJOR, minor=index, char_device=char_devices
    )


def remove_vfio_nodes(root: Path, address: str, *, group: int, group_still_bound: bool) -> None:
    """What goes when vfio-pci lets a function go: its cdev, and its group's node once no function
    of the group is held by vfio-pci any more."""
    device_dir = root / "sys" / "bus" / "pci" / "devices" / address
    for cdev in list((device_dir / "vfio-dev").glob("vfio*")):
        (root / "dev" / "vfio" / "devices" / cdev.name).unlink(missing_ok=True)
        cdev.rmdir()
    if not group_still_bound:
        (root / "dev" / "vfio" / str(group)).unlink(missing_ok=True)
