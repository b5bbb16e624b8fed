"""Building the benchmarks' Go programs (``bench/go_allocator``, ``bench/go_writer``) once per
version of their sources and of the Go toolchain, into a per-user cache."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def _sources(source: Path) -> list[Path]:
    return sorted([source / "go.mod", source / "go.sum", *source.glob("*.go")])


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("no `go` on PATH: the programs under bench/ need a Go toolchain (go 1.26+)")
    return go


@functools.cache
def _go_version(go: str) -> str:
    result = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"`go env GOVERSION` failed: {result.stderr.strip()}")
    return result.stdout.strip()


def binary_dir(source: Path) -> Path:
    """Where a program's binary is kept: per user, per version of its sources and of Go."""
    digest = hashlib.sha256(_go_version(_go()).encode() + b"\0")
    for path in _sources(source):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "accel-dra" / "bench" / f"{source.name}-{digest.hexdigest()[:12]}"


def build(name: str, *, into: Path | None = None) -> tuple[Path, float]:
    """``go build`` the program ``bench/<name>`` into ``into``, or into its cache folder, where a
    binary built before from the same sources and Go is reused as it is; returns the binary and the
    seconds the build took (0 when reused; seconds when the Go build cache already holds the
    Kubernetes packages, as after the control-plane build, which uses the same flags; about a minute
    or two with an empty one)."""
    source = BENCH / name
    go = _go()
    out = (into or binary_dir(source)) / name
    if into is None and out.is_file():
        return out, 0.0
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built beside its final name and moved there whole: a concurrent run never sees half a binary.
    partial = out.with_name(f".{name}.{os.getpid()}.partial")
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly")
    started = time.monotonic()
    result = subprocess.run(
        [go, "build", "-trimpath", "-buildvcs=false", "-o", str(partial), "."],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"go build of bench/{name} failed:\n{result.stderr.strip()}")
    os.replace(partial, out)
    return out, time.monotonic() - started
