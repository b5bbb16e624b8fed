"""GPU time-slicing, applied at prepare and reset at unprepare, as NVIDIA's driver does it.

A ``GpuConfig`` with ``sharing.strategy: TimeSlicing`` sets each of the claim's GPUs to compute mode
DEFAULT (through NVML, which has a setter for it) and its time slice to the interval asked for
(``nvidia-smi compute-policy --set-timeslice``: NVML has no public setter for it, so the driver's
tool under the driver root does it, as NVIDIA's plugin does). When the last claim holding a GPU with
a time slice is unprepared, the slice goes back to Default, as NVIDIA's driver does since it stopped
leaving the setting behind (it crashed some GPUs). The compute mode stays DEFAULT: that is what the
GPU had unless an administrator changed it, and shared use needs it.

On a simulated node the same code runs against the fake NVML and the host's ``nvidia-smi`` stand-in
(``simulated.host_tools``), which keeps each GPU's time slice in the simulated hardware's state folder,
where the fake NVML keeps its compute mode (``simulated.fakehw.COMPUTE_MODE_FILE``, ``TIME_SLICE_FILE``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import pynvml

from dra_node_agent.device_setup import DeviceSetupError

logger = logging.getLogger(__name__)

# timeSlicingConfig.interval -> the value of nvidia-smi compute-policy --set-timeslice.
TIME_SLICE_VALUES: Final = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
NVIDIA_SMI_TIMEOUT_SECONDS: Final = 30.0


class SharingError(DeviceSetupError):
    """A sharing setting the GPU did not take; the message says which GPU and why."""


class ComputeModes(Protocol):
    """Sets GPUs' compute mode (``NvmlComputeModes``); blocking."""

    def set_compute_mode(self, uuids: Sequence[str], mode: int) -> None: ...


class NvmlSessions(Protocol):
    """Opens NVML sessions with the GPUs attached (``NvmlBackend.open_nvml``); blocking."""

    def open_nvml(self) -> Any: ...


class NvmlComputeModes:
    """Sets compute modes through NVML, on the driver that discovery found."""

    def __init__(self, nvml: NvmlSessions) -> None:
        self._nvml = nvml

    def set_compute_mode(self, uuids: Sequence[str], mode: int) -> None:
        """Set the compute mode of each GPU (blocking: NVML init, set, shutdown).

        Raises ``pynvml.NVMLError`` (or OSError for a broken library) naming nothing; the caller
        says which GPU and why.
        """
        nvml = self._nvml.open_nvml()  # setting needs the GPUs attached, unlike discovery
        try:
            for uuid in uuids:
                nvml.nvmlDeviceSetComputeMode(nvml.nvmlDeviceGetHandleByUUID(uuid), mode)
        finally:
            try:
                nvml.nvmlShutdown()
            except pynvml.NVMLError as err:
                logger.warning("NVML shutdown failed: %s", err)


class GpuSharing:
    """Applies and resets time-slicing on whole GPUs. ``nvidia_smi`` None: the driver root has no
    nvidia-smi, so a time slice cannot be set (the prepare that asks for one fails and says so)."""

    def __init__(
        self,
        *,
        compute_modes: ComputeModes,
        nvidia_smi: Path | None,
        driver_root: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._compute_modes = compute_modes
        self._nvidia_smi = nvidia_smi
        self._driver_root = driver_root
        # Added to the agent's environment for nvidia-smi (the driver root's library path).
        self._env = dict(env or {})

    async def set_time_slice(self, uuids: Sequence[str], interval: str) -> None:
        value = TIME_SLICE_VALUES[interval]
        try:
            await asyncio.to_thread(
                self._compute_modes.set_compute_mode, uuids, pynvml.NVML_COMPUTEMODE_DEFAULT
            )
        except (pynvml.NVMLError, OSError) as exc:
            raise SharingError(
                f"setting compute mode DEFAULT on {', '.join(uuids)} through NVML failed: {exc}"
            ) from exc
        await self._nvidia_smi_run("compute-policy", "-i", ",".join(uuids), "--set-timeslice", str(value))
        logger.info("time slice %s (%d) set on %s", interval, value, ", ".join(uuids))

    async def reset_time_slice(self, uuids: Sequence[str]) -> None:
        await self._nvidia_smi_run("compute-policy", "-i", ",".join(uuids), "--set-timeslice", "0")
        logger.info("time slice reset to Default on %s", ", ".join(uuids))

    async def _nvidia_smi_run(self, *args: str) -> None:
        if self._nvidia_smi is None:
            raise SharingError(
                f"time-slicing needs nvidia-smi, and the driver root {self._driver_root} has none "
                "(set --driver-root to where the NVIDIA driver is installed)"
            )
        command = [str(self._nvidia_smi), *args]
        status, said = await run_tool(command, env=self._env, deadline=NVIDIA_SMI_TIMEOUT_SECONDS)
        if status != 0:
            raise SharingError(f"{' '.join(command)} failed (exit {status}): {said}")


async def run_tool(
    command: Sequence[str], *, env: Mapping[str, str], deadline: float, stdin: bytes | None = None
) -> tuple[int, str]:
    """Run one of the driver's tools: its exit status and the last lines it printed ("no output").
    ``env`` is added to the agent's environment; ``SharingError`` if it outlives ``deadline`` s."""
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **env} if env else None,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(stdin), deadline)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise SharingError(f"{' '.join(command)} did not finish in {deadline:.0f} s") from None
    lines = output.decode(errors="replace").strip().splitlines()
    assert process.returncode is not None
    return process.returncode, " / ".join(lines[-3:]) or "no output"
