"""Health for one driver of the running agent, in one call: probe, monitor, republishing, taint support.

``probe_for`` asks the record of the backend's vendor (``vendors.record_for``) for the probe that
fits its devices (NVML, TPU sysfs, or their simulated versions): the agent's wiring, since it knows
every vendor and the health core knows none. ``attach_health`` asks the API server whether it keeps
device taints (otherwise unhealthy devices leave the slice), starts the monitor, and starts a task
that republishes ``monitor.decorate(slice_devices())`` through the publisher after every change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_api.kube import ApiClient
from dra_node_agent import vendors
from dra_node_agent.devices import DiscoveredDevice, DiscoveryBackend
from dra_node_agent.health.monitor import HealthMonitor, HealthSettings, republish_on_change
from dra_node_agent.health.probe import HealthProbe
from dra_node_agent.health.taint_support import server_keeps_device_taints
from dra_node_agent.nvidia.health_probe import DEFAULT_IGNORED_XIDS
from dra_node_agent.publisher import SlicePublisher
from dra_node_agent.vendor_record import ProbeOptions

logger = logging.getLogger(__name__)


def probe_for(
    backend: DiscoveryBackend,
    *,
    ignored_xids: Iterable[int] = DEFAULT_IGNORED_XIDS,
    temperature_limit: float | None = None,
) -> HealthProbe | None:
    """A probe watching ``backend``'s devices; None where its vendor has none."""
    options = ProbeOptions(ignored_xids=frozenset(ignored_xids), temperature_limit=temperature_limit)
    return vendors.record_for(backend).health_probe(backend, options)


@dataclass
class DriverHealth:
    monitor: HealthMonitor
    task: asyncio.Task[None]

    def decorate(self, devices: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return self.monitor.decorate(devices)

    def set_devices(self, devices: Sequence[DiscoveredDevice]) -> None:
        self.monitor.set_devices(devices)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.monitor.stop()


async def attach_health(
    *,
    backend: DiscoveryBackend,
    devices: Sequence[DiscoveredDevice],
    slice_devices: Callable[[], Sequence[Mapping[str, Any]]],
    publisher: SlicePublisher,
    api: ApiClient,
    api_version: str,
    node_name: str,
    settings: HealthSettings | None = None,
    ignored_xids: Iterable[int] = DEFAULT_IGNORED_XIDS,
) -> DriverHealth | None:
    """Start health monitoring of ``backend``'s devices; None when no probe fits the backend."""
    probe = probe_for(backend, ignored_xids=ignored_xids)
    if probe is None:
        logger.info("no health probe for the devices of driver %s", backend.driver)
        return None
    monitor = HealthMonitor(
        driver=backend.driver, node_name=node_name, probe=probe, devices=devices, settings=settings, api=api
    )
    supported = await server_keeps_device_taints(
        api, api_version=api_version, driver=backend.driver, node_name=node_name
    )
    if supported is False:
        logger.warning(
            "the API server drops device taints (DRADeviceTaints off): unhealthy %s devices leave the "
            "ResourceSlice instead",
            backend.driver,
        )
        monitor.taints_supported = False
    await monitor.start()
    task = asyncio.create_task(
        republish_on_change(
            monitor, devices=slice_devices, publish=publisher.publish, retry=publisher.mark_dirty
        ),
        name=f"health-republish-{backend.driver}",
    )
    return DriverHealth(monitor=monitor, task=task)
