"""NVIDIA's ComputeDomain API served from this project's CRDs by the real API server: NVIDIA's own
examples apply unchanged, with NVIDIA's defaults; a spec cannot change; what the CRDs refuse is
refused before anything acts on it; status goes through its subresource only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_devcluster import LocalCluster

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "manifests" / "examples" / "compute-domains"
FIXTURES = REPO / "tests" / "fixtures" / "compute-domains"
NAMESPACE = "cd-api"


def domains_of(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "ComputeDomain"]


@pytest.fixture(scope="module")
def crds(local_cluster: LocalCluster) -> Iterator[LocalCluster]:
    local_cluster.kubectl("apply", "-k", str(REPO / "crds"))
    local_cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/computedomains.resource.nvidia.com",
        "crd/computedomaincliques.resource.nvidia.com",
        "--timeout=60s",
    )
    local_cluster.create_namespace(NAMESPACE)
    yield local_cluster
    # Gone before any ComputeDomain controller of a later test could adopt them.
    local_cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found")


def test_nvidias_examples_apply_unchanged_with_nvidias_defaults(crds: LocalCluster) -> None:
    files = [
        EXAMPLES / "nvidia-imex-channel-injection.yaml",
        EXAMPLES / "nvidia-imex-channel-injection-all.yaml",
        FIXTURES / "nvidia-nvbandwidth-test-job.yaml",
    ]
    for path in files:
        for doc in domains_of(path):
            crds.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(doc))
    single = crds.get_json("computedomain", "imex-channel-injection", "-n", NAMESPACE)
    assert single["spec"]["channel"]["allocationMode"] == "Single"  # the CRD's default
    every = crds.get_json("computedomain", "imex-channel-injection-all", "-n", NAMESPACE)
    assert every["spec"]["channel"]["allocationMode"] == "All"
    nvbandwidth = crds.get_json("computedomain", "nvbandwidth-test-compute-domain", "-n", NAMESPACE)
    assert nvbandwidth["spec"]["numNodes"] == 4
    assert "status" not in single  # written by the controller only


def test_a_spec_cannot_change(crds: LocalCluster) -> None:
    crds.apply(
        [
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "ComputeDomain",
                "metadata": {"name": "fixed", "namespace": NAMESPACE},
                "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "fixed-channel"}}},
            }
        ]
    )
    result = crds.kubectl(
        "patch",
        "computedomain",
        "fixed",
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        '{"spec":{"numNodes":2}}',
        check=False,
    )
    assert result.returncode != 0
    assert "A computeDomain.spec is immutable" in result.stderr
    # The status subresource: the main resource ignores a status, /status takes it.
    crds.kubectl(
        "patch",
        "computedomain",
        "fixed",
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        '{"status":{"status":"Ready"}}',
    )
    assert "status" not in crds.get_json("computedomain", "fixed", "-n", NAMESPACE)
    crds.kubectl(
        "patch",
        "computedomain",
        "fixed",
        "-n",
        NAMESPACE,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"status":"Ready"}}',
    )
    assert crds.get_json("computedomain", "fixed", "-n", NAMESPACE)["status"]["status"] == "Ready"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"channel": {"resourceClaimTemplate": {"name": "Not_A_Name"}}}, "should match"),
        (
            {"channel": {"allocationMode": "Some", "resourceClaimTemplate": {"name": "x"}}},
            "Unsupported value",
        ),
        (
            {"numNodes": -1, "channel": {"resourceClaimTemplate": {"name": "x"}}},
            "should be greater than or equal to 0",
        ),
        ({"numNodes": 1}, "spec.channel: Required value"),
        ({"channel": {}}, "spec.channel.resourceClaimTemplate: Required value"),
    ],
)
def test_what_the_crd_refuses(crds: LocalCluster, spec: dict[str, Any], message: str) -> None:
    body = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "refused", "namespace": NAMESPACE},
        "spec": spec,
    }
    result = crds.kubectl("create", "-f", "-", input=json.dumps(body), check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
