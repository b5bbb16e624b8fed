"""``nvidia-imex`` as the daemon's child, and ``nvidia-imex-ctl -q``, on asyncio subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Final

logger = logging.getLogger(__name__)

IMEX: Final = "nvidia-imex"
IMEX_CTL: Final = "nvidia-imex-ctl"
CTL_TIMEOUT_S: Final = 5.0
STOP_GRACE_S: Final = 10.0
MAX_ANSWER: Final = 4096


class ImexProcess:
    """One ``nvidia-imex -c <config>`` at a time; its output goes to the daemon's own."""

    def __init__(self, *, config_file: str, program: str = IMEX) -> None:
        self.config_file = config_file
        self.program = program
        self._process: asyncio.subprocess.Process | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self.running and self._process is not None else None

    async def start(self) -> None:
        """Start it (it must not be running); raises OSError when it cannot be executed."""
        assert not self.running
        self._process = await asyncio.create_subprocess_exec(
            self.program, "-c", self.config_file, stdin=asyncio.subprocess.DEVNULL
        )
        logger.info("started %s -c %s (pid %d)", self.program, self.config_file, self._process.pid)

    async def wait(self) -> int:
        """Its exit status once it exits (it must have been started)."""
        assert self._process is not None
        return await self._process.wait()

    def reload(self) -> bool:
        """Tell it to resolve its peers' names again (SIGUSR1, as NVIDIA's daemon does); whether
        it was running to be told."""
        if not self.running or self._process is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            self._process.send_signal(signal.SIGUSR1)
        return True

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; nothing when it is not running."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout=STOP_GRACE_S)
        except TimeoutError:
            logger.warning(
                "%s (pid %d) ignored SIGTERM for %.0f s: killing it", self.program, process.pid, STOP_GRACE_S
            )
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        logger.info("stopped %s (pid %d, exit status %s)", self.program, process.pid, process.returncode)


async def query_ready(*, config_file: str, program: str = IMEX_CTL) -> tuple[bool, str]:
    """Ask ``nvidia-imex-ctl -c <config> -q``: ready when it prints READY; else why not."""
    try:
        process = await asyncio.create_subprocess_exec(
            program,
            "-c",
            config_file,
            "-q",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as exc:
        return False, f"{program} could not be run: {exc.strerror or exc}"
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=CTL_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return False, f"{program} -q did not answer within {CTL_TIMEOUT_S:.0f} s"
    answer = " ".join(out[:MAX_ANSWER].decode(errors="replace").split())
    if process.returncode == 0 and answer.split()[:1] == ["READY"]:
        return True, "READY"
    return False, f"{program} -q answered {answer or 'nothing'} (exit status {process.returncode})"
