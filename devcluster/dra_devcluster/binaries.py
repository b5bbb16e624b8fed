"""Find or build the control-plane binaries (etcd, kube-apiserver, -controller-manager, -scheduler,
kubectl), the node binaries (kubelet, containerd, its runc shim, ctr) and helm (the chart tests).

Order of preference, per binary:
1. a directory named by ``DRA_CONTROL_PLANE_ASSETS``, then by ``KUBEBUILDER_ASSETS`` (envtest's
   convention; envtest ships only etcd, kube-apiserver and kubectl, so the rest is still built);
2. the per-user cache ``$XDG_CACHE_HOME/accel-dra/control-plane/<versions>/bin`` (node binaries:
   ``.../accel-dra/node/<versions>/bin``);
3. a build from the pinned Go modules with the machine's Go toolchain, into that cache:
   ``gomod/k8s-<minor>/`` (Kubernetes and etcd of the chosen version, see
   :mod:`dra_devcluster.versions`), ``gomod/containerd/`` (containerd, whose dependencies differ) and
   ``gomod/helm/`` (helm; cache ``.../accel-dra/helm/<version>/bin``).

Every function that depends on the Kubernetes version takes it as ``kubernetes``; left out, it is
the one :func:`dra_devcluster.versions.resolve` picks (``DRA_KUBERNETES_VERSION``, else the default).
Every binary taken from an asset directory is asked for its version and must be of the release it
stands in for (:mod:`dra_devcluster.binary_versions`), else one line says which is not.

runc and the CNI plugins come from Debian packages (``runc``, ``containernetworking-plugins``), found
as :mod:`dra_devcluster.prerequisites` says (the table ``make`` checks and installs them from).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from dra_devcluster import prerequisites
from dra_devcluster.binary_versions import mismatch
from dra_devcluster.versions import VERSION_ENV, KubernetesVersion, resolve

log = logging.getLogger(__name__)

CONTAINERD_VERSION = "v2.2.9"
HELM_VERSION = "v3.22.0"

ASSETS_ENV = "DRA_CONTROL_PLANE_ASSETS"
ENVTEST_ASSETS_ENV = "KUBEBUILDER_ASSETS"
CACHE_ENV = "DRA_CONTROL_PLANE_CACHE"

# Binary name -> Go package that builds it, relative to the version's wrapper module in gomod/.
_PACKAGES: dict[str, str] = {
    "etcd": "./etcd",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
}
BINARY_NAMES = tuple(_PACKAGES)

# The module folder that stands for the chosen Kubernetes version's (KubernetesVersion.module).
KUBERNETES_MODULE = "kubernetes"
# Node binaries: Go package and the module folder (under gomod/) that pins it.
_NODE_PACKAGES: dict[str, tuple[str, str]] = {
    "kubelet": ("k8s.io/kubernetes/cmd/kubelet", KUBERNETES_MODULE),
    "containerd": ("github.com/containerd/containerd/v2/cmd/containerd", "containerd"),
    "containerd-shim-runc-v2": (
        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
        "containerd",
    ),
    "ctr": ("github.com/containerd/containerd/v2/cmd/ctr", "containerd"),
}
NODE_BINARY_NAMES = tuple(_NODE_PACKAGES)
_MODULE_FILES = {
    KUBERNETES_MODULE: ("go.mod", "go.sum", "tools.go", "etcd/main.go"),
    "containerd": ("go.mod", "go.sum", "tools.go"),
    "helm": ("go.mod", "go.sum", "tools.go"),
}
_VERSION_LDFLAGS = {
    "containerd": f"-X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION}",
    "helm": f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION} "
    "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
}


def kubernetes_ldflags(kubernetes: KubernetesVersion) -> str:
    """What a plain `go build` leaves as "v0.0.0-master+$Format:%H$"; Kubernetes' own build sets
    these (``--version``, the Node's ``kubeletVersion``, discovery's ``/version``)."""
    return " ".join(
        f"-X k8s.io/component-base/version.{k}={v}"
        for k, v in (
            ("gitVersion", kubernetes.version),
            ("gitMajor", kubernetes.git_major),
            ("gitMinor", kubernetes.git_minor),
            ("gitTreeState", "clean"),
        )
    )


# containerd's build tags for a static binary without the snapshotters that need cgo or kernel headers.
_BUILD_TAGS = {"containerd": "no_btrfs no_devmapper no_zfs urfave_cli_no_docs"}
# What a real node takes from Debian rather than from a Go build.
_NODE_PACKAGES_DEBIAN = (prerequisites.RUNC, prerequisites.CNI_PLUGINS)


class BinariesUnavailable(RuntimeError):
    """Neither prebuilt binaries nor a working Go build are available."""


class BinaryVersionMismatch(BinariesUnavailable):
    """A binary from an asset directory is not of the release it stands in for."""


def _check(
    path: Path, *, expected: str, release: str, source: str, minor_only: bool = False, hint: str = ""
) -> None:
    problem = mismatch(
        path, expected=expected, release=release, source=source, minor_only=minor_only, hint=hint
    )
    if problem is not None:
        raise BinaryVersionMismatch(problem)


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


def cache_root() -> Path:
    """The per-user directory under which everything built is cached (``DRA_CONTROL_PLANE_CACHE``,
    else ``$XDG_CACHE_HOME``, else ``~/.cache``, then ``accel-dra``)."""
    override = os.environ.get(CACHE_ENV)
    base = Path(override) if override else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "accel-dra"


def cache_dir(kubernetes: KubernetesVersion | None = None) -> Path:
    """The per-user, per-version directory that holds built control-plane binaries."""
    k = kubernetes or resolve()
    return cache_root() / "control-plane" / f"kubernetes-{k.version}-etcd-{k.etcd}"


def _usable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _from_asset_dirs(kubernetes: KubernetesVersion) -> dict[str, Path]:
    """The control-plane binaries the asset directories hold, each checked to be of ``kubernetes``."""
    found: dict[str, Path] = {}
    for env in (ASSETS_ENV, ENVTEST_ASSETS_ENV):
        directory = os.environ.get(env)
        if not directory:
            continue
        for name in BINARY_NAMES:
            candidate = Path(directory) / name
            if name not in found and _usable(candidate):
                _check_kubernetes_binary(candidate, kubernetes=kubernetes, source=env)
                found[name] = candidate
    return found


def _check_kubernetes_binary(path: Path, *, kubernetes: KubernetesVersion, source: str) -> None:
    hint = f", or choose their release with ${VERSION_ENV}"
    if path.name == "etcd":
        release = f"the etcd of Kubernetes {kubernetes.version}"
        _check(path, expected=kubernetes.etcd, release=release, source=source, minor_only=True, hint=hint)
    else:
        release = f"Kubernetes {kubernetes.version} was chosen"
        _check(path, expected=kubernetes.version, release=release, source=source, hint=hint)


def _unavailable_message(kubernetes: KubernetesVersion) -> Callable[[list[str], str], str]:
    def message(missing: list[str], reason: str) -> str:
        return (
            f"cannot provide control-plane binaries {', '.join(missing)}: {reason}. Either install a Go "
            f"toolchain (go 1.26+) that reaches the Go module proxy, so they are built once into "
            f"{cache_dir(kubernetes)}, or point {ASSETS_ENV} (or {ENVTEST_ASSETS_ENV}, as for envtest) at a "
            f"directory holding {', '.join(BINARY_NAMES)} for Kubernetes {kubernetes.version}."
        )

    return message


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


def build(names: list[str], *, into: Path, kubernetes: KubernetesVersion | None = None) -> None:
    """Build control-plane binaries ``names`` from the version's pinned Go module into ``into``
    (blocking; minutes when cold)."""
    k = kubernetes or resolve()
    log.info(
        "building %s (Kubernetes %s, etcd %s); cold builds take many minutes",
        ", ".join(names),
        k.version,
        k.etcd,
    )
    _go_build(
        {n: _PACKAGES[n] for n in names},
        module=KUBERNETES_MODULE,
        into=into,
        unavailable=_unavailable_message(k),
        kubernetes=k,
    )


def module_source(module: str, *, kubernetes: KubernetesVersion | None = None) -> Traversable:
    """The folder of ``gomod/`` that holds the module ``module`` ("kubernetes": the folder of the
    Kubernetes version, default :func:`resolve`'s)."""
    folder = (kubernetes or resolve()).module if module == KUBERNETES_MODULE else module
    return resources.files("dra_devcluster") / "gomod" / folder


def module_files(module: str) -> tuple[str, ...]:
    """The files a build copies from the module folder (relative paths)."""
    return _MODULE_FILES[module]


def _go_build(
    packages: dict[str, str],
    *,
    module: str,
    into: Path,
    unavailable: Callable[[list[str], str], str],
    kubernetes: KubernetesVersion | None = None,
) -> None:
    """``go build`` the binary -> package map from the module folder ``module`` of ``gomod/``."""
    names = list(packages)
    go = shutil.which("go")
    if go is None:
        raise BinariesUnavailable(unavailable(names, "no `go` on PATH"))
    into.mkdir(parents=True, exist_ok=True)
    source = module_source(module, kubernetes=kubernetes)
    if module == KUBERNETES_MODULE:
        ldflags = kubernetes_ldflags(kubernetes or resolve())
    else:
        ldflags = _VERSION_LDFLAGS[module]
    with tempfile.TemporaryDirectory(prefix="accel-dra-gobuild-") as tmp:
        workdir = Path(tmp)
        for rel in module_files(module):
            (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
            (workdir / rel).write_bytes((source / rel).read_bytes())
        staging = into / ".staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        command = [go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(staging)]
        if module in _BUILD_TAGS:
            command += ["-tags", _BUILD_TAGS[module]]
        command += list(packages.values())
        started = time.monotonic()
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly")
        result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-20:])
            raise BinariesUnavailable(unavailable(names, f"`go build` failed:\n{tail}"))
        # Rename one by one so a reader never sees a half-written binary.
        for name in names:
            os.replace(staging / name, into / name)
        staging.rmdir()
        log.info("built %s in %.0f s", ", ".join(names), time.monotonic() - started)


def ensure_binaries(*, allow_build: bool = True, kubernetes: KubernetesVersion | None = None) -> Binaries:
    """Return paths to all five binaries of the Kubernetes version (default: :func:`resolve`'s),
    building the missing ones when allowed."""
    k = kubernetes or resolve()
    found = _from_asset_dirs(k)
    bin_dir = cache_dir(k) / "bin"
    for name in BINARY_NAMES:
        if name not in found and _usable(bin_dir / name):
            found[name] = bin_dir / name
    missing = [n for n in BINARY_NAMES if n not in found]
    if missing:
        if not allow_build:
            raise BinariesUnavailable(_unavailable_message(k)(missing, "building was not allowed"))
        with _build_lock(cache_dir(k)):
            still_missing = [n for n in missing if not _usable(bin_dir / n)]
            if still_missing:
                build(still_missing, into=bin_dir, kubernetes=k)
        for name in missing:
            found[name] = bin_dir / name
    return Binaries.from_mapping(found)


class NodeUnavailable(BinariesUnavailable):
    """A real node cannot be run here: a binary or a Debian package it needs is missing."""


@dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    containerd: Path
    containerd_shim_runc_v2: Path
    ctr: Path
    runc: Path
    cni_dir: Path


def node_cache_dir(kubernetes: KubernetesVersion | None = None) -> Path:
    """The per-user, per-version directory that holds the built node binaries."""
    k = kubernetes or resolve()
    return cache_root() / "node" / f"kubernetes-{k.version}-containerd-{CONTAINERD_VERSION}"


def _node_unavailable_message(kubernetes: KubernetesVersion) -> Callable[[list[str], str], str]:
    def message(missing: list[str], reason: str) -> str:
        return (
            f"cannot provide node binaries {', '.join(missing)}: {reason}. Install a Go toolchain "
            f"(go 1.26+) that reaches the Go module proxy, so they are built once into "
            f"{node_cache_dir(kubernetes)}, or put kubelet {kubernetes.version}, containerd "
            f"{CONTAINERD_VERSION}, containerd-shim-runc-v2 and ctr in {ASSETS_ENV}."
        )

    return message


def ensure_node_binaries(
    *, allow_build: bool = True, kubernetes: KubernetesVersion | None = None
) -> NodeBinaries:
    """Paths to what a real node runs (the kubelet of the Kubernetes version, default
    :func:`resolve`'s), building the Go binaries that are missing when allowed; runc and the CNI
    plugins must be installed from Debian's packages."""
    k = kubernetes or resolve()
    runc, cni_bridge = (prerequisites.locate(p) for p in _NODE_PACKAGES_DEBIAN)
    if runc is None or cni_bridge is None:
        absent = [p.name for p in _NODE_PACKAGES_DEBIAN if prerequisites.locate(p) is None]
        install = prerequisites.install_command(absent)
        raise NodeUnavailable(f"a real node needs the Debian packages {' '.join(absent)}: {install}")
    cni_dir = Path(cni_bridge).parent
    found: dict[str, Path] = {}
    assets = os.environ.get(ASSETS_ENV)
    bin_dir = node_cache_dir(k) / "bin"
    for name in NODE_BINARY_NAMES:
        if assets and _usable(candidate := Path(assets) / name):
            if name == "kubelet":
                _check_kubernetes_binary(candidate, kubernetes=k, source=ASSETS_ENV)
            else:
                _check(
                    candidate, expected=CONTAINERD_VERSION, release="the pinned containerd", source=ASSETS_ENV
                )
            found[name] = candidate
        elif _usable(bin_dir / name):
            found[name] = bin_dir / name
    missing = [n for n in NODE_BINARY_NAMES if n not in found]
    if missing:
        if not allow_build:
            raise NodeUnavailable(_node_unavailable_message(k)(missing, "building was not allowed"))
        with _build_lock(node_cache_dir(k)):
            still_missing = [n for n in missing if not _usable(bin_dir / n)]
            for module in dict.fromkeys(_NODE_PACKAGES[n][1] for n in still_missing):
                names = [n for n in still_missing if _NODE_PACKAGES[n][1] == module]
                log.info(
                    "building %s (Kubernetes %s, containerd %s); a cold build takes minutes",
                    ", ".join(names),
                    k.version,
                    CONTAINERD_VERSION,
                )
                _go_build(
                    {n: _NODE_PACKAGES[n][0] for n in names},
                    module=module,
                    into=bin_dir,
                    unavailable=_node_unavailable_message(k),
                    kubernetes=k,
                )
        for name in missing:
            found[name] = bin_dir / name
    return NodeBinaries(
        kubelet=found["kubelet"],
        containerd=found["containerd"],
        containerd_shim_runc_v2=found["containerd-shim-runc-v2"],
        ctr=found["ctr"],
        runc=Path(runc),
        cni_dir=cni_dir,
    )


HELM_PACKAGE = "helm.sh/helm/v3/cmd/helm"


def helm_cache_dir() -> Path:
    """The per-user, per-version directory that holds the built helm."""
    return cache_root() / "helm" / f"helm-{HELM_VERSION}"


def _helm_unavailable_message(missing: list[str], reason: str) -> str:
    return (
        f"cannot provide helm {HELM_VERSION}: {reason}. Install a Go toolchain (go 1.26+) that reaches "
        f"the Go module proxy, so it is built once into {helm_cache_dir()} (`dra-local-cluster build` "
        f"does it), or put a helm {HELM_VERSION} binary in {ASSETS_ENV}."
    )


def ensure_helm(*, allow_build: bool = True) -> Path:
    """Path to helm at the pinned version: from ``DRA_CONTROL_PLANE_ASSETS``, the cache, or built from
    ``gomod/helm/`` into the cache (about two minutes cold)."""
    assets = os.environ.get(ASSETS_ENV)
    bin_dir = helm_cache_dir() / "bin"
    if assets and _usable(candidate := Path(assets) / "helm"):
        _check(candidate, expected=HELM_VERSION, release="the pinned helm", source=ASSETS_ENV)
        return candidate
    if _usable(bin_dir / "helm"):
        return bin_dir / "helm"
    if not allow_build:
        raise BinariesUnavailable(_helm_unavailable_message(["helm"], "building was not allowed"))
    with _build_lock(helm_cache_dir()):
        if not _usable(bin_dir / "helm"):
            log.info("building helm %s; a cold build takes about two minutes", HELM_VERSION)
            _go_build(
                {"helm": HELM_PACKAGE},
                module="helm",
                into=bin_dir,
                unavailable=_helm_unavailable_message,
            )
    return bin_dir / "helm"
