"""`dra-operator release-claims` against the real control plane: it lists the claims holding the
operator's finalizer and refuses (exit 1), releases those no pod uses with ``--release`` (status
cleared, finalizer removed, other finalizers kept), and refuses for a claim a pod uses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from dra_api.names import OPERATOR_FINALIZER
from dra_devcluster import LocalCluster

NS = "release-claims"
OTHER_FINALIZER = "example.com/keep"


def claim(name: str, *, finalizers: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS, "finalizers": finalizers},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
    }


def allocate(
    cluster: LocalCluster, name: str, *, device: str, reserved_for: tuple[str, str] | None = None
) -> None:
    status: dict[str, Any] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": device}
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
                ]
            },
        }
    }
    if reserved_for is not None:
        pod, uid = reserved_for
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": uid}]
    cluster.kubectl(
        "patch",
        "resourceclaim",
        name,
        "-n",
        NS,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def release_claims(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dra_operator.entry.cli",
            "release-claims",
            f"--kubeconfig={cluster.kubeconfig}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_release_claims_lists_refuses_and_releases(local_cluster: LocalCluster, tmp_path: Path) -> None:
    cluster = local_cluster
    cluster.create_namespace(NS)
    try:
        cluster.apply(
            [
                claim("held", finalizers=[OPERATOR_FINALIZER, OTHER_FINALIZER]),
                claim("pending", finalizers=[OPERATOR_FINALIZER]),
                claim("theirs", finalizers=[]),
            ]
        )
        allocate(cluster, "held", device="gpu-0")
        allocate(cluster, "theirs", device="gpu-1")

        listed = release_claims(cluster)
        assert listed.returncode == 1, listed
        assert f"{NS}/held (allocated)" in listed.stderr
        assert f"{NS}/pending (not allocated)" in listed.stderr
        assert "theirs" not in listed.stderr
        assert "uninstall.releaseClaims=true" in listed.stderr

        released = release_claims(cluster, "--release")
        assert released.returncode == 0, released.stderr
        held = cluster.get_json("resourceclaim", "held", "-n", NS)
        assert held["metadata"]["finalizers"] == [OTHER_FINALIZER]
        assert not (held.get("status") or {}).get("allocation")
        assert not cluster.get_json("resourceclaim", "pending", "-n", NS)["metadata"].get("finalizers")
        # A claim the operator did not allocate is not touched.
        assert cluster.get_json("resourceclaim", "theirs", "-n", NS)["status"]["allocation"]
        assert release_claims(cluster).returncode == 0

        # In use by a pod: refused, nothing changed.
        cluster.apply([claim("used", finalizers=[OPERATOR_FINALIZER])])
        # A pod that exists (the claim controller drops reservations of pods that do not), bound
        # to a node without a kubelet: it never runs, it only holds the claim.
        cluster.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "worker", "namespace": NS},
                    "spec": {
                        "nodeName": "no-such-node",
                        "containers": [
                            {"name": "main", "image": "none", "resources": {"claims": [{"name": "gpu"}]}}
                        ],
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": "used"}],
                    },
                }
            ]
        )
        worker = cluster.get_json("pod", "worker", "-n", NS)["metadata"]["uid"]
        allocate(cluster, "used", device="gpu-2", reserved_for=("worker", worker))
        refused = release_claims(cluster, "--release")
        assert refused.returncode == 1, refused
        assert f"{NS}/used (allocated, in use by pods/worker)" in refused.stderr
        used = cluster.get_json("resourceclaim", "used", "-n", NS)
        assert OPERATOR_FINALIZER in used["metadata"]["finalizers"]
        assert used["status"]["allocation"]
    finally:
        for name in ("held", "pending", "theirs", "used"):
            unheld = '{"metadata":{"finalizers":null}}'
            cluster.kubectl(
                "patch", "resourceclaim", name, "-n", NS, "--type=merge", "-p", unheld, check=False
            )
        cluster.kubectl("delete", "pod", "worker", "-n", NS, "--force", "--grace-period=0", check=False)
        cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=60s", check=False)


def test_release_claims_without_a_server_says_so(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "dra_operator.entry.cli", "release-claims", f"--kubeconfig={kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "dra-operator release-claims: cannot reach the API server https://127.0.0.1:9: Connection refused\n"
    )
