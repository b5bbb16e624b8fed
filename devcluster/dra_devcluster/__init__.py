"""The local cluster shared by the tests, the benchmarks and the demo: a real control plane
(kube-apiserver, etcd, controller-manager, scheduler) and real nodes (kubelet + containerd)."""

from dra_devcluster.binaries import (
    ETCD_VERSION,
    KUBERNETES_VERSION,
    Binaries,
    BinariesUnavailable,
    NodeUnavailable,
    ensure_binaries,
    ensure_node_binaries,
)
from dra_devcluster.cluster import ControlPlaneError, LocalCluster, temporary_cluster
from dra_devcluster.node import NodeStartError, RealNode

__all__ = [
    "ETCD_VERSION",
    "KUBERNETES_VERSION",
    "Binaries",
    "BinariesUnavailable",
    "ControlPlaneError",
    "LocalCluster",
    "NodeStartError",
    "NodeUnavailable",
    "RealNode",
    "ensure_binaries",
    "ensure_node_binaries",
    "temporary_cluster",
]
