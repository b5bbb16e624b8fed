"""A claim's MPS folders on the node: who owns them, their modes, its shm tmpfs, their removal.

Under ``<state dir>/<driver>/mps/`` (mode 0711: the claim UIDs cannot be listed by other users of
the node, yet a non-root MPS server, which the daemon starts as its client's user, can reach its
files), one folder per claim (0711) holding:

- ``pipe/`` (0755, root): the daemon's sockets, its lock, PID file and log FIFO. The claim's
  containers get it read-only: a client only connects to the ``control`` socket, which needs no
  write access to the folder (seen with the real daemon, root and non-root clients alike). So no
  container can plant a file or a link where the root daemon writes, before a restart or ever.
- ``shm/``: a tmpfs of the claim's shm size (``tmpfs``), mode 1777 as /dev/shm always is, since the
  daemon's servers and the claim's clients, of any user, share memory there. Its containers' /dev/shm.
- ``log/`` (0755, root): the daemon's output and logs; never shown to a container.
- ``daemon.json``: the daemon's PID and settings (``mps``).

Blocking: call in a thread.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Final

from dra_node_agent.nvidia import tmpfs

logger = logging.getLogger(__name__)

PARENT_MODE: Final = 0o711
PIPE_MODE: Final = 0o755
LOG_MODE: Final = 0o755
SHM_MODE: Final = 0o1777


def make(folder: Path, *, shm_size: int) -> None:
    """Create the claim's folders (modes set again on folders an older agent made) and mount its
    shm tmpfs unless it is mounted. Raises OSError (EPERM from the mount: no CAP_SYS_ADMIN).

    A shm that is a plain folder was made by an agent before the tmpfs: that claim's containers
    have it bound as their /dev/shm, so a daemon started again for it (as after the agent's upgrade)
    must get the same folder, not a tmpfs over it that they would not see. It keeps its folder
    until it is unprepared."""
    shm = folder / "shm"
    legacy = shm.is_dir() and not tmpfs.is_mount_point(shm)
    for parent in (folder.parent, folder):
        parent.mkdir(mode=PARENT_MODE, parents=True, exist_ok=True)
        parent.chmod(PARENT_MODE)
    for name, mode in (("pipe", PIPE_MODE), ("log", LOG_MODE)):
        (folder / name).mkdir(mode=mode, exist_ok=True)
        (folder / name).chmod(mode)
    if legacy:
        logger.warning(
            "MPS claim %s keeps the shm folder an older agent made (not size-limited) until it is "
            "unprepared: its containers have it as their /dev/shm",
            folder.name,
        )
        return
    shm.mkdir(mode=0o755, exist_ok=True)
    if not tmpfs.is_mount_point(shm):
        tmpfs.mount_tmpfs(shm, size=shm_size, mode=SHM_MODE)


def remove(folder: Path) -> None:
    """Unmount the claim's shm tmpfs (its files go with it) and remove the folder."""
    shm = folder / "shm"
    for _ in range(8):  # a mount over a mount (made by hand?) goes too
        if not tmpfs.is_mount_point(shm) or not tmpfs.unmount(shm):
            break
    shutil.rmtree(folder, ignore_errors=True)
