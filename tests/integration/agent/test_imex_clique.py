"""IMEX daemons' places in their ComputeDomainClique against the real API server: daemons joining
at once get distinct, smallest indices; one that joins again keeps its index; a freed index is
taken by the next; a full clique refuses; status and leaving change only the daemon's own entry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dra_api import computedomains as cd
from dra_api.kube import ApiClient, make_api_client
from dra_devcluster import LocalCluster
from dra_node_agent.nvidia.imex_clique import CliqueError, CliqueMembership

REPO = Path(__file__).resolve().parents[3]
DAEMONS = "cd-clique-daemons"
DOMAIN = "0b6a1a1e-2f4c-4d5e-8f90-123456789abc"
CLIQUE = "6b9e5f0a-1c2d-4e3f-8a7b-9c0d1e2f3a4b.1"


@pytest.fixture
async def api(local_cluster: LocalCluster) -> AsyncIterator[ApiClient]:
    local_cluster.kubectl("apply", "-k", str(REPO / "crds"))
    local_cluster.kubectl(
        "wait", "--for=condition=Established", "crd/computedomaincliques.resource.nvidia.com", "--timeout=60s"
    )
    local_cluster.create_namespace(DAEMONS)
    client = await make_api_client(kubeconfig=local_cluster.kubeconfig)
    try:
        yield client
    finally:
        await client.close()
        local_cluster.kubectl("delete", "namespace", DAEMONS, "--ignore-not-found", "--wait=false")


def _member(api: ApiClient, node: str, *, max_nodes: int = 4) -> CliqueMembership:
    return CliqueMembership(
        api=api, namespace=DAEMONS, domain_uid=DOMAIN, clique_id=CLIQUE, node_name=node, max_nodes=max_nodes
    )


def _daemons(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    obj = cluster.get_json("computedomainclique", cd.clique_name(DOMAIN, CLIQUE), "-n", DAEMONS)
    return {d["nodeName"]: d for d in obj.get("daemons") or []}


async def test_daemons_take_distinct_smallest_indices_and_leave(
    local_cluster: LocalCluster, api: ApiClient
) -> None:
    nodes = ["n-a", "n-b", "n-c"]
    members = {n: _member(api, n) for n in nodes}
    indices = await asyncio.gather(*(members[n].join(ip_address=f"10.0.0.{i}") for i, n in enumerate(nodes)))
    assert sorted(indices) == [0, 1, 2]  # at once, and none taken twice
    daemons = _daemons(local_cluster)
    assert {n: d["index"] for n, d in daemons.items()} == dict(zip(nodes, indices, strict=True))
    assert {d["status"] for d in daemons.values()} == {cd.NOT_READY}
    obj = local_cluster.get_json("computedomainclique", cd.clique_name(DOMAIN, CLIQUE), "-n", DAEMONS)
    assert obj["metadata"]["labels"] == {cd.DOMAIN_LABEL: DOMAIN, cd.CLIQUE_LABEL: CLIQUE}

    # A restarted daemon (new IP) keeps its index; Ready touches its own entry only.
    b = dict(zip(nodes, indices, strict=True))["n-b"]
    assert await members["n-b"].join(ip_address="10.0.1.1") == b
    await members["n-b"].set_status(cd.READY)
    daemons = _daemons(local_cluster)
    assert daemons["n-b"]["ipAddress"] == "10.0.1.1"
    assert {n: d["status"] for n, d in daemons.items()} == {
        "n-a": "NotReady",
        "n-b": "Ready",
        "n-c": "NotReady",
    }

    # A freed index goes to the next daemon; a full clique refuses one more.
    await members["n-b"].leave()
    assert "n-b" not in _daemons(local_cluster)
    assert await _member(api, "n-d").join(ip_address="10.0.0.4") == b
    assert await _member(api, "n-e").join(ip_address="10.0.0.5") == 3
    with pytest.raises(CliqueError, match="no free index"):
        await _member(api, "n-f").join(ip_address="10.0.0.6")
    await members["n-b"].leave()  # leaving twice is nothing
    with pytest.raises(CliqueError, match="has not joined"):
        await members["n-b"].set_status(cd.READY)
