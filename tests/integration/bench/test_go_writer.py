"""``bench/go_writer``, the operator benchmark's compiled reference allocator, on the real API server:
it writes each new claim's precomputed allocation with a merge patch of the status, leaves the
claims past ``-allocatable`` alone, reports what it wrote, and exits when its stdin closes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import gobuild
from dra_devcluster import LocalCluster

NS = "go-writer"


@pytest.fixture(scope="module")
def go_writer() -> Path:
    # The per-user cache, built once per version of its sources: operator_allocation's smoke test
    # (test_operator_benches.py) runs the same binary.
    binary, _ = gobuild.build("go_writer")
    return binary


def _claim(name: str) -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "go-writer"}}]}},
    }


def test_go_writer_allocates_new_claims_below_the_limit(local_cluster: LocalCluster, go_writer: Path) -> None:
    local_cluster.create_namespace(NS)
    proc = subprocess.Popen(
        [
            str(go_writer),
            f"-kubeconfig={local_cluster.kubeconfig}",
            f"-namespace={NS}",
            "-allocatable=3",
            "-gpus=2",
            "-writes=2",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        for i in range(4):
            local_cluster.apply([_claim(f"c{i:04d}")])
        figures = json.loads(proc.stdout.readline())
        assert proc.poll() is None, "it stays until its stdin closes"
        proc.communicate(input="", timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        claims = json.loads(local_cluster.kubectl("get", "resourceclaims", "-n", NS, "-o", "json").stdout)
        # The allocations name devices no slice publishes: leave none behind in the shared cluster.
        local_cluster.kubectl("delete", "namespace", NS, "--timeout=120s", timeout=150)
    assert proc.returncode == 0
    assert figures["written"] == 3
    assert figures["protobuf"] is False
    allocations = {c["metadata"]["name"]: (c.get("status") or {}).get("allocation") for c in claims["items"]}
    assert allocations["c0003"] is None
    for i, (node, gpu) in enumerate([("bench-node-000", 0), ("bench-node-000", 1), ("bench-node-001", 0)]):
        allocation = allocations[f"c{i:04d}"]
        assert allocation is not None, f"c{i:04d} was not allocated"
        assert allocation["devices"]["results"] == [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": f"gpu-{gpu}"}
        ]
        terms = allocation["nodeSelector"]["nodeSelectorTerms"]
        assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]


def test_go_writer_fails_with_the_reason_when_it_cannot_reach_the_server(
    tmp_path: Path, go_writer: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "current-context: c\n"
    )
    result = subprocess.run(
        [str(go_writer), f"-kubeconfig={kubeconfig}", f"-namespace={NS}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert "go_writer: list:" in result.stderr
    assert "127.0.0.1:1" in result.stderr
