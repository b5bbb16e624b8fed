"""A large cluster, the short version (issue 31): behaviour at a couple of hundred nodes, not time.

:mod:`bench.scale` measures the operator on 1,000 and 5,000 nodes; this runs its parts on 200
Node objects (no kubelets) whose ResourceSlices the agent's own simulated discovery and publisher
wrote, with two operator instances. Claims are allocated, the active instance is SIGKILLed while
claims keep arriving, and the new active instance must then:

- have allocated every claim exactly once (one "allocated" line over both instances' logs), no
  device in two claims;
- count, in its metrics (computed from its model), the devices and allocations the API shows;
- fill the cluster: a whole-node claim for every node the API shows free, single GPUs for the rest,
  until every device is allocated and the extra claims wait. A device its model took for free while
  held would be double-booked; one it took for held while free would leave a claim waiting.

The run has its own driver, classes, namespaces and node names, and removes all of them at the end
(the session's cluster is shared). The times it prints are not asserted.
"""

from __future__ import annotations

from pathlib import Path

from bench.scale import Scale, ScaleConfig, model_mismatches
from dra_api.kube import make_api_client
from dra_devcluster import LocalCluster
from tests.integration.operator.conftest import INDEX_DISAGREES

NODES = 200
CLAIMS_BEFORE = 300
GPUS_PER_NODE = 8


async def test_a_takeover_on_200_nodes_keeps_every_claim_once_and_the_model_true(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    config = ScaleConfig(
        nodes=NODES,
        node_prefix="op-scale",
        namespace_prefix="op-scale",
        driver="scale.gpu.example.com",
        gpu_class="op-scale-gpu",
        tpu_class="op-scale-tpu",
        verify_index=True,
        timeout_s=300.0,
    )
    api = await make_api_client(kubeconfig=local_cluster.kubeconfig)
    scale = Scale(cluster=local_cluster, api=api, config=config, workdir=tmp_path)
    try:
        scale.install_peering()
        done = await scale.populate()
        assert (done.nodes, done.slices, done.devices) == (NODES, NODES, NODES * GPUS_PER_NODE)
        slices = await scale.slices()
        uuids = {d["attributes"]["uuid"]["string"] for s in slices for d in s["spec"]["devices"]}
        assert len(uuids) == NODES * GPUS_PER_NODE, "every simulated GPU has a UUID of its own"
        assert all(s["metadata"]["ownerReferences"][0]["kind"] == "Node" for s in slices)

        first = scale.start_operator("op-scale-a", priority=2_000_000)
        assert await scale.active() is first
        ns = await scale.namespace("before")
        names = [f"b{i:04d}" for i in range(CLAIMS_BEFORE)]
        await scale.create_claims(ns, names)
        scale.check_once(ns, names, await scale.wait_allocated(ns, names))

        result = await scale.takeover()
        print(
            f"takeover on {NODES} nodes: {result.takeover_s:.2f} s to the first allocation, active after "
            f"{result.active_after_s or 0:.2f} s (the standby listed at its start, in "
            f"{result.list_s or 0:.2f} s); "
            f"{len(result.claims)} claims fed"
        )
        assert len(result.claims) >= 4
        assert not scale.report.problems, scale.report.problems
        second = await scale.active()
        assert second is not first
        assert await model_mismatches(second, scale.custom, driver=config.driver, devices=scale.devices) == []

        await scale.fill(second)
        assert not scale.report.problems, scale.report.problems
        assert await model_mismatches(second, scale.custom, driver=config.driver, devices=scale.devices) == []
        disagreements = [
            line
            for inst in scale.instances
            for line in inst.log.read_text(errors="replace").splitlines()
            if INDEX_DISAGREES in line
        ]
        assert not disagreements, disagreements[:5]
    finally:
        try:
            await scale.clean_up()
        finally:
            await api.close()
