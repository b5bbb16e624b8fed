"""Unix socket files for the plugin servers: paths, directories, stale files, permissions, removal."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import stat
from pathlib import Path
from typing import Final

from dra_api.kubeletapi.socketpaths import MAX_SOCKET_PATH_BYTES, PluginPaths, path_bytes

logger = logging.getLogger(__name__)

DEFAULT_REGISTRY_DIR: Final = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR: Final = Path("/var/lib/kubelet/plugins")

DIRECTORY_MODE: Final = 0o750
SOCKET_MODE: Final = 0o600


def make_directory(path: Path, *, force_mode: bool) -> None:
    """Create ``path`` and its missing parents with mode 0750; with ``force_mode`` also fix an existing one.

    Only the driver's own folder is forced: the registry folder belongs to kubelet and is shared.
    """
    if not path.exists():
        missing = [path, *(parent for parent in path.parents if not parent.exists())]
        for folder in reversed(missing):
            folder.mkdir(mode=DIRECTORY_MODE, exist_ok=True)
            os.chmod(folder, DIRECTORY_MODE)  # mkdir's mode is filtered by the umask
    elif not path.is_dir():
        raise ValueError(f"plugin socket directory {path} exists and is not a directory")
    elif force_mode:
        os.chmod(path, DIRECTORY_MODE)


def _check_length(path: Path) -> None:
    size = path_bytes(path)
    if size > MAX_SOCKET_PATH_BYTES:
        raise ValueError(
            f"plugin socket path {path} is {size} bytes, more than the {MAX_SOCKET_PATH_BYTES} allowed"
        )


def staging_path(path: Path) -> Path:
    """Where to bind before moving the socket into place; hidden, so kubelet ignores it meanwhile."""
    staging = path.with_name(f".{secrets.token_hex(4)}.sock")  # STAGING_NAME_BYTES long
    _check_length(path)
    _check_length(staging)
    if path.is_dir():
        raise ValueError(f"plugin socket path {path} is a directory")
    return staging


def publish_socket(*, staging: Path, path: Path) -> int:
    """Lock the freshly bound socket down and move it to ``path``, replacing any stale file there.

    Binding elsewhere and renaming means the socket never shows up with loose permissions, the path
    never goes missing while a stale file is replaced, and the new socket's inode differs from any
    socket an older instance still owns (so that instance's ``remove_socket`` leaves it alone).
    Returns the inode.
    """
    os.chmod(staging, SOCKET_MODE)
    replaced = path.exists() or path.is_symlink()
    os.replace(staging, path)
    if replaced:
        logger.info("replaced a stale file at plugin socket path %s", path)
    return path.lstat().st_ino


def remove_socket(path: Path, *, inode: int | None) -> None:
    """Remove our socket, unless another instance has since bound a new one at the same path."""
    try:
        current = path.lstat().st_ino
    except FileNotFoundError:
        return
    if inode is not None and current != inode:
        logger.info("left plugin socket %s in place: it now belongs to another instance", path)
        return
    path.unlink(missing_ok=True)


def _dead(path: Path) -> bool:
    """Whether ``path`` is a socket file nothing listens on any more."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return False
    except FileNotFoundError:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return True
        except OSError:
            return False  # busy or slow: not provably dead
    return False


def remove_dead_siblings(*, driver: str, paths: PluginPaths) -> list[Path]:
    """Remove the sockets other instances of ``driver`` left behind when they were killed.

    With per-instance names (a rolling update) a killed pod's sockets are never reused, and the
    kubelet would keep a registration for them; live ones (the other pod during an update) stay.
    Returns what was removed.
    """
    candidates = [
        *paths.registration_socket.parent.glob(f"{driver}-reg.sock"),
        *paths.registration_socket.parent.glob(f"{driver}-*-reg.sock"),
        *paths.plugin_dir.glob("dra*.sock"),
    ]
    removed = []
    for path in candidates:
        if path in (paths.registration_socket, paths.dra_socket) or not _dead(path):
            continue
        path.unlink(missing_ok=True)
        logger.info("removed plugin socket %s: no instance listens on it any more", path)
        removed.append(path)
    return removed
