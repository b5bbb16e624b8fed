"""Ports for the local cluster's components come from below the ephemeral range, where no client's
outgoing connection can take them between the pick and the component's bind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dra_devcluster import cluster


def test_picks_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {cluster.free_port() for _ in range(20)}
    assert all(low - cluster._LISTEN_PORTS <= port < low for port in ports)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # free when handed out


def test_falls_back_to_the_kernel_when_the_range_is_unreadable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cluster, "_EPHEMERAL_RANGE", tmp_path / "missing")
    assert 0 < cluster.free_port() < 65536


def test_falls_back_when_the_ephemeral_range_starts_low(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "range"
    fake.write_text("1500\t65000\n")
    monkeypatch.setattr(cluster, "_EPHEMERAL_RANGE", fake)
    assert cluster._listen_range() is None
    assert 0 < cluster.free_port() < 65536
