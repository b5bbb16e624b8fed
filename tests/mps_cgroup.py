"""The cgroup the tests' MPS daemons go under: one per test process (the agents the integration
tests start get it through DRA_AGENT_MPS_CGROUP_PARENT), removed when the session ends, so a run
leaves nothing in the node's cgroup hierarchy; and ``clean_up``, which ends what a test's daemons
left (their processes, cgroups and shm mounts) whatever the test did."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

from dra_node_agent.device_setup import MpsOptions
from dra_node_agent.nvidia import tmpfs
from dra_node_agent.nvidia.cgroups import Hierarchy, MemoryCgroups

PARENT: Final = f"accel-dra-test-{os.getpid()}"
CGROUP_ROOT: Final = Path("/sys/fs/cgroup")


def options(*, shm_size: int = 64 << 20, memory_limit: int = 256 << 20) -> MpsOptions:
    return MpsOptions(
        shm_size=shm_size, memory_limit=memory_limit, cgroup_parent=PARENT, cgroup_root=CGROUP_ROOT
    )


def folder() -> Path | None:
    hierarchy = Hierarchy.detect(CGROUP_ROOT)
    return None if hierarchy is None else hierarchy.root / PARENT


def remove_parent() -> None:
    """Remove the tests' parent cgroup and any claim cgroup a failed test left (empty ones only)."""
    parent = folder()
    if parent is None or not parent.is_dir():
        return
    for child in parent.iterdir():
        if child.is_dir():
            with contextlib.suppress(OSError):
                child.rmdir()
    with contextlib.suppress(OSError):
        parent.rmdir()


def clean_up(root: Path) -> None:
    """End the daemons of every claim folder under ``root`` (an MPS daemons' root): the processes of
    their cgroups, the cgroups, and their shm tmpfs mounts."""
    if not root.is_dir():
        return
    cgroups = MemoryCgroups(cgroup_root=CGROUP_ROOT, parent=PARENT, memory_limit=1 << 30)
    for claim in root.iterdir():
        with contextlib.suppress(Exception):  # a test's clean-up: keep going
            cgroups.remove(claim.name)
        shm = claim / "shm"
        while tmpfs.is_mount_point(shm) and tmpfs.unmount(shm):
            pass
