"""The local cluster shared by the tests, the benchmarks and the demo: a real control plane
(kube-apiserver, etcd, controller-manager, scheduler) and real nodes (kubelet + containerd)."""

from dra_devcluster.binaries import (
    Binaries,
    BinariesUnavailable,
    NodeUnavailable,
    ensure_binaries,
    ensure_node_binaries,
)
from dra_devcluster.cluster import ControlPlaneError, LocalCluster, temporary_cluster
from dra_devcluster.node import NodeStartError, RealNode
from dra_devcluster.versions import KubernetesVersion, UnsupportedVersion
from dra_devcluster.versions import resolve as resolve_kubernetes_version

__all__ = [
    "Binaries",
    "BinariesUnavailable",
    "ControlPlaneError",
    "KubernetesVersion",
    "LocalCluster",
    "NodeStartError",
    "NodeUnavailable",
    "RealNode",
    "UnsupportedVersion",
    "ensure_binaries",
    "ensure_node_binaries",
    "resolve_kubernetes_version",
    "temporary_cluster",
]
