"""What release a binary says it is, checked against the one it stands in for.

Binaries the project builds carry the versions it pinned (``-ldflags``), but those handed in through
``DRA_CONTROL_PLANE_ASSETS`` or ``KUBEBUILDER_ASSETS`` can be of any release: a cluster of another
minor would pass or fail the tests for reasons of its own, with a version header that claims
otherwise. Each such binary is asked for its version once per process (``--version`` and the like,
half a second each); :func:`mismatch` says in one line what is wrong, and
:mod:`dra_devcluster.binaries` stops with it.

Kubernetes binaries must be the chosen release exactly (their gitVersion). etcd must be of the
pinned etcd's minor: the API server's etcd client is compatible within one, and envtest's archives
do not always carry the patch release a Kubernetes ``go.mod`` requires.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final


class VersionUnknown(Exception):
    """The binary could not be asked, or did not answer in the form expected of it."""


@dataclass(frozen=True)
class _Probe:
    args: tuple[str, ...]
    parse: Callable[[str], str | None]


def _first(pattern: str) -> Callable[[str], str | None]:
    compiled = re.compile(pattern, re.MULTILINE)

    def parse(text: str) -> str | None:
        found = compiled.search(text)
        return found.group(1) if found else None

    return parse


def _kubectl(text: str) -> str | None:
    try:
        version = json.loads(text)["clientVersion"]["gitVersion"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(version)


_KUBERNETES: Final = _Probe(("--version",), _first(r"^Kubernetes (v\S+)"))
_CONTAINERD: Final = _Probe(("--version",), _first(r" (v\d+\.\d+\.\d+\S*)"))
# What each binary prints: "Kubernetes v1.37.2"; "etcd Version: 3.7.0"; "containerd
# github.com/containerd/containerd/v2 v2.2.9 <rev>"; the shim's "Version:  v2.2.9"; "v3.22.0+g<rev>".
PROBES: Final[dict[str, _Probe]] = {
    "kube-apiserver": _KUBERNETES,
    "kube-controller-manager": _KUBERNETES,
    "kube-scheduler": _KUBERNETES,
    "kubelet": _KUBERNETES,
    "kubectl": _Probe(("version", "--client", "-o", "json"), _kubectl),
    "etcd": _Probe(("--version",), _first(r"^etcd Version: (\S+)")),
    "containerd": _CONTAINERD,
    "ctr": _CONTAINERD,
    "containerd-shim-runc-v2": _Probe(("-v",), _first(r"Version:\s+(v?\d\S*)")),
    "helm": _Probe(("version", "--short"), _first(r"^(v\d+\.\d+\.\d+)")),
}
_TIMEOUT_S: Final = 60.0
# (path, size, mtime) -> the version it printed: each file is asked once per process.
_SEEN: dict[tuple[str, int, int], str] = {}


def reported_version(path: Path) -> str:
    """The version the binary at ``path`` prints (its name says how to ask), or raises
    :class:`VersionUnknown`."""
    name = path.name
    probe = PROBES[name]
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key in _SEEN:
        return _SEEN[key]
    try:
        result = subprocess.run(
            [str(path), *probe.args], capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VersionUnknown(f"cannot ask {path} for its version: {exc}") from exc
    version = probe.parse(result.stdout + "\n" + result.stderr)
    if result.returncode != 0 or version is None:
        said = " ".join((result.stdout + result.stderr).split())[:200]
        raise VersionUnknown(
            f"cannot tell the version of {path}: `{name} {' '.join(probe.args)}` "
            f"exited {result.returncode} and said {said!r}"
        )
    _SEEN[key] = version
    return version


def _plain(version: str) -> str:
    return version.lstrip("v")


def _minor(version: str) -> str:
    return ".".join(_plain(version).split(".")[:2])


def mismatch(
    path: Path, *, expected: str, release: str, source: str, minor_only: bool = False, hint: str = ""
) -> str | None:
    """One line saying why the binary at ``path`` is not of version ``expected`` (``minor_only``:
    of its major and minor), or None when it is. ``release`` names what needs that version,
    ``source`` where the binary came from (an environment variable) and ``hint`` another way out."""
    try:
        found = reported_version(path)
    except VersionUnknown as exc:
        return f"{exc} (from ${source})"
    shown = _minor if minor_only else _plain
    if shown(found) == shown(expected):
        return None
    wanted = f"{_minor(expected)}.x" if minor_only else expected
    said = f"{path} (from ${source}) is version {found}, not {wanted} ({release})"
    return f"{said}: point {source} at {wanted}{hint}"
