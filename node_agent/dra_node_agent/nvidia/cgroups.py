"""A memory cgroup of its own for a process the agent starts (a claim's MPS daemon), outside the
agent's own cgroup, on cgroup v2 or v1.

Why: a process the agent starts inherits the agent's cgroup, so its memory counts against the
agent's container limit; one claim's daemon growing there gets the agent OOM-killed, and every
other claim's daemon with it. A cgroup of its own under a parent outside the agent's (the flag
``--mps-cgroup-parent``, below the root of the node's hierarchy) has a limit of its own: when it is
hit, the kernel's OOM killer picks among that cgroup's processes only.

Where: ``--cgroup-root`` is where the node's cgroup file system is mounted. A privileged container
on cgroup v2 shares the host's cgroup namespace (containerd gives only unprivileged ones a private
one), so its ``/sys/fs/cgroup`` is the node's whole hierarchy; on cgroup v1 (and hybrid hosts) the
memory controller's hierarchy is ``<root>/memory``.

All functions block (file system writes, a short wait at removal): call them in a thread.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dra_node_agent.device_setup import DeviceSetupError

logger = logging.getLogger(__name__)

# A parent is a relative cgroup path: names of letters, digits, '.', '_' and '-' that do not start
# with a dot (so never '..'), joined by '/'.
_PARENT: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
REMOVE_WAIT_SECONDS: Final = 5.0


class CgroupError(DeviceSetupError):
    """A cgroup that could not be made, limited or removed; the message names the file and why."""


def valid_parent(parent: str) -> bool:
    return bool(_PARENT.fullmatch(parent))


@dataclass(frozen=True)
class Hierarchy:
    """Where the memory controller's hierarchy is: ``version`` 2 (unified) or 1."""

    version: int
    root: Path

    @staticmethod
    def detect(cgroup_root: Path) -> Hierarchy | None:
        """The memory hierarchy under ``cgroup_root``; None when there is none to use."""
        controllers = cgroup_root / "cgroup.controllers"
        if controllers.is_file():
            try:
                available = controllers.read_text().split()
            except OSError:
                return None
            return Hierarchy(version=2, root=cgroup_root) if "memory" in available else None
        v1 = cgroup_root / "memory"
        if (v1 / "memory.limit_in_bytes").is_file():
            return Hierarchy(version=1, root=v1)
        return None


class MemoryCgroups:
    """The cgroups ``<parent>/<name>`` of one kind of process, each with the same memory limit."""

    def __init__(self, *, cgroup_root: Path, parent: str, memory_limit: int) -> None:
        if not valid_parent(parent):
            raise ValueError(f"cgroup parent {parent!r} is not a relative cgroup path")
        self._cgroup_root = cgroup_root
        self._parent = parent
        self.memory_limit = memory_limit
        self._hierarchy: Hierarchy | None = None

    def hierarchy(self) -> Hierarchy:
        if self._hierarchy is None:
            found = Hierarchy.detect(self._cgroup_root)
            if found is None:
                raise CgroupError(
                    f"no cgroup memory controller under {self._cgroup_root} (neither a cgroup v2 root "
                    "offering memory nor a v1 memory hierarchy): set --cgroup-root to where the node's "
                    "cgroup file system is mounted"
                )
            self._hierarchy = found
        return self._hierarchy

    def path(self, name: str) -> Path:
        if not _NAME.fullmatch(name):
            raise ValueError(f"cgroup name {name!r}")
        return self.hierarchy().root / self._parent / name

    def create(self, name: str) -> Path:
        """Make (or keep) the cgroup with its limit; returns the file a process writes its PID to,
        to move itself in (``cgroup.procs``)."""
        hierarchy = self.hierarchy()
        folder = self.path(name)
        try:
            if hierarchy.version == 2:
                self._enable_memory_down_to(folder.parent)
            folder.mkdir(parents=True, exist_ok=True)
            if hierarchy.version == 2:
                _write(folder / "memory.max", str(self.memory_limit))
                # Swap would let the limit be exceeded slowly; the whole group goes on an OOM kill,
                # so no server is left without its control daemon.
                _write_if_present(folder / "memory.swap.max", "0")
                _write_if_present(folder / "memory.oom.group", "1")
            else:
                _write(folder / "memory.limit_in_bytes", str(self.memory_limit))
        except OSError as exc:
            raise CgroupError(f"setting up cgroup {folder}: {exc.strerror or exc}") from exc
        return folder / "cgroup.procs"

    def _enable_memory_down_to(self, folder: Path) -> None:
        """cgroup v2: a child has memory.max only where every ancestor delegates the controller."""
        levels = [self.hierarchy().root]
        for part in folder.relative_to(levels[0]).parts:
            levels.append(levels[-1] / part)
        for level in levels:
            level.mkdir(exist_ok=True)
            control = level / "cgroup.subtree_control"
            if "memory" not in control.read_text().split():
                _write(control, "+memory")

    def members(self, name: str) -> list[int]:
        try:
            text = (self.path(name) / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return [int(line) for line in text.split() if line.strip()]

    def oom_kills(self, name: str) -> int:
        """How many processes the kernel's OOM killer ended in this cgroup (0 when unknown)."""
        try:
            folder = self.path(name)
            source = folder / ("memory.events" if self.hierarchy().version == 2 else "memory.oom_control")
            for line in source.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError, CgroupError):
            pass
        return 0

    def remove(self, name: str) -> None:
        """Kill whatever still runs in the cgroup, then remove it; nothing to do when it is gone (or
        there is no hierarchy to have made it in)."""
        try:
            folder = self.path(name)
        except CgroupError:
            return
        if not folder.is_dir():
            return
        deadline = time.monotonic() + REMOVE_WAIT_SECONDS
        while True:
            members = self.members(name)
            if not members:
                break
            if time.monotonic() > deadline:
                raise CgroupError(f"cgroup {folder}: processes {members} did not end")
            self._kill(folder, members)
            time.sleep(0.02)
        try:
            folder.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CgroupError(f"removing cgroup {folder}: {exc.strerror or exc}") from exc

    def _kill(self, folder: Path, members: list[int]) -> None:
        kill_file = folder / "cgroup.kill"  # cgroup v2, Linux 5.14+: the whole cgroup at once
        if self.hierarchy().version == 2 and kill_file.exists():
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
                return
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _write(path: Path, value: str) -> None:
    # Unbuffered and without truncation: a cgroup file takes one write.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _write_if_present(path: Path, value: str) -> None:
    try:
        _write(path, value)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
