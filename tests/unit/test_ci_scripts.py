"""The CI scripts parse, and .ci/rehearse explains itself without running anything."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

CI = Path(__file__).resolve().parents[2] / ".ci"


@pytest.mark.parametrize("script", ["run", "rehearse"])
def test_bash_parses(script: str) -> None:
    subprocess.run(["bash", "-n", str(CI / script)], check=True, timeout=30)


def test_rehearse_help() -> None:
    result = subprocess.run(
        ["bash", str(CI / "rehearse"), "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Rehearse the README's commands and CI as a new machine sees them")
    for option in ("--ci-only", "--cold-go", "--remove-packages", "pytest-0"):
        assert option in result.stdout
    assert "set -euo" not in result.stdout


def test_rehearse_refuses_an_unknown_option() -> None:
    result = subprocess.run(
        ["bash", str(CI / "rehearse"), "--bogus"], capture_output=True, text=True, timeout=30, check=False
    )
    assert (result.returncode, result.stderr) == (2, "rehearse: unknown option --bogus (see --help)\n")
