"""compute-domain-daemon run over the simulated nvidia-imex and nvidia-imex-ctl: it joins, writes the
hosts file, starts IMEX, turns Ready; a clique change reaches the running IMEX (SIGUSR1); IMEX that
exits is started again (NotReady meanwhile), with back-off while it fails to start; stopping stops
IMEX and leaves the clique; without a clique it labels its pod and idles. ``check`` answers as the
supervisor reports."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from dra_api import computedomains as cd
from dra_node_agent.imexdaemon.check import check
from dra_node_agent.imexdaemon.settings import DaemonSettings
from dra_node_agent.imexdaemon.supervisor import Supervisor

from .conftest import CLIQUE, MemoryClique, SimNode, until


async def probe(env: dict[str, str]) -> tuple[bool, str]:
    """``check`` as the probe runs it: a process of its own, here a thread (it runs its own loop)."""
    return await asyncio.to_thread(check, env)


class Labels:
    def __init__(self) -> None:
        self.values: list[str] = []

    async def __call__(self, clique_id: str) -> None:
        self.values.append(clique_id)


@asynccontextmanager
async def running(
    settings: DaemonSettings, clique: MemoryClique | None, labels: Labels
) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(settings=settings, clique=clique, label_pod=labels)
    stop = asyncio.Event()
    task = asyncio.create_task(supervisor.run(stop))
    try:
        yield supervisor
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


def _imex_pid(sim: SimNode) -> int | None:
    try:
        return int((sim.config_dir / ".imex-pid").read_text())
    except (FileNotFoundError, ValueError):
        return None


async def test_joins_runs_imex_turns_ready_follows_the_clique_and_leaves(sim: SimNode) -> None:
    peer = {"nodeName": "node-b", "ipAddress": "10.0.0.2", "cliqueID": CLIQUE, "index": 0, "status": cd.READY}
    clique, labels = MemoryClique("node-a", [peer]), Labels()
    assert not (await probe(sim.env()))[0]  # nothing written yet
    async with running(sim.settings(), clique, labels) as supervisor:
        await until(lambda: clique.status() == cd.READY, what="Ready in the clique")
        assert supervisor.index == 1
        assert labels.values == [CLIQUE]
        assert clique.statuses == [cd.NOT_READY, cd.READY]
        hosts = sim.hosts.read_text()
        assert "10.0.0.2\tcompute-domain-daemon-0000\n10.0.0.1\tcompute-domain-daemon-0001\n" in hosts
        assert "127.0.0.1\tlocalhost" in hosts
        assert await probe(sim.env()) == (True, "ready: READY")

        # A third daemon joins: the hosts file maps it, and the running IMEX resolves it (SIGUSR1).
        pid = _imex_pid(sim)
        clique.entries.append(
            {"nodeName": "node-c", "ipAddress": "10.0.0.3", "index": 2, "status": cd.NOT_READY}
        )
        await until(
            lambda: "compute-domain-daemon-0002=10.0.0.3" in sim.imex_state(), what="IMEX re-read its peers"
        )
        assert _imex_pid(sim) == pid
        assert supervisor.restarts == 0
    assert clique.left
    assert clique.entry() is None
    assert _imex_pid(sim) is None  # the simulated IMEX removes its pid file on SIGTERM
    assert not (await probe(sim.env()))[0]


async def test_imex_that_exits_is_restarted_and_notready_meanwhile(sim: SimNode) -> None:
    clique = MemoryClique("node-a")
    async with running(sim.settings(), clique, Labels()) as supervisor:
        await until(lambda: clique.status() == cd.READY, what="Ready")
        first = _imex_pid(sim)
        assert first is not None
        # Without the process the probe says why, before the supervisor has noticed.
        (sim.faults / "not-ready").touch()  # the restarted IMEX stays unready until it is removed
        os.kill(first, signal.SIGKILL)
        await until(lambda: clique.status() == cd.NOT_READY, what="NotReady once IMEX died")
        await until(
            lambda: supervisor.restarts == 1 and _imex_pid(sim) not in (None, first), what="restarted"
        )
        ready, line = await probe(sim.env())
        assert not ready
        assert line.startswith("not ready: nvidia-imex-ctl -q answered UNAVAILABLE")
        (sim.faults / "not-ready").unlink()
        os.kill(supervisor.imex.pid or 0, signal.SIGUSR1)  # as a clique change would
        await until(lambda: clique.status() == cd.READY, what="Ready again")
    assert clique.statuses == [cd.NOT_READY, cd.READY, cd.NOT_READY, cd.READY]


async def test_imex_failing_to_start_is_retried_with_backoff(sim: SimNode) -> None:
    (sim.faults / "fail-start").touch()
    clique = MemoryClique("node-a")
    async with running(sim.settings(), clique, Labels()) as supervisor:
        await until(lambda: supervisor.restarts >= 3, what="three restarts")
        assert clique.status() == cd.NOT_READY
        assert clique.statuses == [cd.NOT_READY]
        assert not (await probe(sim.env()))[0]
        (sim.faults / "fail-start").unlink()
        await until(lambda: clique.status() == cd.READY, what="Ready once IMEX starts")
    assert clique.left


async def test_rejoins_when_its_entry_is_gone(sim: SimNode) -> None:
    clique = MemoryClique("node-a")
    async with running(sim.settings(), clique, Labels()) as supervisor:
        await until(lambda: clique.status() == cd.READY, what="Ready")
        clique.entries.clear()  # pruned by the controller, say
        await until(lambda: clique.joins == 2 and clique.status() == cd.READY, what="joined again and Ready")
        assert supervisor.index == 0


async def test_without_a_clique_it_labels_its_pod_and_idles(sim: SimNode) -> None:
    labels = Labels()
    settings = sim.settings(clique_id="", pod_ip="")
    async with running(settings, None, labels):
        await until(lambda: labels.values == [""], what="pod labelled with the empty clique")
    assert not await asyncio.to_thread(Path(settings.config_file).exists)
    assert _imex_pid(sim) is None
    assert await probe({**sim.env(), "CLIQUE_ID": ""}) == (True, "ready: idle, no NVLink clique on this node")
    assert (await probe({"CLIQUE_ID": ""}))[0] is False  # CDI never reached the container
