"""A removed real node leaves nothing on the machine: no mount (the kubelet bind-mounts its root
dir onto itself, pod volumes are tmpfs mounts), no containerd store, no short temporary folder;
its logs are kept in the cluster's workdir."""

from __future__ import annotations

import pytest

from dra_devcluster import LocalCluster
from dra_devcluster.images import WORKLOAD_IMAGE

pytestmark = pytest.mark.cluster

NODE = "cleanup-1"
NAMESPACE = "node-cleanup"


def test_a_removed_node_leaves_no_mount_and_no_folder(local_cluster: LocalCluster) -> None:
    cluster = local_cluster
    node = cluster.add_real_node(NODE)
    cluster.kubectl("create", "namespace", NAMESPACE)
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sleeper", "namespace": NAMESPACE},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE},
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": WORKLOAD_IMAGE, "command": ["sleep", "3600"]}],
            },
        }
        cluster.apply([pod])
        cluster.kubectl("wait", "--for=condition=Ready", "pod/sleeper", "-n", NAMESPACE, "--timeout=120s")
        mounted = node.mounts()
        # The kubelet's root dir and the pod's ServiceAccount token volume, at least.
        assert any(p.endswith("/kubelet") for p in mounted), mounted
        assert any("kube-api-access" in p for p in mounted), mounted
        short_root = node.root.parent != cluster.workdir / "nodes"
    finally:
        cluster.remove_real_node(NODE)
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found", check=False)
    assert node.mounts() == []
    assert not (node.root / "containerd").exists()
    kept = cluster.workdir / "nodes" / NODE
    assert (kept / "logs" / "kubelet.log").is_file()
    assert not kept.is_symlink()
    if short_root:
        assert not node.root.exists()
    else:
        assert node.root == kept
