"""The local control plane shared by the tests and the demo (real kube-apiserver, etcd, controllers)."""

from dra_api.localcluster.binaries import (
    ETCD_VERSION,
    KUBERNETES_VERSION,
    Binaries,
    BinariesUnavailable,
    ensure_binaries,
)
from dra_api.localcluster.cluster import ControlPlaneError, LocalCluster, temporary_cluster

__all__ = [
    "ETCD_VERSION",
    "KUBERNETES_VERSION",
    "Binaries",
    "BinariesUnavailable",
    "ControlPlaneError",
    "LocalCluster",
    "ensure_binaries",
    "temporary_cluster",
]
