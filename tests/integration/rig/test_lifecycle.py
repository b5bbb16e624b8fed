"""A cluster stops everything it started: no stray processes, no ports left listening."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from dra_api.localcluster import LocalCluster


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
