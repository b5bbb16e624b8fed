"""A simulated node for compute-domain-daemon: the simulated nvidia-imex and nvidia-imex-ctl on
PATH, the domain's folder with the agent's template, a hosts file and the IMEX fault folder."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_api import computedomains as cd
from dra_node_agent.imexdaemon.settings import DaemonSettings
from dra_node_agent.nvidia import imex_config
from dra_node_agent.nvidia.imex_clique import CliqueError
from dra_node_agent.simulated.host_tools import install_simulated_imex

DOMAIN = "0b6a1a1e-2f4c-4d5e-8f90-123456789abc"
CLIQUE = "6b9e5f0a-1c2d-4e3f-8a7b-9c0d1e2f3a4b.1"
OTHER_HOSTS = "127.0.0.1\tlocalhost\n# kubelet-managed\n10.1.0.9\tdaemon-pod.example\n"


@dataclass
class SimNode:
    root: Path
    config_dir: Path
    hosts: Path
    faults: Path

    def settings(self, **changes: Any) -> DaemonSettings:
        base = DaemonSettings(
            domain_uid=DOMAIN,
            domain_name="cd",
            domain_namespace="team-a",
            clique_id=CLIQUE,
            node_name="node-a",
            pod_ip="10.0.0.1",
            pod_name="daemon-a",
            pod_namespace="accel-dra",
            max_nodes=4,
            config_dir=str(self.config_dir),
            hosts_file=str(self.hosts),
            poll_seconds=0.05,
            max_backoff_seconds=0.2,
        )
        return DaemonSettings(**{**base.__dict__, **changes})

    def env(self) -> dict[str, str]:
        return {
            "COMPUTE_DOMAIN_UUID": DOMAIN,
            "CLIQUE_ID": CLIQUE,
            "COMPUTE_DOMAIN_DAEMON_CONFIG_DIR": str(self.config_dir),
        }

    def imex_state(self) -> str:
        try:
            return (self.config_dir / ".imex-state").read_text()
        except FileNotFoundError:
            return ""


@pytest.fixture
def sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimNode:
    install_simulated_imex(tmp_path / "driver")
    node = SimNode(
        root=tmp_path, config_dir=tmp_path / "imexd", hosts=tmp_path / "hosts", faults=tmp_path / "faults"
    )
    node.config_dir.mkdir()
    node.faults.mkdir()
    (node.config_dir / imex_config.TEMPLATE_NAME).write_text(imex_config.TEMPLATE_TEXT)
    node.hosts.write_text(OTHER_HOSTS)
    # The supervisor's children inherit these: the stand-ins on PATH, their hosts file and faults.
    monkeypatch.setenv("PATH", f"{tmp_path / 'driver' / 'usr' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("COMPUTE_DOMAIN_DAEMON_HOSTS_FILE", str(node.hosts))
    monkeypatch.setenv("ACCEL_DRA_SIMULATED_IMEX_FAULTS", str(node.faults))
    return node


class MemoryClique:
    """The clique's daemons list as CliqueMembership keeps it, in memory (the API server's side of
    it is tested in tests/integration/agent/test_imex_daemon.py)."""

    def __init__(self, node_name: str, daemons: list[dict[str, Any]] | None = None) -> None:
        self.node_name = node_name
        self.entries: list[dict[str, Any]] = daemons if daemons is not None else []
        self.statuses: list[str] = []
        self.joins = 0
        self.left = False

    async def join(self, *, ip_address: str) -> int:
        self.joins += 1
        mine = self.entry()
        used = {d["index"] for d in self.entries if d is not mine}
        index = mine["index"] if mine else min(i for i in range(64) if i not in used)
        self.entries[:] = [d for d in self.entries if d is not mine]
        self.entries.append(
            {
                "nodeName": self.node_name,
                "ipAddress": ip_address,
                "cliqueID": CLIQUE,
                "index": index,
                "status": cd.NOT_READY,
            }
        )
        self.statuses.append(cd.NOT_READY)
        return index

    async def daemons(self) -> list[dict[str, Any]] | None:
        return [dict(d) for d in self.entries]

    async def set_status(self, status: str) -> None:
        mine = self.entry()
        if mine is None:
            raise CliqueError(f"node {self.node_name} has not joined")
        mine["status"] = status
        self.statuses.append(status)

    async def leave(self) -> None:
        self.entries[:] = [d for d in self.entries if d["nodeName"] != self.node_name]
        self.left = True

    def entry(self) -> dict[str, Any] | None:
        return next((d for d in self.entries if d["nodeName"] == self.node_name), None)

    def status(self) -> str | None:
        mine = self.entry()
        return None if mine is None else str(mine["status"])


async def until(condition: Callable[[], bool], *, limit_s: float = 30.0, what: str = "") -> None:
    """Poll ``condition`` (no assertion on durations: the timeout only ends a hung test)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)
