"""The compute-domain driver's client (``nvidia.cd_api``) and its readiness wait against the real
API server: domains from the watch cache, the node's domain label written with the node's
resourceVersion and never over another domain's, and a channel's wait that ends when this node's
daemon turns Ready in the domain's clique."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dra_api import computedomains as cd
from dra_api.kube import make_api_client
from dra_devcluster import LocalCluster
from dra_node_agent.device_setup import DeviceSetupError
from dra_node_agent.nvidia.cd_api import DomainApi
from dra_node_agent.nvidia.cd_discovery import ComputeDomainBackend, NodeFabric
from dra_node_agent.nvidia.cd_membership import ComputeDomainMembership

REPO = Path(__file__).resolve().parents[3]
TENANT = "cd-agent-tenant"
DAEMONS = "cd-agent-daemons"
NODE = "cd-agent-node"
CLIQUE = "6b9e5f0a-1c2d-4e3f-8a7b-9c0d1e2f3a4b.1"


@pytest.fixture
async def domain_api(local_cluster: LocalCluster) -> AsyncIterator[DomainApi]:
    local_cluster.kubectl("apply", "-k", str(REPO / "crds"))
    local_cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/computedomains.resource.nvidia.com",
        "crd/computedomaincliques.resource.nvidia.com",
        "--timeout=60s",
    )
    local_cluster.create_namespace(TENANT)
    local_cluster.create_namespace(DAEMONS)
    local_cluster.apply([{"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}])
    client = await make_api_client(kubeconfig=local_cluster.kubeconfig)
    api = DomainApi(api=client, node_name=NODE, namespace=DAEMONS, request_timeout=10.0)
    try:
        yield api
    finally:
        await api.aclose()
        await client.close()
        local_cluster.kubectl("delete", "node", NODE, "--ignore-not-found", "--wait=false", check=False)
        # No domain is left for a ComputeDomain controller of a later test to adopt.
        local_cluster.kubectl("delete", "namespace", TENANT, DAEMONS, "--ignore-not-found", check=False)


def _create_domain(cluster: LocalCluster, name: str) -> str:
    cluster.apply(
        [
            {
                "apiVersion": cd.API_VERSION,
                "kind": cd.DOMAIN_KIND,
                "metadata": {"namespace": TENANT, "name": name},
                "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}},
            }
        ]
    )
    return str(cluster.get_json("computedomain", name, "-n", TENANT)["metadata"]["uid"])


def _labels(cluster: LocalCluster) -> dict[str, Any]:
    return dict(cluster.get_json("node", NODE)["metadata"].get("labels") or {})


async def _poll(check: Any) -> None:
    async with asyncio.timeout(30):
        while not await check():  # noqa: ASYNC110 (polls the API server, which has no event here)
            await asyncio.sleep(0.2)


async def test_domains_labels_and_readiness_through_the_real_api_server(
    local_cluster: LocalCluster, domain_api: DomainApi
) -> None:
    uid = _create_domain(local_cluster, "first")
    other = _create_domain(local_cluster, "second")
    found = await domain_api.domain(uid, wait_s=30)
    assert found is not None
    assert found.namespace == TENANT
    assert await domain_api.domain("0b6a1a1e-2f4c-4d5e-8f90-123456789abc", wait_s=30) is None

    # The label: set, kept when asked to set it again, refused over another domain's, removed.
    assert await domain_api.set_node_label(cd.DOMAIN_LABEL, uid) is None
    assert _labels(local_cluster)[cd.DOMAIN_LABEL] == uid
    assert await domain_api.set_node_label(cd.DOMAIN_LABEL, uid) == uid
    with pytest.raises(ValueError, match="not ours"):
        await domain_api.set_node_label(
            cd.DOMAIN_LABEL, None, unless=lambda now: "" if now == other else "not ours"
        )
    assert _labels(local_cluster)[cd.DOMAIN_LABEL] == uid

    # A channel waits for this node's daemon in the domain's clique; it turns Ready meanwhile.
    backend = ComputeDomainBackend()
    backend.fabric = NodeFabric(clique_id=CLIQUE, channel_major=509, imex_mgmt=None)
    membership = ComputeDomainMembership(backend=backend, api=domain_api, plugins_dir=Path("/nonexistent"))
    with pytest.raises(DeviceSetupError, match="not in clique"):
        await membership.wait_ready(claim="c", domain=uid, budget_s=0.0)
    clique = {
        "apiVersion": cd.API_VERSION,
        "kind": cd.CLIQUE_KIND,
        "metadata": {
            "namespace": DAEMONS,
            "name": cd.clique_name(uid, CLIQUE),
            "labels": {cd.DOMAIN_LABEL: uid, cd.CLIQUE_LABEL: CLIQUE},
        },
        "daemons": [
            {"nodeName": NODE, "ipAddress": "10.0.0.7", "cliqueID": CLIQUE, "index": 0, "status": "NotReady"}
        ],
    }
    local_cluster.apply([clique])
    waiting = asyncio.create_task(membership.wait_ready(claim="c", domain=uid, budget_s=30.0))
    await asyncio.sleep(1.5)
    assert not waiting.done()
    clique["daemons"][0]["status"] = "Ready"
    local_cluster.kubectl("apply", "-f", "-", input=json.dumps(clique))
    await asyncio.wait_for(waiting, timeout=30)

    # Unprepare's removal leaves the label alone unless it is this domain's.
    await membership.leave(device=cd.CHANNEL_DEVICE, domain=other, others=[])
    assert _labels(local_cluster)[cd.DOMAIN_LABEL] == uid
    await membership.leave(device=cd.CHANNEL_DEVICE, domain=uid, others=[])
    assert cd.DOMAIN_LABEL not in _labels(local_cluster)

    # A deleted domain leaves the watch cache.
    local_cluster.kubectl("delete", "computedomain", "first", "-n", TENANT)

    async def gone() -> bool:
        return await domain_api.domain(uid, wait_s=5) is None

    await _poll(gone)
