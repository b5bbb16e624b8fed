"""Dynamic MIG on an API server that drops counters (security review L9): where the
DRAPartitionableDevices gate is off (the default of Kubernetes 1.34), the server stores slices
without ``sharedCounters`` and devices without ``consumesCounters``. Published so, overlapping MIG
placements would each look free to the scheduler; the agent withdraws every device that consumes
counters instead, and says why in its log. Devices that consume only a guard (a GPU's CUDA and
passthrough devices, kept apart by a counter of their own) stay, without it.

A control plane of its own, with that one gate off, against the real validation.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_api.kube import make_api_client
from dra_devcluster import LocalCluster, resolve_kubernetes_version
from dra_node_agent.publisher import SlicePublisher

from .agentproc import GPU
from .conftest import node_slices
from .test_publisher_versions import counter_sets, devices, partitions

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def gate_off_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    kubernetes = resolve_kubernetes_version()
    gates = {**kubernetes.feature_gates, "DRAPartitionableDevices": False}
    cluster = LocalCluster(
        workdir=Path(tmp_path_factory.mktemp("gate-off")), kubernetes=kubernetes, feature_gates=gates
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def admin_api(gate_off_cluster: LocalCluster) -> AsyncIterator[Any]:
    api = await make_api_client(kubeconfig=gate_off_cluster.kubeconfig)
    yield api
    await api.close()


async def test_placements_are_withdrawn_when_the_server_drops_counters(
    gate_off_cluster: LocalCluster, admin_api: Any, caplog: pytest.LogCaptureFixture
) -> None:
    node = "counters-off"
    gate_off_cluster.add_node(node)
    publisher = SlicePublisher(api=admin_api, driver=GPU, node_name=node, api_version="v1")
    caplog.set_level(logging.ERROR, logger="dra_node_agent.publisher")
    await publisher.publish([*devices(2), *partitions()], counter_sets())
    assert publisher.counters_refused
    assert "dropped the shared counters of driver gpu.nvidia.com" in caplog.text
    # The pass the refusal asked for: only the devices that consume nothing are left.
    await publisher.sync()
    slices = node_slices(gate_off_cluster, node)
    published = sorted(d["name"] for s in slices for d in s["spec"].get("devices") or [])
    assert published == ["gpu-0", "gpu-1"]
    assert not [s for s in slices if s["spec"].get("sharedCounters")]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    # Later passes (the health monitor republishing, say) keep them out.
    await publisher.publish([*devices(2), *partitions()], counter_sets())
    assert sorted(
        d["name"] for s in node_slices(gate_off_cluster, node) for d in s["spec"].get("devices") or []
    ) == [
        "gpu-0",
        "gpu-1",
    ]


async def test_devices_that_consume_only_a_guard_stay_published_without_it(
    gate_off_cluster: LocalCluster, admin_api: Any
) -> None:
    node = "guards-off"
    gate_off_cluster.add_node(node)
    guard: dict[str, Any] = {"name": "gpu-vfio-0-counter-set", "counters": {"whole-gpu": {"value": "1"}}}
    uses = [{"counterSet": guard["name"], "counters": {"whole-gpu": {"value": "1"}}}]
    gpu, vfio = devices(1)[0], {"name": "gpu-vfio-0", "attributes": {"type": {"string": "vfio"}}}
    publisher = SlicePublisher(api=admin_api, driver=GPU, node_name=node, api_version="v1")
    await publisher.publish(
        [{**gpu, "consumesCounters": uses}, {**vfio, "consumesCounters": uses}, *partitions()],
        [guard, *counter_sets()],
        guards=[guard["name"]],
    )
    assert publisher.counters_refused
    await publisher.sync()
    slices = node_slices(gate_off_cluster, node)
    published = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
    # The MIG placements are withdrawn; the guarded pair stays, with nothing left to consume.
    assert sorted(published) == ["gpu-0", "gpu-vfio-0"]
    assert not [d for d in published.values() if d.get("consumesCounters")]
    assert not [s for s in slices if s["spec"].get("sharedCounters")]
