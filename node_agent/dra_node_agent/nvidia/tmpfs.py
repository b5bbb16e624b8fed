"""A size-limited tmpfs mounted on a folder, and its removal, through mount(2) and umount2(2).

A claim's MPS shm folder is its containers' /dev/shm: a folder on the node's root disk would let
a container fill that disk (the kubelet's ephemeral-storage accounting does not see CDI mounts).
A tmpfs of a fixed size fails a write past it with ENOSPC instead, and its pages are charged to
the memory cgroup of the process that writes them (the container's own). Mounted ``nosuid``,
``nodev`` and ``noexec``, as a container runtime mounts /dev/shm.

The mount is made in the agent's mount namespace; for the container runtime to see it, the
agent's state folder must propagate mounts to the host (a hostPath with ``mountPropagation:
Bidirectional``), as the gpu overlay and the chart set. Blocking: call in a thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path
from typing import Final

_MS_NOSUID: Final = 0x2
_MS_NODEV: Final = 0x4
_MS_NOEXEC: Final = 0x8
_MNT_DETACH: Final = 0x2  # lazy: a mount still in use goes once it is not
_UMOUNT_NOFOLLOW: Final = 0x8


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def is_mount_point(path: Path) -> bool:
    """Whether ``path`` is the root of a file system other than its parent's (not following a link)."""
    try:
        here = os.lstat(path)
        parent = os.lstat(path.parent)
    except FileNotFoundError:
        return False
    return here.st_dev != parent.st_dev or here.st_ino == parent.st_ino


def mount_tmpfs(path: Path, *, size: int, mode: int) -> None:
    """Mount a tmpfs of ``size`` bytes, root folder ``mode``, on ``path`` (already a folder).
    Raises OSError with the kernel's errno (EPERM: the agent lacks CAP_SYS_ADMIN)."""
    options = f"size={size},mode={mode:o}".encode()
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    if _libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", flags, options) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(path))


def unmount(path: Path) -> bool:
    """Detach whatever is mounted on ``path`` (never following a link there); False when nothing
    was mounted on it. Raises OSError for any other failure."""
    if _libc().umount2(os.fsencode(path), _MNT_DETACH | _UMOUNT_NOFOLLOW) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOENT):  # not a mount point, or no such folder
        return False
    raise OSError(code, os.strerror(code), str(path))
