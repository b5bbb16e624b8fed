"""The slice publisher in-process against the real API server: every served version, big pools.

The agent picks the newest version the server serves; these tests force each one (the local
server serves v1, v1beta2 and v1beta1) so the v1beta1 ``basic`` shape is checked by the real
validation, a pool of 300 devices is cut into slices the server accepts, and shared counter sets
(DRAPartitionableDevices is on in the local cluster) go in a slice of their own ahead of the
devices that consume them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from dra_api.kube import make_api_client
from dra_devcluster import LocalCluster
from dra_node_agent.publisher import SlicePublisher

from .agentproc import GPU
from .conftest import node_slices

pytestmark = pytest.mark.cluster


def devices(count: int, *, tainted: int | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "name": f"gpu-{i}",
            "attributes": {"index": {"int": i}, "productName": {"string": "NVIDIA H100 80GB HBM3"}},
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i in range(count)
    ]
    if tainted is not None:
        out[tainted]["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    return out


def counter_sets(*, memory: str = "80Gi") -> list[dict[str, Any]]:
    return [
        {
            "name": f"gpu-{i}-counter-set",
            "counters": {"memory": {"value": memory}, "multiprocessors": {"value": "132"}},
        }
        for i in range(2)
    ]


def partitions() -> list[dict[str, Any]]:
    """Three MIG-like placements per GPU, each consuming its GPU's counter set."""
    return [
        {
            "name": f"gpu-{i}-mig-{size}g-{start}",
            "attributes": {"parentIndex": {"int": i}, "profile": {"string": f"{size}g.{10 * size}gb"}},
            "capacity": {"memory": {"value": f"{10 * size}Gi"}},
            "consumesCounters": [
                {
                    "counterSet": f"gpu-{i}-counter-set",
                    "counters": {
                        "memory": {"value": f"{10 * size}Gi"},
                        "multiprocessors": {"value": str(16 * size)},
                    },
                }
            ],
        }
        for i in range(2)
        for size, start in ((1, 0), (2, 2), (4, 4))
    ]


@pytest.fixture
async def admin_api(local_cluster: LocalCluster) -> AsyncIterator[Any]:
    api = await make_api_client(kubeconfig=local_cluster.kubeconfig)
    yield api
    await api.close()


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
async def test_each_served_version_round_trips_without_rewrites(
    local_cluster: LocalCluster, admin_api: Any, node: str, version: str
) -> None:
    publisher = SlicePublisher(api=admin_api, driver=GPU, node_name=node, api_version=version)
    await publisher.publish(devices(8))
    (obj,) = node_slices(local_cluster, node)  # read back as v1 by kubectl
    assert [d["name"] for d in obj["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert obj["spec"]["devices"][3]["capacity"] == {"memory": {"value": "80Gi"}}
    assert obj["spec"]["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
    # What the server stored in this version compares equal to what was sent: nothing to write.
    plan = await publisher.sync()
    assert plan is not None
    assert plan.empty
    assert (
        node_slices(local_cluster, node)[0]["metadata"]["resourceVersion"]
        == obj["metadata"]["resourceVersion"]
    )


async def test_large_pool_is_split_and_a_change_moves_every_slice_up(
    local_cluster: LocalCluster, admin_api: Any, node: str
) -> None:
    publisher = SlicePublisher(api=admin_api, driver=GPU, node_name=node, api_version="v1")
    await publisher.publish(devices(300))
    slices = node_slices(local_cluster, node)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices} == {
        (1, 3)
    }

    # A taint lowers the per-slice limit to 64: five slices, all at generation 2.
    await publisher.publish(devices(300, tainted=7))
    slices = node_slices(local_cluster, node)
    assert sorted(len(s["spec"]["devices"]) for s in slices) == [44, 64, 64, 64, 64]
    assert {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices} == {
        (2, 5)
    }
    names = {d["name"] for s in slices for d in s["spec"]["devices"]}
    assert len(names) == 300

    # Back to an untainted pool: three slices again; the two extra ones are deleted.
    await publisher.publish(devices(300))
    slices = node_slices(local_cluster, node)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert {s["spec"]["pool"]["generation"] for s in slices} == {3}
    plan = await publisher.sync()
    assert plan is not None
    assert plan.empty


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
async def test_shared_counters_are_published_ahead_of_the_devices_consuming_them(
    local_cluster: LocalCluster, admin_api: Any, node: str, version: str
) -> None:
    publisher = SlicePublisher(api=admin_api, driver=GPU, node_name=node, api_version=version)
    await publisher.publish(partitions(), counter_sets())
    counters, devices_slice = node_slices(local_cluster, node)  # read back as v1 by kubectl
    assert counters["metadata"]["name"].endswith("-0")
    assert counters["spec"]["sharedCounters"] == counter_sets()
    assert not counters["spec"].get("devices")
    assert [d["name"] for d in devices_slice["spec"]["devices"]] == [d["name"] for d in partitions()]
    assert [d["consumesCounters"] for d in devices_slice["spec"]["devices"]] == [
        d["consumesCounters"] for d in partitions()
    ]
    assert not devices_slice["spec"].get("sharedCounters")
    pools = [s["spec"]["pool"] for s in (counters, devices_slice)]
    assert pools == [{"name": node, "generation": 1, "resourceSliceCount": 2}] * 2
    # What the server stored compares equal to what was sent: nothing to write.
    plan = await publisher.sync()
    assert plan is not None
    assert plan.empty

    # A counter value changes (a GPU's memory is partly reserved): both slices move to generation 2.
    await publisher.publish(partitions(), counter_sets(memory="40Gi"))
    counters, devices_slice = node_slices(local_cluster, node)
    assert counters["spec"]["sharedCounters"][0]["counters"]["memory"] == {"value": "40Gi"}
    assert {s["spec"]["pool"]["generation"] for s in (counters, devices_slice)} == {2}
    plan = await publisher.sync()
    assert plan is not None
    assert plan.empty

    # The health monitor republishes the devices alone (new taints): the counter sets stay.
    await publisher.publish(partitions())
    counters, _ = node_slices(local_cluster, node)
    assert counters["spec"]["sharedCounters"][0]["counters"]["memory"] == {"value": "40Gi"}
    assert counters["spec"]["pool"]["generation"] == 2
