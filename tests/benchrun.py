"""Running a benchmark of ``bench/`` as its users do, for the smoke tests: ``python -m bench.<name>``
from the repository root, in a process of its own (a benchmark may tune the collector, trace memory
or leave caches behind, none of which may reach the test process)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A number as the benchmarks print them: 12, 0.25, 1,234 (thousands separated).
NUMBER = r"(\d[\d,]*(?:\.\d+)?)"


def run_bench(name: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    """Run ``bench.<name>`` with ``args``; its stdout. Fails the test, with what it printed, when it
    exits with anything but 0."""
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, (
        f"bench.{name} {' '.join(args)} exited with {proc.returncode}\n"
        f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


def number(text: str) -> float:
    return float(text.replace(",", ""))


def find(pattern: str, text: str) -> re.Match[str]:
    """The first match of ``pattern`` (a regular expression, one line at a time) in ``text``."""
    found = re.search(pattern, text, re.MULTILINE)
    assert found is not None, f"no line matches {pattern!r} in:\n{text}"
    return found
