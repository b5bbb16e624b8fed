"""Building the benchmarks' Go programs (``bench/go_allocator``, ``bench/go_writer``) once per
version of their sources, into a per-user cache."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def _sources(source: Path) -> list[Path]:
    return sorted([source / "go.mod", source / "go.sum", *source.glob("*.go")])


def binary_dir(source: Path) -> Path:
    """Where a program's binary is kept: per user, per version of its sources."""
    digest = hashlib.sha256()
    for path in _sources(source):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "accel-dra" / "bench" / f"{source.name}-{digest.hexdigest()[:12]}"


def build(name: str, *, into: Path | None = None) -> tuple[Path, float]:
    """``go build`` the program ``bench/<name>`` into ``into`` (default: its cache folder); returns
    the binary and the seconds the build took (seconds when the Go build cache already holds the
    Kubernetes packages, as after the control-plane build, which uses the same flags; about a
    minute with an empty one)."""
    source = BENCH / name
    out = (into or binary_dir(source)) / name
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(f"no `go` on PATH: bench/{name} needs a Go toolchain (go 1.26+)")
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly")
    started = time.monotonic()
    result = subprocess.run(
        [go, "build", "-trimpath", "-buildvcs=false", "-o", str(out), "."],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"go build of bench/{name} failed:\n{result.stderr.strip()}")
    return out, time.monotonic() - started
