"""Fixtures for health against the real control plane: a Node, short socket folders, agent credentials."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dra_api.kube import make_api_client
from dra_devcluster import LocalCluster
from tests.integration.agent.agentproc import agent_kubeconfig
from tests.integration.operator.conftest import operators  # noqa: F401 - the fixture, reused

T = TypeVar("T")


@pytest.fixture(scope="session")
def health_agent_credentials(local_cluster: LocalCluster) -> Path:
    return agent_kubeconfig(local_cluster)


@pytest.fixture
def node(local_cluster: LocalCluster) -> Iterator[str]:
    name = f"health-{secrets.token_hex(3)}"
    local_cluster.add_node(name)
    yield name
    local_cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")


@pytest.fixture
async def agent_api(health_agent_credentials: Path) -> AsyncIterator[Any]:
    """An API client with the node agent's own ServiceAccount and ClusterRole (RBAC is real)."""
    api = await make_api_client(kubeconfig=health_agent_credentials)
    yield api
    await api.close()


@pytest.fixture
def socket_dirs() -> Iterator[tuple[Path, Path]]:
    # pytest's tmp_path can exceed the 107-byte unix socket path limit; /tmp/<short> cannot.
    root = Path(tempfile.mkdtemp(prefix="dra-hl-", dir="/tmp"))
    registry, plugins = root / "registry", root / "plugins"
    registry.mkdir()
    plugins.mkdir()
    yield registry, plugins
    shutil.rmtree(root, ignore_errors=True)


async def eventually(probe: Callable[[], Awaitable[T | None]], *, limit: float = 60, what: str) -> T:
    """Await ``probe()`` until it returns something truthy; the deadline only bounds a failing test."""
    deadline = time.monotonic() + limit
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.2)
    raise TimeoutError(f"timed out after {limit:.0f} s waiting for {what} (last: {last!r})")
