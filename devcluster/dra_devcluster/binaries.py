"""Find or build the control-plane binaries: etcd, kube-apiserver, -controller-manager, -scheduler, kubectl.

Order of preference, per binary:
1. a directory named by ``DRA_CONTROL_PLANE_ASSETS``, then by ``KUBEBUILDER_ASSETS`` (envtest's
   convention; envtest ships only etcd, kube-apiserver and kubectl, so the rest is still built);
2. the per-user cache ``$XDG_CACHE_HOME/accel-dra/control-plane/<versions>/bin``;
3. a build from the pinned Go modules (``gomod/``) with the machine's Go toolchain, into that cache.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

log = logging.getLogger(__name__)

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.8"

ASSETS_ENV = "DRA_CONTROL_PLANE_ASSETS"
ENVTEST_ASSETS_ENV = "KUBEBUILDER_ASSETS"
CACHE_ENV = "DRA_CONTROL_PLANE_CACHE"

# Binary name -> Go package that builds it, relative to the wrapper module in gomod/.
_PACKAGES: dict[str, str] = {
    "etcd": "./etcd",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
}
BINARY_NAMES = tuple(_PACKAGES)


class BinariesUnavailable(RuntimeError):
    """Neither prebuilt binaries nor a working Go build are available."""


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path

    @classmethod
    def from_mapping(cls, paths: dict[str, Path]) -> Binaries:
        return cls(
            etcd=paths["etcd"],
            kube_apiserver=paths["kube-apiserver"],
            kube_controller_manager=paths["kube-controller-manager"],
            kube_scheduler=paths["kube-scheduler"],
            kubectl=paths["kubectl"],
        )


def cache_dir() -> Path:
    """The per-user, per-version directory that holds built binaries."""
    override = os.environ.get(CACHE_ENV)
    base = Path(override) if override else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "accel-dra" / "control-plane" / f"kubernetes-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}"


def _usable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _from_asset_dirs() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for env in (ASSETS_ENV, ENVTEST_ASSETS_ENV):
        directory = os.environ.get(env)
        if not directory:
            continue
        for name in BINARY_NAMES:
            candidate = Path(directory) / name
            if name not in found and _usable(candidate):
                found[name] = candidate
    return found


def _unavailable_message(missing: list[str], reason: str) -> str:
    return (
        f"cannot provide control-plane binaries {', '.join(missing)}: {reason}. Either install a Go "
        f"toolchain (go 1.26+) that reaches the Go module proxy, so they are built once into "
        f"{cache_dir()}, or point {ASSETS_ENV} (or {ENVTEST_ASSETS_ENV}, as for envtest) at a directory "
        f"holding {', '.join(BINARY_NAMES)} for Kubernetes {KUBERNETES_VERSION}."
    )


@contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    # Two test sessions may start at once; one builds, the other waits and reuses.
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(names: list[str], *, into: Path) -> None:
    """Build ``names`` from the pinned Go modules into ``into`` (blocking; minutes when cold)."""
    go = shutil.which("go")
    if go is None:
        raise BinariesUnavailable(_unavailable_message(names, "no `go` on PATH"))
    into.mkdir(parents=True, exist_ok=True)
    source = resources.files("dra_api.localcluster") / "gomod"
    with tempfile.TemporaryDirectory(prefix="accel-dra-gobuild-") as tmp:
        module = Path(tmp)
        for rel in ("go.mod", "go.sum", "tools.go", "etcd/main.go"):
            (module / rel).parent.mkdir(parents=True, exist_ok=True)
            (module / rel).write_bytes((source / rel).read_bytes())
        staging = into / ".staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        command = [go, "build", "-trimpath", "-o", str(staging), *(_PACKAGES[n] for n in names)]
        log.info(
            "building %s (Kubernetes %s, etcd %s); cold builds take many minutes",
            ", ".join(names),
            KUBERNETES_VERSION,
            ETCD_VERSION,
        )
        started = time.monotonic()
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly")
        result = subprocess.run(command, cwd=module, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-20:])
            raise BinariesUnavailable(_unavailable_message(names, f"`go build` failed:\n{tail}"))
        # Rename one by one so a reader never sees a half-written binary.
        for name in names:
            os.replace(staging / name, into / name)
        staging.rmdir()
        log.info("built %s in %.0f s", ", ".join(names), time.monotonic() - started)


def ensure_binaries(*, allow_build: bool = True) -> Binaries:
    """Return paths to all five binaries, building the missing ones when allowed."""
    found = _from_asset_dirs()
    bin_dir = cache_dir() / "bin"
    for name in BINARY_NAMES:
        if name not in found and _usable(bin_dir / name):
            found[name] = bin_dir / name
    missing = [n for n in BINARY_NAMES if n not in found]
    if missing:
        if not allow_build:
            raise BinariesUnavailable(_unavailable_message(missing, "building was not allowed"))
        with _build_lock(cache_dir()):
            still_missing = [n for n in missing if not _usable(bin_dir / n)]
            if still_missing:
                build(still_missing, into=bin_dir)
        for name in missing:
            found[name] = bin_dir / name
    return Binaries.from_mapping(found)
