"""Socket files: stale ones removed, permissions, removal on stop, restart on the same paths."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from dra_devcluster.kubelet import KubeletPluginClient, PluginCallError, get_plugin_info
from dra_node_agent.plugin import ClaimRef, serve_plugin

from .conftest import DRIVER
from .drivers import RecordingHandler

CLAIM = ClaimRef(namespace="ns", name="claim", uid="uid-1")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _leave_dead_socket(path: Path) -> None:
    """What a crashed plugin leaves behind: a socket file nobody listens on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()


def _make_directory(path: Path, *, mode: int) -> None:
    path.mkdir(parents=True)
    os.chmod(path, mode)


def _write(path: Path, text: str) -> None:
    path.write_text(text)


async def test_sockets_and_directories_have_restrictive_modes(
    handler: RecordingHandler, registry_dir: Path, plugins_dir: Path
) -> None:
    running = await serve_plugin(
        driver=DRIVER, handler=handler, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    try:
        assert stat.S_ISSOCK(running.dra_socket.lstat().st_mode)
        assert stat.S_ISSOCK(running.registration_socket.lstat().st_mode)
        assert _mode(running.dra_socket) == 0o600
        assert _mode(running.registration_socket) == 0o600
        assert _mode(plugins_dir / DRIVER) == 0o750
        # Created by the plugin because they were missing, so also 0750.
        assert _mode(registry_dir) == 0o750
        assert _mode(plugins_dir) == 0o750
        # Sockets are bound under a hidden name and moved into place: nothing else is left behind.
        assert os.listdir(plugins_dir / DRIVER) == ["dra.sock"]
        assert os.listdir(registry_dir) == [f"{DRIVER}-reg.sock"]
    finally:
        await running.stop()


async def test_an_existing_driver_directory_is_tightened_but_the_registry_is_left_alone(
    handler: RecordingHandler, registry_dir: Path, plugins_dir: Path
) -> None:
    _make_directory(plugins_dir / DRIVER, mode=0o777)
    _make_directory(registry_dir, mode=0o755)

    running = await serve_plugin(
        driver=DRIVER, handler=handler, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    await running.stop()

    assert _mode(plugins_dir / DRIVER) == 0o750
    assert _mode(registry_dir) == 0o755


async def test_stale_sockets_are_replaced(
    handler: RecordingHandler, registry_dir: Path, plugins_dir: Path
) -> None:
    _leave_dead_socket(registry_dir / f"{DRIVER}-reg.sock")
    _make_directory(plugins_dir / DRIVER, mode=0o750)
    _write(plugins_dir / DRIVER / "dra.sock", "left over as a plain file")

    running = await serve_plugin(
        driver=DRIVER, handler=handler, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    try:
        client = await KubeletPluginClient.register(running.registration_socket, driver=DRIVER)
        results = await client.prepare([CLAIM])
        await client.close()
    finally:
        await running.stop()

    assert results["uid-1"].error == ""


async def test_stop_removes_both_sockets_and_kubelet_can_no_longer_connect(
    handler: RecordingHandler, registry_dir: Path, plugins_dir: Path
) -> None:
    running = await serve_plugin(
        driver=DRIVER, handler=handler, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    await running.stop()
    await running.stop()  # idempotent

    assert not running.registration_socket.exists()
    assert not running.dra_socket.exists()
    with pytest.raises(PluginCallError, match="UNAVAILABLE"):
        await get_plugin_info(running.registration_socket)


async def test_restart_on_the_same_paths_serves_again(
    handler: RecordingHandler, registry_dir: Path, plugins_dir: Path
) -> None:
    first = await serve_plugin(
        driver=DRIVER, handler=handler, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    client = await KubeletPluginClient.register(first.registration_socket, driver=DRIVER)
    assert (await client.prepare([CLAIM]))["uid-1"].error == ""
    await first.stop()
    with pytest.raises(PluginCallError, match="UNAVAILABLE"):
        await client.prepare([CLAIM], deadline=2.0)
    await client.close()

    # The new socket appearing is what makes kubelet register the plugin again.
    second = await serve_plugin(
        driver=DRIVER, handler=handler, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    try:
        again = await KubeletPluginClient.register(second.registration_socket, driver=DRIVER)
        assert again.endpoint == first.dra_socket
        assert (await again.prepare([CLAIM]))["uid-1"].error == ""
        assert (await again.unprepare([CLAIM]))["uid-1"] == ""
        await again.close()
        assert second.registered
    finally:
        await second.stop()
    assert len(handler.prepared) == 2


async def test_an_old_instance_stopping_late_leaves_the_new_sockets(
    handler: RecordingHandler, registry_dir: Path, plugins_dir: Path
) -> None:
    old = await serve_plugin(
        driver=DRIVER, handler=handler, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    # The new instance starts while the old one still runs (it takes over the paths) ...
    new = await serve_plugin(
        driver=DRIVER, handler=handler, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    try:
        # ... and the old one's stop must not delete what the new one created.
        await old.stop()
        assert new.registration_socket.exists()
        assert new.dra_socket.exists()
        info = await get_plugin_info(new.registration_socket)
        assert info.name == DRIVER
    finally:
        await new.stop()
    assert not new.registration_socket.exists()


async def test_rolling_update_instances_get_their_own_sockets(
    handler: RecordingHandler, registry_dir: Path, plugins_dir: Path
) -> None:
    running = await serve_plugin(
        driver=DRIVER,
        handler=handler,
        registry_dir=registry_dir,
        plugins_dir=plugins_dir,
        instance="pod-1234",
    )
    try:
        assert running.registration_socket == registry_dir / f"{DRIVER}-pod-1234-reg.sock"
        assert running.dra_socket == plugins_dir / DRIVER / "dra-pod-1234.sock"
        info = await get_plugin_info(running.registration_socket)
        assert info.endpoint == str(running.dra_socket)
    finally:
        await running.stop()


async def test_a_socket_path_longer_than_unix_allows_is_refused(
    handler: RecordingHandler, socket_root: Path
) -> None:
    deep = socket_root / ("d" * 120)
    with pytest.raises(ValueError, match=r"plugin socket path .* more than the 107 allowed"):
        await serve_plugin(driver=DRIVER, handler=handler, registry_dir=deep, plugins_dir=deep)


async def test_a_directory_at_the_socket_path_is_refused(
    handler: RecordingHandler, registry_dir: Path, plugins_dir: Path
) -> None:
    _make_directory(plugins_dir / DRIVER / "dra.sock", mode=0o750)
    with pytest.raises(ValueError, match=r"plugin socket path .*dra\.sock is a directory"):
        await serve_plugin(driver=DRIVER, handler=handler, registry_dir=registry_dir, plugins_dir=plugins_dir)


@pytest.mark.parametrize("driver", ["", "a/b", ".hidden"])
async def test_driver_names_that_cannot_name_a_socket_are_refused(
    handler: RecordingHandler, registry_dir: Path, plugins_dir: Path, driver: str
) -> None:
    with pytest.raises(ValueError, match="plugin driver name"):
        await serve_plugin(driver=driver, handler=handler, registry_dir=registry_dir, plugins_dir=plugins_dir)
