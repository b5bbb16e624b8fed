"""A cluster stops everything it started: no stray processes, no ports left listening."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from dra_devcluster import LocalCluster
from dra_devcluster import cluster as cluster_module


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes only once reaped.
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"


def test_stop_leaves_no_processes_or_ports(tmp_path: Path) -> None:
    cluster = LocalCluster(workdir=tmp_path / "cluster")
    cluster.start()
    pids = cluster.pids()
    port = int(cluster.server.rsplit(":", 1)[1])
    assert len(pids) == 4  # etcd, apiserver, controller-manager, scheduler
    assert all(_alive(pid) for pid in pids)
    assert _listening(port)
    assert cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"

    cluster.stop()

    assert [pid for pid in pids if _alive(pid)] == []
    assert not _listening(port)
    # Logs stay behind for inspection.
    assert {p.name for p in cluster.log_files()} == {
        "etcd.log",
        "kube-apiserver.log",
        "kube-controller-manager.log",
        "kube-scheduler.log",
    }


def test_start_survives_a_port_taken_before_the_apiserver_binds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports are picked before the components bind them, and an outgoing connection can take one
    in between: the API server then exits with 'address already in use', and the cluster starts
    again with other ports instead of failing the test session."""
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picked: list[int] = []

    def pick() -> int:
        # The third port of the first attempt is the API server's (etcd takes the first two).
        port = taken.getsockname()[1] if len(picked) == 2 else real_free_port()
        picked.append(port)
        return port

    real_free_port = cluster_module.free_port
    monkeypatch.setattr(cluster_module, "free_port", pick)
    cluster = LocalCluster(workdir=tmp_path / "cluster")
    try:
        cluster.start()
        assert cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
        assert int(cluster.server.rsplit(":", 1)[1]) != taken.getsockname()[1]
        first = (tmp_path / "cluster" / "logs" / "attempt-1" / "kube-apiserver.log").read_text()
        assert "address already in use" in first
        assert "address already in use" not in cluster.log_tail("kube-apiserver", lines=10_000)
    finally:
        cluster.stop()
        taken.close()
