"""Running an installed console script on bad input: what its error must look like.

Shared by the ``test_cli_errors`` modules of the operator, the node agent and the local cluster.
The scripts run as the user runs them (``.venv/bin/<script>``, a process of their own) with an
environment that names no cluster, so only what a test passes can reach one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import yaml

# A safety net against a hung script, not a measurement: no test asserts how long anything took.
SCRIPT_TIMEOUT_S = 120

# Variables that would point a script at a real cluster or change its settings.
_UNSET_PREFIXES = ("DRA_OPERATOR_", "DRA_AGENT_", "KUBERNETES_SERVICE_", "DRA_CONTROL_PLANE_")
_UNSET = ("KUBECONFIG", "NODE_NAME", "POD_UID", "KUBEBUILDER_ASSETS", "TPU_ENV_FILE")


def console_script(name: str) -> str:
    script = Path(sys.executable).parent / name
    assert script.exists(), f"console script {name} not installed next to {sys.executable}"
    return str(script)


def clean_env(*, home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without a cluster in it, and ``home`` as HOME (no ~/.kube)."""
    env = {k: v for k, v in os.environ.items() if k not in _UNSET and not k.startswith(_UNSET_PREFIXES)}
    env["HOME"] = str(home)
    env.update(extra or {})
    return env


def run_script(
    name: str, *args: str, home: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [console_script(name), *args],
        capture_output=True,
        text=True,
        env=clean_env(home=home, extra=env),
        cwd=home,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str], *names: str) -> str:
    """Assert a failed run with exactly one non-empty stderr line, naming each of ``names``, and
    no traceback anywhere; return that line."""
    output = f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode != 0, output
    assert "Traceback" not in result.stdout + result.stderr, output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, output
    for name in names:
        assert name in lines[0], output
    return lines[0]


@contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound, so nothing else takes it, but not
    listening, so every connection is reset at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@contextmanager
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections (the kernel completes them from the backlog) and
    never answers on them: a request to it can only time out."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def write_kubeconfig(path: Path, *, server: str) -> Path:
    """A kubeconfig whose current context is ``server`` with a token (nothing to verify locally)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(config))
    return path
