"""O5 for the node agent: its connections to the API server stall silently (reliability-scenarios B4).

The agent's API traffic goes through :class:`FaultProxy`; a :class:`Blackhole` holds every request
and stalls every open stream (its slice watch) without an error or an end. The kubelet's side is the
test kubelet client over the agent's real sockets. A prepare during the stall must not hang: the
claim read times out, is retried, and completes once the stall ends; a slice deleted during the
stall is published again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_api.kubeletapi.model import ClaimRef
from dra_devcluster import LocalCluster
from dra_devcluster.faultproxy import Blackhole, FaultProxy
from dra_devcluster.kubelet import KubeletPluginClient

from .agentproc import GPU, AgentDirs, AgentProcess
from .conftest import apply_in, gpu_pod, node_slices, wait_allocated_claim, wait_slices

pytestmark = pytest.mark.cluster


async def _until(predicate: Callable[[], Any], *, limit_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.3)


async def test_prepare_and_slices_survive_a_silent_api_stall(
    local_cluster: LocalCluster,
    agent_credentials: Path,
    node: str,
    dirs: AgentDirs,
    namespace: str,
    device_classes: tuple[str, str],
) -> None:
    with FaultProxy(local_cluster) as proxy:
        agent = AgentProcess(node=node, dirs=dirs, kubeconfig=proxy.kubeconfig_via(agent_credentials))
        try:
            agent.start()
            before = wait_slices(local_cluster, node)
            apply_in(local_cluster, namespace, gpu_pod(name="work", node=node))
            claim = wait_allocated_claim(local_cluster, namespace, "work")
            meta = claim["metadata"]
            ref = ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])

            # Everything the agent sends or has open stalls: the claim GET, the slice watch, lists.
            stall = proxy.blackhole(Blackhole(watch=None))
            local_cluster.kubectl("delete", "resourceslice", before[0]["metadata"]["name"])
            async with await KubeletPluginClient.register_driver(agent.dirs.registry, driver=GPU) as kubelet:
                prepare = asyncio.create_task(kubelet.prepare([ref]))
                # The first read ran into its deadline and is retried, instead of hanging.
                retried = f"reading ResourceClaim {ref.namespace}/{ref.name} (uid {ref.uid}) failed"
                await _until(
                    lambda: retried in agent.log_text() and "attempt 1 of 3" in agent.log_text(),
                    limit_s=120,
                    what="the agent to time out its claim read and retry",
                )
                # The retry is held as well (with whatever else the agent sent).
                await _until(lambda: stall.held >= 2, limit_s=60, what="the retried read held")
                assert not prepare.done()
                proxy.lift(stall)
                result = (await prepare)[ref.uid]
            assert result.error == "", result.error
            assert len(result.devices) == 1, result.devices

            # The slice deleted during the stall is published again (a new object).
            after = wait_slices(local_cluster, node, timeout=120)
            assert after[0]["metadata"]["uid"] != before[0]["metadata"]["uid"]
            assert [d["name"] for d in after[0]["spec"]["devices"]] == [
                d["name"] for d in before[0]["spec"]["devices"]
            ]
            assert node_slices(local_cluster, node)  # and it stays
            assert agent.process is not None
            assert agent.process.poll() is None, agent.log_tail()
        finally:
            agent.kill()
            print(f"agent log ({agent.log_path}):\n{agent.log_tail(200)}")
