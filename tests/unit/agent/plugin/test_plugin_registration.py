"""The registration handshake as kubelet performs it, over the plugin's real registration socket."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from dra_devcluster.kubelet import (
    KubeletPluginClient,
    PluginCallError,
    PluginRegistrationError,
    find_registration_sockets,
    get_plugin_info,
)
from dra_node_agent.plugin import RunningPlugin, serve_plugin
from dra_node_agent.plugin.registration import FAIL_GETINFO_ENV

from .conftest import DRIVER
from .drivers import RecordingHandler


def _add_entries_kubelet_ignores(registry_dir: Path) -> None:
    """A hidden socket and a plain file."""
    hidden = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hidden.bind(str(registry_dir / ".hidden-reg.sock"))
    hidden.close()
    (registry_dir / "notes.txt").write_text("not a socket")


async def test_get_info_describes_the_dra_socket(plugin: RunningPlugin, plugins_dir: Path) -> None:
    info = await get_plugin_info(plugin.registration_socket)

    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(plugins_dir / DRIVER / "dra.sock")
    assert Path(info.endpoint).is_absolute()
    # v1 first: kubelet picks the first DRA entry it supports; of the health services a 1.37
    # kubelet takes v1, older ones the only one they know, v1alpha1.
    assert info.supported_versions == (
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    )


async def test_default_socket_names(plugin: RunningPlugin, registry_dir: Path, plugins_dir: Path) -> None:
    assert plugin.registration_socket == registry_dir / f"{DRIVER}-reg.sock"
    assert plugin.dra_socket == plugins_dir / DRIVER / "dra.sock"


async def test_handshake_registers_with_v1_and_tells_the_plugin(plugin: RunningPlugin) -> None:
    client = await KubeletPluginClient.register(plugin.registration_socket, driver=DRIVER)
    try:
        assert client.version == "v1"
        assert client.health_advertised
        assert client.health_version == "v1"
        assert client.endpoint == plugin.dra_socket
        assert await plugin.wait_registration_status() is True
        assert plugin.registered
        assert plugin.registration_error == ""
    finally:
        await client.close()


async def test_handshake_can_choose_v1beta1(plugin: RunningPlugin) -> None:
    client = await KubeletPluginClient.register(plugin.registration_socket, version="v1beta1")
    try:
        assert client.version == "v1beta1"
        assert plugin.registered
    finally:
        await client.close()


async def test_without_health_source_health_is_not_advertised(
    handler: RecordingHandler, registry_dir: Path, plugins_dir: Path
) -> None:
    running = await serve_plugin(
        driver=DRIVER, handler=handler, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    try:
        info = await get_plugin_info(running.registration_socket)
        assert info.supported_versions == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    finally:
        await running.stop()


async def test_rejection_reaches_the_plugin_and_is_logged_as_warning(
    plugin: RunningPlugin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dra_node_agent.plugin")

    with pytest.raises(PluginRegistrationError, match=r"expected driver tpu\.google\.com"):
        await KubeletPluginClient.register(plugin.registration_socket, driver="tpu.google.com")

    assert await plugin.wait_registration_status() is False
    assert "tpu.google.com" in plugin.registration_error
    rejected = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert rejected
    assert rejected[0].levelno == logging.WARNING


async def test_a_later_successful_registration_replaces_a_rejection(plugin: RunningPlugin) -> None:
    with pytest.raises(PluginRegistrationError):
        await KubeletPluginClient.register(plugin.registration_socket, driver="other.example.com")
    assert "other.example.com" in plugin.registration_error

    client = await KubeletPluginClient.register(plugin.registration_socket, driver=DRIVER)
    await client.close()
    assert plugin.registered
    assert plugin.registration_error == ""


async def test_register_driver_finds_its_socket_and_ignores_others(
    plugin: RunningPlugin, registry_dir: Path
) -> None:
    _add_entries_kubelet_ignores(registry_dir)

    assert await find_registration_sockets(registry_dir) == [plugin.registration_socket]

    client = await KubeletPluginClient.register_driver(registry_dir, driver=DRIVER)
    try:
        assert client.registration_socket == plugin.registration_socket
        assert plugin.registered
    finally:
        await client.close()


async def test_register_driver_fails_clearly_for_an_unknown_driver(
    plugin: RunningPlugin, registry_dir: Path
) -> None:
    with pytest.raises(PluginRegistrationError, match=r"no registration socket .* driver tpu\.google\.com"):
        await KubeletPluginClient.register_driver(registry_dir, driver="tpu.google.com")


async def test_injected_get_info_failures_fail_the_first_calls_then_registration_works(
    handler: RecordingHandler,
    registry_dir: Path,
    plugins_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FAIL_GETINFO_ENV, "2")
    running = await serve_plugin(
        driver=DRIVER, handler=handler, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    try:
        for attempt in (1, 2):
            with pytest.raises(PluginCallError, match=f"injected GetInfo failure {attempt} of 2") as failed:
                await get_plugin_info(running.registration_socket)
            assert failed.value.code == "UNAVAILABLE"
        # The variable was read when the plugin started: changing it now changes nothing.
        monkeypatch.setenv(FAIL_GETINFO_ENV, "5")
        client = await KubeletPluginClient.register(running.registration_socket, driver=DRIVER)
        await client.close()
        assert running.registered
    finally:
        await running.stop(grace=1.0)


async def test_an_unusable_get_info_failure_count_injects_nothing(
    handler: RecordingHandler,
    registry_dir: Path,
    plugins_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(FAIL_GETINFO_ENV, "once")
    running = await serve_plugin(
        driver=DRIVER, handler=handler, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    try:
        assert (await get_plugin_info(running.registration_socket)).name == DRIVER
        assert f"ignoring {FAIL_GETINFO_ENV}='once'" in caplog.text
    finally:
        await running.stop(grace=1.0)
