"""The longest socket path serving a set of drivers creates (dra_api.kubeletapi.socketpaths)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_api.kubeletapi.socketpaths import POD_UID_BYTES, STAGING_NAME_BYTES, longest_socket_path

REGISTRY = Path("/var/lib/kubelet/plugins_registry")
PLUGINS = Path("/var/lib/kubelet/plugins")
UID = "0" * POD_UID_BYTES


def test_with_a_pod_uid_the_registration_socket_is_the_longest() -> None:
    longest = longest_socket_path(
        drivers=["gpu.nvidia.com", "tpu.google.com"], registry_dir=REGISTRY, plugins_dir=PLUGINS, instance=UID
    )
    assert longest == REGISTRY / f"gpu.nvidia.com-{UID}-reg.sock"


def test_the_longest_driver_name_decides() -> None:
    longest = longest_socket_path(
        drivers=["gpu.nvidia.com", "a-much-longer-driver.example.com"],
        registry_dir=REGISTRY,
        plugins_dir=PLUGINS,
        instance=None,
    )
    assert longest == REGISTRY / "a-much-longer-driver.example.com-reg.sock"


def test_the_staging_name_counts_where_it_is_longer_than_the_socket() -> None:
    # Without an instance "dra.sock" is 8 bytes; the socket is first bound as ".<8 hex>.sock".
    longest = longest_socket_path(
        drivers=["g"], registry_dir=Path("/r"), plugins_dir=Path("/a/much/longer/plugins"), instance=None
    )
    assert longest.parent == Path("/a/much/longer/plugins/g")
    assert len(longest.name) == STAGING_NAME_BYTES


def test_no_driver_is_an_error() -> None:
    with pytest.raises(ValueError, match="no driver"):
        longest_socket_path(drivers=[], registry_dir=REGISTRY, plugins_dir=PLUGINS, instance=None)
