"""Plugin servers on real unix sockets in a short temporary folder (socket paths are limited to 107 bytes)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from dra_devcluster.kubelet import KubeletPluginClient
from dra_node_agent.plugin import RunningPlugin, serve_plugin

from .drivers import QueueHealth, RecordingHandler

DRIVER = "gpu.nvidia.com"


@pytest.fixture
def socket_root() -> Iterator[Path]:
    # pytest's tmp_path can exceed the unix socket path limit; /tmp/<short> cannot.
    root = Path(tempfile.mkdtemp(prefix="drap-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def registry_dir(socket_root: Path) -> Path:
    return socket_root / "plugins_registry"


@pytest.fixture
def plugins_dir(socket_root: Path) -> Path:
    return socket_root / "plugins"


@pytest.fixture
def handler() -> RecordingHandler:
    return RecordingHandler()


@pytest.fixture
def health() -> QueueHealth:
    return QueueHealth()


@pytest.fixture
async def plugin(
    handler: RecordingHandler, health: QueueHealth, registry_dir: Path, plugins_dir: Path
) -> AsyncIterator[RunningPlugin]:
    running = await serve_plugin(
        driver=DRIVER, handler=handler, health=health, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    try:
        yield running
    finally:
        await running.stop(grace=1.0)


@pytest.fixture
async def kubelet(plugin: RunningPlugin) -> AsyncIterator[KubeletPluginClient]:
    client = await KubeletPluginClient.register(plugin.registration_socket, driver=DRIVER, call_timeout=10.0)
    try:
        yield client
    finally:
        await client.close()
