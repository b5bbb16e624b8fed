"""compute-domain-daemon run, the real program, against the real API server over the simulated
nvidia-imex: two daemons started at once join with distinct indices, label their pods, map each
other in their hosts files and turn Ready; one that crashed (no leave) keeps its index when it
comes back with a new address; SIGTERM stops IMEX and leaves the clique."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_api import computedomains as cd
from dra_devcluster import LocalCluster
from dra_node_agent.nvidia import imex_config
from dra_node_agent.simulated.host_tools import install_simulated_imex

REPO = Path(__file__).resolve().parents[3]
DAEMONS = "cd-imex-daemons"
DOMAIN = "4c1b2a3d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
CLIQUE = "6b9e5f0a-1c2d-4e3f-8a7b-9c0d1e2f3a4b.7"


@dataclass
class Daemon:
    node: str
    folder: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> Path:
        return self.folder / "hosts"

    def start(self, *, cluster: LocalCluster, ip: str, driver: Path) -> None:
        env = {
            **os.environ,
            "PATH": f"{driver / 'usr' / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "COMPUTE_DOMAIN_UUID": DOMAIN,
            "COMPUTE_DOMAIN_NAME": "imex-test",
            "COMPUTE_DOMAIN_NAMESPACE": "team-a",
            "CLIQUE_ID": CLIQUE,
            "NODE_NAME": self.node,
            "POD_IP": ip,
            "POD_NAME": f"daemon-{self.node}",
            "POD_NAMESPACE": DAEMONS,
            "MAX_NODES_PER_IMEX_DOMAIN": "4",
            "COMPUTE_DOMAIN_DAEMON_CONFIG_DIR": str(self.folder / "imexd"),
            "COMPUTE_DOMAIN_DAEMON_HOSTS_FILE": str(self.hosts),
            "COMPUTE_DOMAIN_DAEMON_KUBECONFIG": str(cluster.kubeconfig),
            "COMPUTE_DOMAIN_DAEMON_POLL_SECONDS": "0.2",
            "ACCEL_DRA_SIMULATED_IMEX_FAULTS": str(self.folder / "faults"),
        }
        log = (self.folder / "daemon.log").open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dra_node_agent.imexdaemon.cli", "run"], env=env, stdout=log, stderr=log
        )

    def log(self) -> str:
        return (self.folder / "daemon.log").read_text(errors="replace")


@pytest.fixture
def daemons(local_cluster: LocalCluster, tmp_path: Path) -> Iterator[list[Daemon]]:
    local_cluster.kubectl("apply", "-k", str(REPO / "crds"))
    local_cluster.kubectl(
        "wait", "--for=condition=Established", "crd/computedomaincliques.resource.nvidia.com", "--timeout=60s"
    )
    local_cluster.create_namespace(DAEMONS)
    # The daemons' pods (never scheduled: the daemons run here), which they label with their clique.
    local_cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"daemon-{node}", "namespace": DAEMONS},
                "spec": {
                    "nodeSelector": {"accel-dra.test/nowhere": "true"},
                    "containers": [{"name": "d", "image": "registry.k8s.io/pause:3.10"}],
                },
            }
            for node in ("n-a", "n-b")
        ]
    )
    found = []
    for node in ("n-a", "n-b"):
        folder = tmp_path / node
        (folder / "imexd").mkdir(parents=True)
        (folder / "faults").mkdir()
        (folder / "imexd" / imex_config.TEMPLATE_NAME).write_text(imex_config.TEMPLATE_TEXT)
        (folder / "hosts").write_text("127.0.0.1\tlocalhost\n")
        found.append(Daemon(node=node, folder=folder))
    install_simulated_imex(tmp_path / "driver")
    try:
        yield found
    finally:
        for d in found:
            if d.process is not None and d.process.poll() is None:
                d.process.kill()
                d.process.wait()
            print(f"daemon {d.node} log:\n{d.log()[-6000:]}")
        local_cluster.kubectl("delete", "namespace", DAEMONS, "--ignore-not-found", "--wait=false")


def _clique(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    out = cluster.kubectl(
        "get", "computedomainclique", cd.clique_name(DOMAIN, CLIQUE), "-n", DAEMONS, "-o", "json", check=False
    )
    if out.returncode != 0:
        return {}
    return {d["nodeName"]: d for d in json.loads(out.stdout).get("daemons") or []}


def _until(condition: Callable[[], bool], *, what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.2)


def _ready(cluster: LocalCluster, node: str, ip: str) -> bool:
    entry = _clique(cluster).get(node)
    return entry is not None and entry["status"] == cd.READY and entry["ipAddress"] == ip


def test_daemons_join_turn_ready_keep_their_index_and_leave(
    local_cluster: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    a, b = daemons
    driver = tmp_path / "driver"
    a.start(cluster=local_cluster, ip="10.0.0.1", driver=driver)
    b.start(cluster=local_cluster, ip="10.0.0.2", driver=driver)
    _until(
        lambda: _ready(local_cluster, "n-a", "10.0.0.1") and _ready(local_cluster, "n-b", "10.0.0.2"),
        what="both Ready",
    )
    entries = _clique(local_cluster)
    assert sorted(e["index"] for e in entries.values()) == [0, 1]  # joined at once, none taken twice
    index_b = entries["n-b"]["index"]
    names = {e["ipAddress"]: imex_config.dns_name(e["index"]) for e in entries.values()}
    for d in daemons:
        hosts = d.hosts.read_text()
        assert hosts.startswith("127.0.0.1\tlocalhost\n")
        assert all(f"{ip}\t{name}\n" in hosts for ip, name in names.items())
    for node in ("n-a", "n-b"):
        pod = local_cluster.get_json("pod", f"daemon-{node}", "-n", DAEMONS)
        assert pod["metadata"]["labels"][cd.CLIQUE_LABEL] == CLIQUE

    # b crashes (it cannot leave) and comes back with a new address: same index, Ready again, and a
    # maps its new address.
    assert b.process is not None
    b.process.kill()
    b.process.wait()
    b.start(cluster=local_cluster, ip="10.0.0.9", driver=driver)
    _until(lambda: _ready(local_cluster, "n-b", "10.0.0.9"), what="b Ready at its new address")
    assert _clique(local_cluster)["n-b"]["index"] == index_b
    _until(
        lambda: f"10.0.0.9\t{imex_config.dns_name(index_b)}\n" in a.hosts.read_text(),
        what="a maps b's new address",
    )

    # SIGTERM: IMEX stopped, the entry gone, exit status 0; a stops mapping b.
    b.process.send_signal(signal.SIGTERM)
    assert b.process.wait(timeout=60) == 0
    assert "n-b" not in _clique(local_cluster)
    assert not (b.folder / "imexd" / ".imex-pid").exists()
    _until(lambda: "10.0.0.9" not in a.hosts.read_text(), what="a no longer maps b")
    assert a.process is not None
    a.process.send_signal(signal.SIGTERM)
    assert a.process.wait(timeout=60) == 0
    assert _clique(local_cluster) == {}
