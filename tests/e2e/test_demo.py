"""The README's first command, end to end: `dra-local-cluster demo --exit` as a user runs it.

It starts its own control plane, the operator and three node agents as processes, applies the
examples and plays the kubelet; the test reads what it prints, as a user would.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Short, as a node's /var/lib/kubelet is: unix socket paths are limited to 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="demo-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_demo_allocates_prepares_and_shows_the_environment(workdir: Path) -> None:
    script = Path(sys.executable).parent / "dra-local-cluster"
    result = subprocess.run(
        [str(script), "demo", "--exit", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    output = result.stdout
    assert result.returncode == 0, f"demo failed:\n{output[-4000:]}\n{result.stderr[-4000:]}"

    # Every example's claim is allocated by kube-scheduler and reserved for its pod.
    claims = re.findall(r"^(dra-example-\S+)\s+(\S+)\s+allocated,reserved\s", output, re.MULTILINE)
    assert sorted(ns for ns, _ in claims) == [
        "dra-example-gke-gpu",
        "dra-example-single-gpu",
        "dra-example-tpu",
    ]
    # The kubelet's prepare returned CDI devices, and the containers would see them.
    assert "PREPARE ERROR" not in output
    assert re.search(r"env NVIDIA_VISIBLE_DEVICES=GPU-[0-9a-f-]+", output)
    assert "env TPU_ACCELERATOR_TYPE=v6e-8" in output
    assert re.search(r"env TPU_VISIBLE_CHIPS=0,1,2,3,4,5,6,7$", output, re.MULTILINE)
    assert re.search(r"env TPU_DEVICE_\d+_RESOURCE_CLAIM=[0-9a-f-]{36}", output)
    assert "export KUBECONFIG=" in output
    # Everything it started is gone again.
    leftovers = subprocess.run(
        ["pgrep", "-f", str(workdir)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert leftovers == []


def test_ctrl_c_stops_everything_the_demo_started(workdir: Path) -> None:
    script = Path(sys.executable).parent / "dra-local-cluster"
    with subprocess.Popen(
        [str(script), "demo", "--workdir", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as demo:
        assert demo.stdout is not None
        seen: list[str] = []
        for line in demo.stdout:
            seen.append(line)
            if "Press Ctrl-C" in line:
                break
        running = subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True, text=True, check=False)
        # Four control-plane components, the operator and three agents.
        assert len(running.stdout.split()) >= 8, "".join(seen[-20:])
        demo.send_signal(signal.SIGINT)
        # Stopping a running demo is how it is meant to end: a clean exit.
        assert demo.wait(timeout=90) == 0
    leftovers = subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True, text=True, check=False)
    assert leftovers.stdout.split() == []
