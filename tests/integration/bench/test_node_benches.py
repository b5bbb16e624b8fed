"""Smoke runs of the node-side benchmarks on the session's cluster: ``agent_prepare`` (the agent as
a process, prepares through the kubelet's plugin socket, plain and with MPS), ``pod_start`` and
``mps_pod_start`` (real nodes: a kubelet and containerd each), each through its ``main`` with the
smallest arguments that still take every step. The figures they print are checked for sense
(never for size), and each must leave the shared cluster as it found it: its namespace, class and
nodes gone."""

from __future__ import annotations

import re

import pytest

from bench import agent_prepare, mps_pod_start, pod_start
from dra_devcluster import LocalCluster
from tests.benchrun import NUMBER, find, number


def _gone(cluster: LocalCluster, *objects: tuple[str, str]) -> None:
    for kind, name in objects:
        found = cluster.kubectl("get", kind, name, "--ignore-not-found", "-o", "name").stdout.strip()
        assert found == "", f"{kind}/{name} left behind in the shared cluster"


def _samples(out: str, label: str, n: int) -> None:
    """One describe() line of ``label`` with ``n`` samples: p50 at most p99 (and max)."""
    line = find(rf"^{re.escape(label)}\s+p50\s+{NUMBER} ms\s+(?:p99|max)\s+{NUMBER} ms.*n=\s*{n}$", out)
    assert number(line[1]) <= number(line[2])


def test_agent_prepare(local_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    agent_prepare.main(["--rounds", "2"], cluster=local_cluster)
    out = capsys.readouterr().out
    find(r"^node agent prepare/unprepare, 2 rounds each \(kubelet client -> agent -> API server\)$", out)
    for label in (
        "claim GET + one fsync'd write",
        "prepare, 1 device",
        "unprepare, 1 device",
        "prepare, 8 devices",
        "unprepare, 8 devices",
    ):
        _samples(out, label, 2)
    assert number(find(rf"^prepare p50 / \(GET \+ fsync\) p50: {NUMBER}x", out)[1]) > 0
    assert number(find(rf"^agent RSS with 8 simulated GPUs and 8 TPUs: {NUMBER} MiB", out)[1]) > 0
    _gone(local_cluster, ("node", agent_prepare.NODE), ("namespace", agent_prepare.NAMESPACE))
    _gone(local_cluster, ("deviceclass", "bench-gpu"))


def test_agent_prepare_with_mps(local_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    agent_prepare.main(["--rounds", "2", "--mps"], cluster=local_cluster)
    out = capsys.readouterr().out
    find(r"^node agent MPS claim prepare/unprepare, 2 rounds", out)
    _samples(out, "prepare, 1 GPU with MPS", 2)
    _samples(out, "unprepare, 1 GPU with MPS", 2)
    _gone(local_cluster, ("node", agent_prepare.NODE), ("namespace", agent_prepare.NAMESPACE))


def test_pod_start(local_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    pod_start.main(["--nodes", "1", "--sequential", "1", "--burst", "1"], cluster=local_cluster)
    out = capsys.readouterr().out
    find(r"^pod start on 1 real nodes \(kubelet \+ containerd, 8 simulated GPUs each\)", out)
    for kind in ("dra", "plain"):
        for mode in ("one at a time", "1 at once"):
            line = find(rf"^{kind}, {mode}\s+n=\s*1\s+p50\s+{NUMBER} ms\s+p99\s+{NUMBER} ms$", out)
            assert number(line[1]) <= number(line[2])
    for mode in ("one at a time", "1 at once"):
        ratio = find(rf"^{mode}\s+DRA p50 / plain p50 = {NUMBER}x", out)
        assert number(ratio[1]) > 0
    _gone(
        local_cluster,
        ("node", pod_start.NODES[0]),
        ("namespace", pod_start.NS),
        ("deviceclass", pod_start.CLASS),
    )


def test_mps_pod_start(local_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    mps_pod_start.main(["--rounds", "1"], cluster=local_cluster)
    out = capsys.readouterr().out
    find(r"^a pod per MPS claim, its floor: until Ready on a real node, 1 rounds each$", out)
    _samples(out, "bare Pod with nodeName", 1)
    _samples(out, "Deployment of one Pod with nodeName", 1)
    _gone(local_cluster, ("node", mps_pod_start.NODE), ("namespace", mps_pod_start.NAMESPACE))
