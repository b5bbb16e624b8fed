"""The operator allocates with the feature gates of the cluster's release, read from the API server.

The expectation comes from the local cluster's own table of each release's gates
(``dra_devcluster.versions``, read from that release's ``kube_features.go``), not from the
operator's: the two were written apart, so this checks one against the other on a real API server
of whichever version the suite runs (``DRA_KUBERNETES_VERSION``)."""

from __future__ import annotations

from dra_devcluster import LocalCluster
from dra_operator.allocator import GATE_FIELDS
from tests.integration.operator.conftest import Operators


def _log_line(op_log: str) -> str:
    lines = [line for line in op_log.splitlines() if "allocating with the DRA feature gates of" in line]
    assert len(lines) == 1, op_log[-3000:]
    return lines[0]


def test_the_operator_takes_the_gates_of_the_clusters_release(
    local_cluster: LocalCluster, operators: Operators
) -> None:
    release = local_cluster.kubernetes
    op = operators.start()
    line = _log_line(op.log.read_text(errors="replace"))
    assert f"of Kubernetes {release.minor} defaults;" in line
    off = [name for name in GATE_FIELDS if not release.gate_enabled(name)]
    assert line.endswith(f"off: {', '.join(off) or 'none'}"), (line, release.version)


def test_feature_gates_change_the_releases_defaults(
    local_cluster: LocalCluster, operators: Operators
) -> None:
    release = local_cluster.kubernetes
    op = operators.start("--feature-gates=DRAPartitionableDevices=false,DRAListTypeAttributes=true")
    line = _log_line(op.log.read_text(errors="replace"))
    assert "changed by --feature-gates DRAPartitionableDevices=false,DRAListTypeAttributes=true" in line
    off = [
        name
        for name in GATE_FIELDS
        if name != "DRAListTypeAttributes"
        and (name == "DRAPartitionableDevices" or not release.gate_enabled(name))
    ]
    assert line.endswith(f"off: {', '.join(off)}"), (line, release.version)
