"""Where a DRA driver's kubelet plugin sockets go, and how long those paths can get.

The kubelet's plugin watcher finds ``<registry>/<driver>[-<instance>]-reg.sock``; the DRA service
listens on ``<plugins>/<driver>/dra[-<instance>].sock``. Both are unix sockets, whose paths the kernel
limits to 107 bytes, so whoever lays out a node (the agent's flags, the local cluster's node folders)
needs the longest path the driver will create, rolling-update instance names and the hidden
staging names it binds first included.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

# sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES: Final = 107
# A pod UID, which the DaemonSet passes as the per-instance suffix.
POD_UID_BYTES: Final = 36
# ".<8 hex digits>.sock": the name a socket is bound under before it is moved into place.
STAGING_NAME_BYTES: Final = 14


@dataclass(frozen=True)
class PluginPaths:
    """Where one driver's sockets live; ``plugin_dir`` is the driver's own folder."""

    registration_socket: Path
    plugin_dir: Path
    dra_socket: Path


def plugin_paths(
    *, driver: str, registry_dir: Path, plugins_dir: Path, instance: str | None = None
) -> PluginPaths:
    """Conventional socket paths; ``instance`` (a pod UID) gives per-instance names for rolling updates."""
    if not driver:
        raise ValueError("plugin driver name is empty")
    if "/" in driver or driver.startswith("."):
        raise ValueError(f"plugin driver name {driver!r} cannot name a socket (no '/', no leading '.')")
    suffix = f"-{instance}" if instance else ""
    plugin_dir = Path(os.path.abspath(plugins_dir / driver))
    return PluginPaths(
        registration_socket=Path(os.path.abspath(registry_dir / f"{driver}{suffix}-reg.sock")),
        plugin_dir=plugin_dir,
        dra_socket=plugin_dir / f"dra{suffix}.sock",
    )


def path_bytes(path: Path) -> int:
    return len(os.fsencode(path))


def longest_socket_path(
    *, drivers: Iterable[str], registry_dir: Path, plugins_dir: Path, instance: str | None
) -> Path:
    """The longest socket path that serving ``drivers`` creates, staging names included.

    ``instance`` is the suffix the agent will run with; pass ``"x" * POD_UID_BYTES`` for an agent
    whose pods get one (a DaemonSet that sets POD_UID)."""
    candidates: list[Path] = []
    for driver in drivers:
        paths = plugin_paths(
            driver=driver, registry_dir=registry_dir, plugins_dir=plugins_dir, instance=instance
        )
        for socket in (paths.registration_socket, paths.dra_socket):
            candidates += [socket, socket.with_name("s" * STAGING_NAME_BYTES)]
    if not candidates:
        raise ValueError("no driver named: there are no socket paths to measure")
    return max(candidates, key=path_bytes)
