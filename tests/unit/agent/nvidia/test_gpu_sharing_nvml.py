"""Time-slicing on the hardware path: NVML for the compute mode, the driver root's nvidia-smi for the
time slice. NVML is faked at the pynvml boundary; nvidia-smi is a script in a fake driver root that
records how it was called (arguments and library path), as the real tool would be called."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from dra_node_agent import prepare_tools
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.nvidia.gpu_sharing import SharingError
from dra_node_agent.simulated.fakehw import FakeNvml
from tests.unit.agent.nvidia.test_discovery_nvml import h100

RECORDER = """#!/bin/sh
echo "$LD_LIBRARY_PATH|$*" >> "$(dirname "$0")/calls"
"""


def driver_root(tmp_path: Path, tool: str | None = RECORDER) -> Path:
    root = tmp_path / "driver-root"
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").write_bytes(b"")
    if tool is not None:
        path = root / "usr/bin/nvidia-smi"
        path.parent.mkdir(parents=True)
        path.write_text(tool)
        path.chmod(0o755)
    return root


async def test_a_time_slice_sets_compute_mode_through_nvml_then_runs_nvidia_smi(tmp_path: Path) -> None:
    gpus = [h100(0, "0000:3b:00.0"), h100(1, "0000:5e:00.0")]
    gpus[1].compute_mode = pynvml.NVML_COMPUTEMODE_PROHIBITED
    nvml = FakeNvml(gpus=gpus)
    root = driver_root(tmp_path)
    sharing = prepare_tools.gpu_sharing(NvmlBackend(nvml=nvml, driver_root=root))

    await sharing.set_time_slice([gpus[0].uuid, gpus[1].uuid], "Medium")
    assert [g.compute_mode for g in gpus] == [pynvml.NVML_COMPUTEMODE_DEFAULT] * 2
    assert nvml.init_count == nvml.shutdown_count == 1
    await sharing.reset_time_slice([gpus[1].uuid])
    library_dir = (root / "usr/lib/x86_64-linux-gnu").resolve()
    assert (root / "usr/bin/calls").read_text().splitlines() == [
        f"{library_dir}|compute-policy -i {gpus[0].uuid},{gpus[1].uuid} --set-timeslice 2",
        f"{library_dir}|compute-policy -i {gpus[1].uuid} --set-timeslice 0",
    ]


async def test_nvml_refusing_the_compute_mode_is_a_sharing_error_and_nvidia_smi_is_not_run(
    tmp_path: Path,
) -> None:
    gpu = h100(0, "0000:3b:00.0", failures={"nvmlDeviceSetComputeMode": pynvml.NVML_ERROR_NO_PERMISSION})
    root = driver_root(tmp_path)
    sharing = prepare_tools.gpu_sharing(NvmlBackend(nvml=FakeNvml(gpus=[gpu]), driver_root=root))
    with pytest.raises(SharingError, match=f"setting compute mode DEFAULT on {gpu.uuid} through NVML failed"):
        await sharing.set_time_slice([gpu.uuid], "Long")
    assert not (root / "usr/bin/calls").exists()


async def test_a_driver_root_without_nvidia_smi_is_named(tmp_path: Path) -> None:
    gpu = h100(0, "0000:3b:00.0")
    root = driver_root(tmp_path, tool=None)
    sharing = prepare_tools.gpu_sharing(NvmlBackend(nvml=FakeNvml(gpus=[gpu]), driver_root=root))
    with pytest.raises(SharingError, match=f"the driver root {root} has none"):
        await sharing.set_time_slice([gpu.uuid], "Short")
