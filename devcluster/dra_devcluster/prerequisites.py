"""What the machine must have before anything is built, checked in one place.

``make demo``, ``make test``, ``make image`` and ``.ci/run`` run this file first, as a plain script
with the machine's python3, before the venv exists; so it imports nothing from the project and
nothing outside the standard library, and it parses on old Pythons, to be able to say they are too
old. devcluster's own checks at run time (runc and the CNI plugins for a real node, busybox for the
local images) take their package names and paths from the same table::

    python3 devcluster/dra_devcluster/prerequisites.py demo|test|image [--no-install] [--list]

In this order, the first unmet one is one line on stderr and exit status 1: Python 3.11+; Go at
least the version the Go modules' ``go`` directive names (demo, test); root; free disk for the
first build (demo, test); the Debian packages. Missing packages are installed with apt-get when
running as root on a machine that has it (unless ``--no-install``); otherwise the line names them
and the command that installs them.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PURPOSES = ("demo", "test", "image")
MIN_PYTHON = (3, 11)
# Every Go module the local cluster builds from: one per Kubernetes version, containerd, helm.
GO_MODS = tuple(sorted((Path(__file__).resolve().parent / "gomod").glob("*/go.mod")))
# A cold first build: control-plane and node binaries 0.7 GiB, Go's module cache 1.1 GiB and its
# build cache 3.6 GiB (measured; bench/RESULTS.md: "5.5 GiB of disk with Go's caches").
FIRST_BUILD_GIB = 5.5
# What builds from Go modules (control plane, nodes, bench's Go programs); the image holds no Go.
_BUILDS_GO = ("demo", "test")
_NEEDS_ROOT = {
    "demo": "real nodes run containerd and a kubelet, which need root",
    "test": "the tests run real nodes (containerd and a kubelet), which need root",
    "image": "mmdebstrap builds the image's Debian base in a chroot, which needs root",
}


class Unmet(Exception):
    """A prerequisite is missing; the message is the whole line the user sees."""


@dataclass(frozen=True)
class Package:
    """A Debian package, what shows that it is installed, and the commands that need it.

    ``proofs``, tried in order, any one suffices: an absolute path is an executable file, anything
    else a command on PATH; ``modules``: a Python module this interpreter can import.
    """

    name: str
    purposes: frozenset[str]
    proofs: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()


_ALL = frozenset(PURPOSES)
_NODES = frozenset({"demo", "test"})

# THE list: make, .ci/run and devcluster's run-time checks all read it.
MAKE = Package("make", _ALL, proofs=("make",))
# Debian's python3 leaves ensurepip out unless python3-venv is installed; `python3 -m venv` needs it.
PYTHON_VENV = Package("python3-venv", _ALL, modules=("ensurepip",))
# Real nodes: kubelet and containerd are built from Go modules, their runtime and network are not.
# Debian's crun refuses hybrid cgroups, hence runc.
RUNC = Package("runc", _NODES, proofs=("runc", "/usr/sbin/runc"))
CNI_PLUGINS = Package(
    "containernetworking-plugins", _NODES, proofs=("/usr/lib/cni/bridge", "/opt/cni/bin/bridge")
)
# The local container images (no registry is reachable) are a static busybox and links to it.
BUSYBOX = Package("busybox-static", _NODES, proofs=("/bin/busybox", "/usr/bin/busybox", "busybox"))
# The health tests scrape with a real Prometheus and check the rules with promtool.
PROMETHEUS = Package("prometheus", frozenset({"test"}), proofs=("promtool",))
# The product image's Debian base; the deploy tests build the image too.
MMDEBSTRAP = Package("mmdebstrap", frozenset({"image", "test"}), proofs=("mmdebstrap",))
PACKAGES = (MAKE, PYTHON_VENV, RUNC, CNI_PLUGINS, BUSYBOX, PROMETHEUS, MMDEBSTRAP)


def locate(package: Package, *, path: str | None = None) -> str | None:
    """The first proof that ``package`` is installed (a file, a command's path, a module), or None.
    ``path`` stands for PATH."""
    for proof in package.proofs:
        if proof.startswith("/"):
            if os.path.isfile(proof) and os.access(proof, os.X_OK):
                return proof
        else:
            found = shutil.which(proof, path=path)
            if found is not None:
                return found
    for module in package.modules:
        if importlib.util.find_spec(module) is not None:
            return module
    return None


def install_command(names: Sequence[str]) -> str:
    return f"apt-get install {' '.join(names)}"


def missing_line(names: Sequence[str]) -> str:
    return f"missing Debian packages: {' '.join(names)}; install them with: {install_command(names)}"


def check_python(version: Sequence[int]) -> None:
    if tuple(version[:2]) < MIN_PYTHON:
        found = ".".join(str(part) for part in version[:3])
        raise Unmet(
            f"Python {found} is too old: the project needs Python 3.11 or newer "
            "(point make at one with PYTHON=python3.11)"
        )


def parse_go_version(text: str) -> tuple[int, int, int] | None:
    """``go1.26.8`` (``go env GOVERSION``, ``devel go1.27-...``) or ``go 1.26`` (a go.mod's directive)."""
    match = re.search(r"\bgo ?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def go_directive(go_mod: str) -> tuple[int, int, int]:
    """The ``go`` directive of a go.mod: the oldest Go that builds the module."""
    match = re.search(r"^go\s+\S+", go_mod, re.MULTILINE)
    version = parse_go_version(match.group(0)) if match else None
    if version is None:
        raise ValueError("go.mod has no go directive")
    return version


def go_needed(go_mods: Sequence[Path] = GO_MODS) -> tuple[int, int, int]:
    """The newest ``go`` directive among ``go_mods``: a Go that builds every version's binaries."""
    return max(go_directive(path.read_text()) for path in go_mods)


def _dotted(version: Sequence[int]) -> str:
    return ".".join(str(part) for part in version)


def check_go(*, needed: tuple[int, int, int], found: str | None) -> None:
    """``found``: what ``go env GOVERSION`` printed, None without a ``go`` on PATH."""
    install = f"install Go {_dotted(needed)} or newer"
    if found is None:
        raise Unmet(f"no `go` on PATH: the control plane and the nodes are built from Go modules; {install}")
    version = parse_go_version(found)
    if version is None:
        raise Unmet(f"cannot tell the version of `go` ({_last_line(found)!r}); {install}")
    if version < needed:
        raise Unmet(
            f"Go {_dotted(version)} is too old: the project's Go modules need go {_dotted(needed)}; {install}"
        )


def go_version() -> str | None:
    go = shutil.which("go")
    if go is None:
        return None
    # GOTOOLCHAIN=local and cwd=/: this toolchain's own version, never one Go would fetch for a go.mod.
    result = subprocess.run(
        [go, "env", "GOVERSION"],
        capture_output=True,
        text=True,
        cwd="/",
        env={**os.environ, "GOTOOLCHAIN": "local"},
        check=False,
    )
    return result.stdout.strip() or result.stderr.strip()


def check_root(purpose: str, *, euid: int) -> None:
    if euid != 0:
        raise Unmet(f"{_NEEDS_ROOT[purpose]}; run it as root")


def cache_base(environ: Mapping[str, str]) -> Path:
    """Where devcluster caches its binaries and Go its build cache (by default)."""
    base = environ.get("DRA_CONTROL_PLANE_CACHE") or environ.get("XDG_CACHE_HOME")
    return Path(base) if base else Path.home() / ".cache"


def _already_built(base: Path) -> bool:
    # Any version will do: a machine that built once has Go's caches too, and needs far less again.
    root = base / "accel-dra"
    return any(root.glob("control-plane/*/bin/kube-apiserver")) and any(root.glob("node/*/bin/kubelet"))


def check_disk(*, base: Path, free_bytes: Callable[[Path], int] | None = None) -> None:
    if _already_built(base):
        return
    existing = base
    while not existing.exists():
        existing = existing.parent
    free = (free_bytes or (lambda p: shutil.disk_usage(p).free))(existing)
    if free < FIRST_BUILD_GIB * 2**30:
        raise Unmet(
            f"only {free / 2**30:.1f} GiB free at {existing}: the first build needs about {FIRST_BUILD_GIB} "
            "GiB (binaries and Go's caches); free some, or set XDG_CACHE_HOME to a roomier disk"
        )


def _last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E:")]
    return (errors or lines or ["(no output)"])[-1]


def apt_install(apt_get: str, names: Sequence[str]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # A new machine may still be running its first unattended upgrade: wait for dpkg's lock.
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    for argv in (
        [apt_get, *lock, "update", "-qq"],
        [apt_get, *lock, "install", "-y", "-qq", "--no-install-recommends", *names],
    ):
        result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if result.returncode != 0:
            step, last = argv[len(lock) + 1], _last_line(result.stderr + result.stdout)
            raise Unmet(f"apt-get {step} failed (exit {result.returncode}): {last}")


def ensure_packages(
    purpose: str,
    *,
    install: bool,
    is_root: bool,
    apt_get: str | None,
    packages: Sequence[Package] = PACKAGES,
    find: Callable[[Package], str | None] = locate,
    apt: Callable[[str, Sequence[str]], None] = apt_install,
) -> list[str]:
    """The names of the packages it installed; Unmet when some are missing and cannot be installed."""
    missing = [p for p in packages if purpose in p.purposes and find(p) is None]
    names = [p.name for p in missing]
    if not missing:
        return []
    if not (install and is_root and apt_get):
        raise Unmet(missing_line(names))
    print(f"installing the missing Debian packages: {' '.join(names)}", file=sys.stderr, flush=True)
    apt(apt_get, names)
    still = [p for p in missing if find(p) is None]
    if still:
        raise Unmet(f"apt-get installed them, but this still finds no {'; no '.join(map(_proofs, still))}")
    return names


def _proofs(package: Package) -> str:
    modules = (f"module {m} for {sys.executable}" for m in package.modules)
    return f"{' or '.join((*package.proofs, *modules))} ({package.name})"


def check(purpose: str, *, install: bool) -> None:
    check_python(sys.version_info[:3])
    if purpose in _BUILDS_GO:
        check_go(needed=go_needed(), found=go_version())
    euid = os.geteuid()
    check_root(purpose, euid=euid)
    if purpose in _BUILDS_GO:
        check_disk(base=cache_base(os.environ))
    ensure_packages(purpose, install=install, is_root=euid == 0, apt_get=shutil.which("apt-get"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="prerequisites.py",
        description="Check (and as root, install) what `make PURPOSE` needs, before any build.",
    )
    parser.add_argument("purpose", choices=PURPOSES)
    parser.add_argument("--no-install", action="store_true", help="only check; name what is missing")
    parser.add_argument("--list", action="store_true", help="print the purpose's Debian packages and stop")
    args = parser.parse_args(argv)
    if args.list:
        print(" ".join(p.name for p in PACKAGES if args.purpose in p.purposes))
        return 0
    try:
        check(args.purpose, install=not args.no_install)
    except Unmet as err:
        print(f"make {args.purpose}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
