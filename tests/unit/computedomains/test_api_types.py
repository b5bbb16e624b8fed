"""NVIDIA's ComputeDomain API as both programs read it: what a tenant may write, bounded."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_api import computedomains as cd

UID = "0f5e0c1a-2b3c-4d5e-8f90-a1b2c3d4e5f6"


def domain(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": cd.API_VERSION,
        "kind": cd.DOMAIN_KIND,
        "metadata": {"namespace": "team-a", "name": "job", "uid": UID, "resourceVersion": "7"},
        "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "job-channel"}}},
    }
    body["spec"].update(spec)
    return body


def test_a_domain_as_nvidia_writes_it() -> None:
    parsed = cd.ComputeDomain.from_json(domain())
    assert (parsed.key, parsed.uid, parsed.num_nodes) == ("team-a/job", UID, 2)
    assert parsed.template_name == "job-channel"
    assert parsed.allocation_mode == cd.SINGLE  # NVIDIA's default
    assert parsed.status == cd.NOT_READY  # no status yet: NotReady, as the CRD's default
    assert not parsed.deleting
    assert parsed.involved()["kind"] == "ComputeDomain"


def test_status_nodes_are_read_in_both_shapes() -> None:
    obj = domain()
    obj["status"] = {
        "status": "Ready",
        "nodes": [{"name": "n1", "ipAddress": "10.0.0.1", "cliqueID": "", "index": -1, "status": "Ready"}],
    }
    parsed = cd.ComputeDomain.from_json(obj)
    assert parsed.node("n1") == cd.DomainNode("n1", "10.0.0.1", "", -1, cd.READY)
    clique = cd.Clique.from_json(
        {
            "metadata": {
                "namespace": "accel-dra",
                "name": f"{UID}.x",
                "labels": {cd.DOMAIN_LABEL: UID, cd.CLIQUE_LABEL: "x"},
            },
            "daemons": [{"nodeName": "n2", "ipAddress": "10.0.0.2", "cliqueID": "x", "index": 0}],
        }
    )
    assert clique.domain_uid == UID
    assert clique.daemons[0].status == cd.NOT_READY  # the CRD's default
    assert clique.daemons[0].to_clique_json()["nodeName"] == "n2"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"channel": {"resourceClaimTemplate": {"name": "Bad_Name"}}}, "is not a DNS subdomain"),
        ({"channel": {"resourceClaimTemplate": {"name": "a" * 300}}}, "is not a DNS subdomain"),
        ({"channel": {"resourceClaimTemplate": {}}}, "resourceClaimTemplate.name: must be a string"),
        (
            {"channel": {"allocationMode": "Many", "resourceClaimTemplate": {"name": "x"}}},
            "is not Single or All",
        ),
        ({"numNodes": -1}, "spec.numNodes -1 is out of range"),
        ({"numNodes": 10**9}, "out of range"),
        ({"numNodes": True}, "spec.numNodes: must be an integer"),
        ({"channel": "x"}, "spec.channel: must be an object"),
    ],
)
def test_what_a_tenant_gets_wrong_is_named(change: dict[str, Any], message: str) -> None:
    with pytest.raises(cd.DomainError, match=message) as caught:
        cd.ComputeDomain.from_json(domain(**change))
    assert "ComputeDomain team-a/job" in str(caught.value)


def test_a_status_longer_than_read_is_refused() -> None:
    obj = domain()
    obj["status"] = {"nodes": [{"name": f"n{i}", "ipAddress": "", "cliqueID": ""} for i in range(5000)]}
    with pytest.raises(cd.DomainError, match="more than the 4096 read"):
        cd.ComputeDomain.from_json(obj)


def test_a_uid_that_is_no_uid_is_refused() -> None:
    obj = copy.deepcopy(domain())
    obj["metadata"]["uid"] = "/".join(("..", "..", "etc"))  # a path climbing out of a folder
    with pytest.raises(cd.DomainError, match="is not a UID"):
        cd.ComputeDomain.from_json(obj)


@pytest.mark.parametrize(
    ("nodes", "num_nodes", "expected"),
    [
        ((), 0, cd.READY),  # NVIDIA's rule: nothing asked, nothing NotReady
        ((), 1, cd.NOT_READY),
        ((cd.DomainNode("a", "", "", 0, cd.READY),), 1, cd.READY),
        (
            (cd.DomainNode("a", "", "", 0, cd.READY), cd.DomainNode("b", "", "", 1, cd.NOT_READY)),
            1,
            cd.NOT_READY,
        ),
    ],
)
def test_global_status(nodes: tuple[cd.DomainNode, ...], num_nodes: int, expected: str) -> None:
    assert cd.global_status(num_nodes=num_nodes, nodes=nodes) == expected


def test_names() -> None:
    assert cd.daemon_name(UID) == f"computedomain-daemon-{UID}"
    assert len(cd.daemon_name(UID)) <= 63
    assert cd.clique_name(UID, "c.1") == f"{UID}.c.1"
    assert cd.is_clique_id("6b9e5f0a-1c2d-4e3f-8a7b-9c0d1e2f3a4b.1")
    assert not cd.is_clique_id("")
