"""The NVIDIA driver's user-space files that a GPU claim's containers get from its CDI spec.

NVIDIA's generated CDI specs (``nvcdi``) mount the driver's libraries and tools themselves, so a
container works without the NVIDIA container runtime acting on ``NVIDIA_VISIBLE_DEVICES``, and
a runtime set to ignore that variable gives no GPU to a pod without a claim. This module finds the
same files under the driver root, once per driver version (``NvmlBackend`` keeps the result), each
mounted read-only, ``nosuid``, ``nodev``, at its path relative to the driver root:

- libraries: each regular file named ``*.so.<driver version>`` in the driver root's library folders
  (``usr/lib64``, ``usr/lib/<triplet>``, ``lib64``, ``lib/<triplet>``), and ``libnvidia-nvvm70.so.*``;
- tools: nvidia-smi, nvidia-debugdump, nvidia-persistenced, nvidia-cuda-mps-control and -server,
  nvidia-imex and nvidia-imex-ctl, from ``usr/bin``, ``usr/sbin``, ``bin``, ``sbin``, ``opt/bin``;
- GSP firmware: ``lib/firmware/nvidia/<version>/gsp*.bin``;
- the persistence daemon's socket ``run/nvidia-persistenced/socket`` (also ``noexec``).
NVIDIA's spec also mounts the host's ``/tmp/nvidia-mps``; this one does not: a claim that asks for
MPS gets a daemon of its own, and no other claim's.

The links. ``nvcdi`` runs two createContainer hooks of ``nvidia-cdi-hook``: ``create-symlinks``
(``libcuda.so`` -> ``libcuda.so.1``) and ``update-ldcache`` (ldconfig over the library folders,
which also makes the SONAME links such as ``libcuda.so.1``). Given the hook's host path
(``--nvidia-cdi-hook-path``) the agent emits the same hooks. Without it (the default, which needs
nothing on the host) each library is also mounted at every name the driver root links to it
(``libcuda.so.1``, ``libcuda.so``): the dynamic linker finds a name in its default folders without a
cache entry. ``docs/install.md`` says where that falls short.

The scan is bounded (entries per folder, files in all, links followed) and blocks: run it in a thread.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dra_node_agent.devices import ContainerEdits, Hook, Mount

log = logging.getLogger(__name__)

LIBRARY_DIRS: Final = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
)
BINARY_DIRS: Final = ("usr/bin", "usr/sbin", "bin", "sbin", "opt/bin")
BINARIES: Final = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
LEGACY_LIBRARIES: Final = ("libnvidia-nvvm70.so.*",)
PERSISTENCED_SOCKET: Final = "run/nvidia-persistenced/socket"
CDI_HOOK: Final = "nvidia-cdi-hook"
# Bounds of one scan: a library folder of a general-purpose host holds a few thousand entries.
MAX_DIR_ENTRIES: Final = 20_000
MAX_FILES: Final = 512
MAX_LINKS_FOLLOWED: Final = 40
_LINK_NAME = re.compile(r"lib[^/]*\.so(\.\d+)*")


@dataclass(frozen=True)
class DriverFile:
    """A file of the driver: its path relative to the driver root (absolute: ``/usr/bin/nvidia-smi``),
    which is also where a container gets it, and the names in its folder that link to it."""

    path: str
    links: tuple[str, ...] = ()
    noexec: bool = False


@dataclass(frozen=True)
class DriverFiles:
    """What one scan of a driver root found, for one driver version."""

    version: str
    libraries: tuple[DriverFile, ...] = ()
    binaries: tuple[DriverFile, ...] = ()
    firmware: tuple[DriverFile, ...] = ()
    sockets: tuple[DriverFile, ...] = ()

    def library_dirs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(os.path.dirname(f.path) for f in self.libraries))

    def container_edits(self, *, host_root: str, hook_path: str | None) -> ContainerEdits:
        """The spec edits: the files mounted from ``host_root`` (the driver root as the container
        runtime sees it), and either NVIDIA's hooks (``hook_path``) or the links as mounts."""
        mounts: list[Mount] = []
        for file in (*self.libraries, *self.binaries, *self.firmware, *self.sockets):
            host = _join(host_root, file.path)
            mounts.append(Mount(host_path=host, container_path=file.path, noexec=file.noexec))
            if hook_path is None:
                mounts.extend(Mount(host_path=host, container_path=link) for link in file.links)
        hooks = _nvidia_hooks(self, hook_path=hook_path) if hook_path is not None else ()
        return ContainerEdits(mounts=tuple(mounts), hooks=hooks)


def _join(root: str, path: str) -> str:
    return path if root in ("", "/") else root.rstrip("/") + path


def _nvidia_hooks(files: DriverFiles, *, hook_path: str) -> tuple[Hook, ...]:
    """nvidia-cdi-hook's create-symlinks (``libcuda.so``) and update-ldcache, as nvcdi writes them."""
    hooks: list[Hook] = []
    for lib in files.libraries:
        name = os.path.basename(lib.path)
        folder = os.path.dirname(lib.path)
        if name.startswith("libcuda.so.") and f"{folder}/libcuda.so.1" in lib.links:
            link = f"libcuda.so.1::{folder}/libcuda.so"
            hooks.append(Hook("createContainer", hook_path, (CDI_HOOK, "create-symlinks", "--link", link)))
    folders = [arg for d in files.library_dirs() for arg in ("--folder", d)]
    if folders:
        hooks.append(Hook("createContainer", hook_path, (CDI_HOOK, "update-ldcache", *folders)))
    return tuple(hooks)


def resolve_in_root(root: Path, path: str) -> str | None:
    """``path`` with every symlink followed as if ``root`` were ``/``: the result is absolute and
    relative to ``root`` (``/usr/lib/x86_64-linux-gnu``), or None when a part is missing or there
    are more than ``MAX_LINKS_FOLLOWED`` links (a loop). An absolute link stays inside ``root``."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    followed = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = root.joinpath(*done, part)
        try:
            mode = os.lstat(candidate).st_mode
            target = os.readlink(candidate) if stat.S_ISLNK(mode) else None
        except OSError:
            return None
        if target is None:
            done.append(part)
            continue
        followed += 1
        if followed > MAX_LINKS_FOLLOWED:
            return None
        if target.startswith("/"):
            done = []
        parts = [p for p in target.split("/") if p not in ("", ".")] + parts
    return "/" + "/".join(done)


class _Budget:
    """How many more files one scan may add (``MAX_FILES``); says once when it runs out."""

    def __init__(self, root: Path) -> None:
        self.left = MAX_FILES
        self.root = root

    def take(self) -> bool:
        if self.left > 0:
            self.left -= 1
            return True
        if self.left == 0:
            log.warning(
                "driver root %s: more than %d driver files; the rest are not mounted", self.root, MAX_FILES
            )
            self.left = -1
        return False


def _entries(root: Path, folder: str) -> list[os.DirEntry[str]]:
    """At most ``MAX_DIR_ENTRIES`` entries of ``folder`` (root-relative), sorted by name."""
    found: list[os.DirEntry[str]] = []
    try:
        with os.scandir(root / folder.lstrip("/")) as listing:
            for entry in listing:
                if len(found) >= MAX_DIR_ENTRIES:
                    log.warning(
                        "driver root %s: %s has more than %d entries; scanned those",
                        root,
                        folder,
                        MAX_DIR_ENTRIES,
                    )
                    break
                found.append(entry)
    except OSError:
        return []
    return sorted(found, key=lambda e: e.name)


def _canonical_dirs(root: Path, folders: Iterable[str]) -> list[str]:
    """The folders that exist, resolved inside the root, each once (``lib`` is often ``usr/lib``)."""
    seen: dict[str, None] = {}
    for folder in folders:
        resolved = resolve_in_root(root, folder)
        if resolved is not None and (root / resolved.lstrip("/")).is_dir():
            seen.setdefault(resolved, None)
    return list(seen)


def _libraries(root: Path, *, version: str, budget: _Budget) -> list[DriverFile]:
    patterns = (*((f"*.so.{version}",) if version else ()), *LEGACY_LIBRARIES)
    found: list[DriverFile] = []
    for folder in _canonical_dirs(root, LIBRARY_DIRS):
        entries = _entries(root, folder)
        files = [e for e in entries if e.is_file(follow_symlinks=False) and _matches(e.name, patterns)]
        links: dict[str, list[str]] = {}
        for entry in entries:
            if entry.is_symlink() and _LINK_NAME.fullmatch(entry.name):
                target = resolve_in_root(root, f"{folder}/{entry.name}")
                if target is not None:
                    links.setdefault(target, []).append(f"{folder}/{entry.name}")
        for entry in files:
            if not budget.take():
                return found
            path = f"{folder}/{entry.name}"
            found.append(DriverFile(path=path, links=tuple(links.get(path, ()))))
    return found


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _binaries(root: Path, *, budget: _Budget) -> list[DriverFile]:
    found: list[DriverFile] = []
    folders = _canonical_dirs(root, BINARY_DIRS)
    for name in BINARIES:
        for folder in folders:
            path = root / folder.lstrip("/") / name
            try:
                mode = os.stat(path).st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode) and mode & 0o111 and budget.take():
                resolved = resolve_in_root(root, f"{folder}/{name}")
                found.append(DriverFile(path=resolved or f"{folder}/{name}"))
                break
    return found


def _firmware(root: Path, *, version: str, budget: _Budget) -> list[DriverFile]:
    if not version:
        return []
    found: list[DriverFile] = []
    for folder in _canonical_dirs(root, (f"lib/firmware/nvidia/{version}",)):
        for entry in _entries(root, folder):
            if entry.is_file(follow_symlinks=False) and fnmatch.fnmatchcase(entry.name, "gsp*.bin"):
                if not budget.take():
                    return found
                found.append(DriverFile(path=f"{folder}/{entry.name}"))
    return found


def _sockets(root: Path, *, budget: _Budget) -> list[DriverFile]:
    resolved = resolve_in_root(root, PERSISTENCED_SOCKET)
    if resolved is None:
        return []
    try:
        is_socket = stat.S_ISSOCK(os.stat(root / resolved.lstrip("/")).st_mode)
    except OSError:
        return []
    return [DriverFile(path=resolved, noexec=True)] if is_socket and budget.take() else []


def scan_driver_root(root: Path, *, version: str) -> DriverFiles:
    """The driver files under ``root`` for driver ``version`` (blocking, bounded; see the module doc)."""
    budget = _Budget(root)
    files = DriverFiles(
        version=version,
        libraries=tuple(_libraries(root, version=version, budget=budget)),
        binaries=tuple(_binaries(root, budget=budget)),
        firmware=tuple(_firmware(root, version=version, budget=budget)),
        sockets=tuple(_sockets(root, budget=budget)),
    )
    if not any(os.path.basename(f.path).startswith("libcuda.so.") for f in files.libraries):
        log.warning(
            "driver root %s has no libcuda.so.%s: GPU containers get the device nodes but no driver "
            "libraries (set --driver-root to where the NVIDIA driver is installed)",
            root,
            version or "<version>",
        )
    return files
