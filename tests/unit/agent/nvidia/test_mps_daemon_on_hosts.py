"""A claim's MPS daemon on hosts as an H200 machine had them: a driver whose
``/usr/bin/nvidia-cuda-mps-control`` is a wrapper script running the real tool from elsewhere, a pipe
folder too long for the daemon's unix sockets (it exits 1 and prints nothing), and errors the daemon
only writes to its control log."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dra_node_agent.nvidia.mps import MpsDaemons, MpsError, MpsLimits
from dra_node_agent.simulated.host_tools import install_simulated_mps_control
from tests import mps_cgroup

CLAIM = "0f3c4b1e-7a52-4d1c-9e0b-5c2d8e6f7a10"
LIMITS = MpsLimits(uuids=("GPU-1",))
OPTIONS = mps_cgroup.options()


def control_tool(folder: Path, script: str) -> Path:
    tool = folder / "nvidia-cuda-mps-control"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    return tool


def test_a_pipe_folder_too_long_for_the_sockets_is_refused_before_anything_starts(tmp_path: Path) -> None:
    root = tmp_path / ("x" * 60)
    daemons = MpsDaemons(
        root=root, control=control_tool(tmp_path, "exit 1\n"), driver_root=Path("/"), env={}, options=OPTIONS
    )
    with pytest.raises(MpsError, match=r"too long a path .* choose a shorter --state-dir"):
        asyncio.run(daemons.start(CLAIM, LIMITS))
    assert not daemons.claim_dir(CLAIM).exists()


def test_a_daemon_that_exits_says_what_its_control_log_says(tmp_path: Path) -> None:
    short = Path("/tmp") / f"mpsu-{tmp_path.name[-8:]}"
    script = 'echo "[Control] Failed to start: no GPU" > "$CUDA_MPS_LOG_DIRECTORY/control.log"\nexit 1\n'
    tool = control_tool(tmp_path, script)
    # Without unshare's namespace the wrapper still runs the tool: only what it says matters here.
    daemons = MpsDaemons(root=short, control=tool, driver_root=Path("/"), env={}, options=OPTIONS)
    try:
        with pytest.raises(MpsError, match=r"status 1: .*control.log: \[Control\] Failed to start: no GPU"):
            asyncio.run(daemons.start(CLAIM, LIMITS))
        assert not daemons.claim_dir(CLAIM).exists()
    finally:
        mps_cgroup.clean_up(short)
        shutil.rmtree(short, ignore_errors=True)


def test_a_daemon_started_through_a_wrapper_script_is_found_running_and_stopped(tmp_path: Path) -> None:
    real = tmp_path / "driver" / "bin" / "nvidia-cuda-mps-control"
    install_simulated_mps_control(real)
    wrapper = tmp_path / "usr" / "bin" / "nvidia-cuda-mps-control"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    short = Path("/tmp") / f"mpsw-{tmp_path.name[-8:]}"
    try:

        async def scenario() -> tuple[bool, bool]:
            daemons = MpsDaemons(root=short, control=wrapper, driver_root=tmp_path, env={}, options=OPTIONS)
            await daemons.start(CLAIM, LIMITS)
            up = daemons.running(CLAIM)
            await daemons.stop(CLAIM)
            return up, daemons.running(CLAIM)

        up, after = asyncio.run(scenario())
        assert up  # its command line names the real tool's path, not the wrapper's
        assert not after
        assert not (short / CLAIM).exists()
    finally:
        mps_cgroup.clean_up(short)
        shutil.rmtree(short, ignore_errors=True)


def test_the_mps_module_imports_on_its_own() -> None:
    # It imports discovery, whose backends refer back to it: a fresh interpreter shows a cycle.
    run = subprocess.run(
        [sys.executable, "-c", "import dra_node_agent.nvidia.mps"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
