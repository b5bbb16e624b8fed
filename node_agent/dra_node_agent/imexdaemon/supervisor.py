"""``compute-domain-daemon run``: one node's IMEX daemon of one ComputeDomain, as NVIDIA's runs.

Without a clique (no NVLink fabric) it labels its pod with the empty clique and idles: the
controller counts the pod's own readiness. With one, every ``poll_seconds`` it:

1. reads the clique and joins it if its entry is missing (at start, or after the controller pruned
   it): the smallest free index, the one it had before on a restart;
2. writes the daemons' DNS names into the hosts file, and tells a running ``nvidia-imex`` to
   resolve them again (SIGUSR1) when they changed;
3. keeps ``nvidia-imex -c imexd.cfg`` running, restarting it after 1 s, 2 s, ... up to
   ``max_backoff_seconds`` while it keeps exiting;
4. asks ``nvidia-imex-ctl -q`` and sets its clique entry Ready or NotReady when that changes.

On SIGTERM it stops ``nvidia-imex`` and leaves the clique.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from dra_api import computedomains as cd
from dra_node_agent.imexdaemon import files
from dra_node_agent.imexdaemon.pod_api import PodLabelError
from dra_node_agent.imexdaemon.process import IMEX_CTL, ImexProcess, query_ready
from dra_node_agent.imexdaemon.settings import DaemonSettings
from dra_node_agent.nvidia.imex_clique import CliqueError

logger = logging.getLogger(__name__)

# nvidia-imex that ran this long before it exited starts again from the shortest back-off.
STABLE_S: Final = 60.0
LEAVE_TIMEOUT_S: Final = 15.0


class Clique(Protocol):
    """The daemon's entry in its clique (``nvidia.imex_clique.CliqueMembership``); raises
    CliqueError."""

    async def join(self, *, ip_address: str) -> int: ...
    async def daemons(self) -> list[dict[str, Any]] | None: ...
    async def set_status(self, status: str) -> None: ...
    async def leave(self) -> None: ...


class Supervisor:
    """See the module docstring."""

    def __init__(
        self,
        *,
        settings: DaemonSettings,
        clique: Clique | None,
        label_pod: Callable[[str], Awaitable[None]],
        imex: ImexProcess | None = None,
        ctl_program: str = IMEX_CTL,
    ) -> None:
        self.settings = settings
        self.clique = clique
        self.label_pod = label_pod
        self.imex = imex or ImexProcess(config_file=settings.config_file)
        self.ctl_program = ctl_program
        self.index: int | None = None
        self.status = cd.NOT_READY
        self.restarts = 0
        self._labelled = False
        self._configured = False
        self._mapping: dict[str, str] | None = None
        self._failures = 0
        self._started_at = 0.0
        self._next_start = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        where = f"ComputeDomain {s.domain_namespace}/{s.domain_name} ({s.domain_uid}) on node {s.node_name}"
        if s.idle:
            logger.info("%s: no NVLink clique here (CLIQUE_ID is empty): idle until SIGTERM", where)
        else:
            logger.info("%s: IMEX daemon for clique %s, address %s", where, s.clique_id, s.pod_ip)
        try:
            while not stop.is_set():
                await self._tick()
                await _sleep_or_stop(stop, s.poll_seconds)
        finally:
            if not s.idle:
                await self._shut_down()
        logger.info("stopped")

    async def _tick(self) -> None:
        if not self._labelled:
            await self._label()
        if self.settings.idle:
            return
        if self.index is None and not await self._join():
            return
        if not self._configured and not await self._configure():
            return
        await self._refresh()
        await self._keep_running()
        await self._report_ready()

    async def _label(self) -> None:
        try:
            await self.label_pod(self.settings.clique_id)
        except PodLabelError as exc:
            logger.warning("labelling this pod with its clique failed (trying again): %s", exc)
            return
        self._labelled = True
        logger.info(
            "labelled pod %s with %s=%r", self.settings.pod_name, cd.CLIQUE_LABEL, self.settings.clique_id
        )

    async def _join(self) -> bool:
        assert self.clique is not None
        try:
            self.index = await self.clique.join(ip_address=self.settings.pod_ip)
        except CliqueError as exc:
            logger.error("joining clique %s failed (trying again): %s", self.settings.clique_id, exc)
            return False
        self.status = cd.NOT_READY
        logger.info(
            "joined clique %s as index %d (%s), NotReady",
            self.settings.clique_id,
            self.index,
            f"compute-domain-daemon-{self.index:04d}",
        )
        return True

    async def _configure(self) -> bool:
        s = self.settings
        try:
            await asyncio.to_thread(
                files.write_config,
                template_file=s.template_file,
                config_file=s.config_file,
                nodes_file=s.nodes_file,
                pod_ip=s.pod_ip,
                max_nodes=s.max_nodes,
            )
        except files.FilesError as exc:
            logger.error("writing the IMEX config failed (trying again): %s", exc)
            return False
        self._configured = True
        logger.info(
            "wrote %s (command service on %s) and %s (%d names)",
            s.config_file,
            s.pod_ip,
            s.nodes_file,
            s.max_nodes,
        )
        return True

    async def _refresh(self) -> None:
        """The clique's addresses into the hosts file; join again when this node's entry is gone."""
        assert self.clique is not None
        try:
            daemons = await self.clique.daemons()
        except CliqueError as exc:
            logger.warning("reading the clique failed (trying again): %s", exc)
            return
        mine = [d for d in daemons or [] if d.get("nodeName") == self.settings.node_name]
        if not mine or mine[0].get("ipAddress") != self.settings.pod_ip or mine[0].get("index") != self.index:
            logger.warning(
                "this node's entry is missing from clique %s or changed: joining again",
                self.settings.clique_id,
            )
            self.index = None
            return
        mapping = files.address_map(daemons or [], max_nodes=self.settings.max_nodes)
        if mapping == self._mapping:
            return
        try:
            await asyncio.to_thread(files.update_hosts, self.settings.hosts_file, mapping)
        except files.FilesError as exc:
            logger.error("updating the hosts file failed (trying again): %s", exc)
            return
        self._mapping = mapping
        peers = ", ".join(f"{name}={ip}" for name, ip in mapping.items())
        if self.imex.reload():
            logger.info("clique changed (%s): told nvidia-imex to resolve its peers again (SIGUSR1)", peers)
        else:
            logger.info("clique: %s", peers)

    async def _keep_running(self) -> None:
        if self.imex.running:
            return
        now = time.monotonic()
        if self._started_at and self._next_start <= self._started_at:
            # It was running and has exited since: when to start it again.
            status = await self.imex.wait()
            ran = now - self._started_at
            self._failures = 1 if ran >= STABLE_S else self._failures + 1
            delay = backoff_seconds(failures=self._failures, cap=self.settings.max_backoff_seconds)
            self._next_start = now + delay
            logger.error(
                "nvidia-imex exited with status %d after %.0f s: starting it again in %.0f s",
                status,
                ran,
                delay,
            )
        if now < self._next_start:
            return
        try:
            await self.imex.start()
        except OSError as exc:
            self._failures += 1
            delay = backoff_seconds(failures=self._failures, cap=self.settings.max_backoff_seconds)
            self._next_start = now + delay
            logger.error(
                "starting nvidia-imex failed: %s; trying again in %.0f s", exc.strerror or exc, delay
            )
            return
        if self._started_at:
            self.restarts += 1
        self._started_at = now

    async def _report_ready(self) -> None:
        assert self.clique is not None
        if self.imex.running:
            ready, why = await query_ready(config_file=self.settings.config_file, program=self.ctl_program)
        else:
            ready, why = False, "nvidia-imex is not running"
        status = cd.READY if ready else cd.NOT_READY
        if status == self.status:
            return
        try:
            await self.clique.set_status(status)
        except CliqueError as exc:
            logger.warning("setting this node's clique entry %s failed (trying again): %s", status, exc)
            return
        self.status = status
        logger.info("IMEX %s (%s): clique entry %s", "ready" if ready else "not ready", why, status)

    async def _shut_down(self) -> None:
        await self.imex.stop()
        if self.clique is None or self.index is None:
            return
        try:
            await asyncio.wait_for(self.clique.leave(), timeout=LEAVE_TIMEOUT_S)
        except (CliqueError, TimeoutError) as exc:
            logger.error("leaving clique %s failed: %s", self.settings.clique_id, exc or "timed out")
            return
        logger.info("left clique %s (index %d)", self.settings.clique_id, self.index)


def backoff_seconds(*, failures: int, cap: float) -> float:
    """1 s after the first failure in a row, doubling, never more than ``cap``."""
    return min(cap, 2.0 ** min(max(failures - 1, 0), 16))


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
