"""The health stream on the DRA socket, in both versions (v1, v1alpha1), read the way kubelet reads
it."""

from __future__ import annotations

import asyncio

import pytest

from dra_api.kubeletapi.model import HealthVersion
from dra_devcluster.kubelet import HealthStreamEnded, KubeletPluginClient, PluginCallError
from dra_node_agent.plugin import DeviceHealth, HealthStatus, RunningPlugin

from .drivers import QueueHealth

HEALTHY = [
    DeviceHealth(pool="node-a", device="gpu-0", health=HealthStatus.HEALTHY, last_updated=1_700_000_000),
    DeviceHealth(pool="node-a", device="gpu-1", health=HealthStatus.HEALTHY, last_updated=1_700_000_000),
]
ONE_LOST = [
    DeviceHealth(pool="node-a", device="gpu-0", health=HealthStatus.HEALTHY, last_updated=1_700_000_030),
    DeviceHealth(
        pool="node-a",
        device="gpu-1",
        health=HealthStatus.UNHEALTHY,
        last_updated=1_700_000_030,
        health_check_timeout=90,
        message="XID 79: GPU has fallen off the bus",
    ),
]


@pytest.fixture(params=["v1", "v1alpha1"])
def version(request: pytest.FixtureRequest) -> HealthVersion:
    """The service the stream is opened on: each test runs against both."""
    chosen: HealthVersion = request.param
    return chosen


async def test_stream_delivers_each_complete_report(
    kubelet: KubeletPluginClient, health: QueueHealth, version: HealthVersion
) -> None:
    async with kubelet.watch_health(version=version) as stream:
        await health.wait_for_streams(1)
        health.publish(HEALTHY)
        first = await stream.next(idle_timeout=10)
        health.publish(ONE_LOST)
        second = await stream.next(idle_timeout=10)

    assert first == HEALTHY
    assert second == ONE_LOST


async def test_each_kubelet_stream_gets_its_own_watch(
    kubelet: KubeletPluginClient, health: QueueHealth, version: HealthVersion
) -> None:
    async with kubelet.watch_health(version=version) as one, kubelet.watch_health(version=version) as two:
        await health.wait_for_streams(2)
        health.publish([DeviceHealth(pool="p", device="d", health=HealthStatus.UNKNOWN, last_updated=5)])
        assert await one.next(idle_timeout=10) == await two.next(idle_timeout=10)


async def test_health_reports_iterates_until_the_plugin_stops(
    kubelet: KubeletPluginClient, health: QueueHealth, plugin: RunningPlugin
) -> None:
    async def first_report() -> None:
        await health.wait_for_streams(1)
        health.publish(HEALTHY)

    feeder = asyncio.create_task(first_report())
    received: list[list[DeviceHealth]] = []
    async for report in kubelet.health_reports(idle_timeout=10):
        received.append(report)
        if len(received) == 1:
            health.publish(ONE_LOST)
        else:
            # The stream must end promptly on stop, although the source has nothing more to say.
            await plugin.stop(grace=30)
    await feeder

    assert received == [HEALTHY, ONE_LOST]


async def test_stop_ends_open_streams_and_closes_the_source(
    kubelet: KubeletPluginClient, health: QueueHealth, plugin: RunningPlugin, version: HealthVersion
) -> None:
    async with kubelet.watch_health(version=version) as stream:
        await health.wait_for_streams(1)
        health.publish(HEALTHY)
        assert await stream.next(idle_timeout=10) == HEALTHY
        # A long grace period: stop must still not wait for the quiet health stream.
        await plugin.stop(grace=600)
        ended = await stream.next(idle_timeout=10)

    assert isinstance(ended, HealthStreamEnded)
    assert health.open_streams == 0
    assert health.closed == 1


async def test_a_failing_source_ends_the_stream_with_unavailable(
    kubelet: KubeletPluginClient, health: QueueHealth, version: HealthVersion
) -> None:
    async with kubelet.watch_health(version=version) as stream:
        await health.wait_for_streams(1)
        health.publish(RuntimeError("NVML event set broke"))
        ended = await stream.next(idle_timeout=10)

    assert ended == HealthStreamEnded(
        code="UNAVAILABLE", details="health source failed: NVML event set broke"
    )


async def test_a_kubelet_that_goes_away_closes_the_source(
    kubelet: KubeletPluginClient, health: QueueHealth, version: HealthVersion
) -> None:
    async with kubelet.watch_health(version=version) as stream:
        await health.wait_for_streams(1)
        health.publish(HEALTHY)
        assert await stream.next(idle_timeout=10) == HEALTHY
    # Cancelling the call ends the server side, which closes the source's generator.
    async with health.watchers:
        await health.watchers.wait_for(lambda: health.open_streams == 0)
    assert health.closed == 1


async def test_a_silent_plugin_trips_the_idle_timeout(
    kubelet: KubeletPluginClient, health: QueueHealth, version: HealthVersion
) -> None:
    async with kubelet.watch_health(version=version) as stream:
        await health.wait_for_streams(1)
        with pytest.raises(PluginCallError, match=r"no report within 0\.2 s"):
            await stream.next(idle_timeout=0.2)
