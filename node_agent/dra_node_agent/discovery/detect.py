"""Choosing the discovery backends for this node: explicit, simulated, or auto-detected.

Every vendor's record (``vendors``) says which of its backends run here: with simulated profiles
only the simulated record's do; otherwise each hardware record's backend runs when it is named in
``backends`` or, with "auto", when its hardware is found (NVIDIA when NVML initialises, TPUs when
any PCI device is a Google TPU).
"""

from __future__ import annotations

import asyncio
import logging

from dra_node_agent import vendors
from dra_node_agent.devices import DiscoveryBackend
from dra_node_agent.discovery_config import DiscoveryConfig

log = logging.getLogger(__name__)


def select_backends_sync(config: DiscoveryConfig) -> list[DiscoveryBackend]:
    """The backends to run on this node (blocking: probes NVML and sysfs)."""
    if config.simulated_profiles:
        return list(vendors.SIMULATED.backends(config))
    backends: list[DiscoveryBackend] = [b for record in vendors.HARDWARE for b in record.backends(config)]
    if not backends:
        log.info("no accelerator found on this node; no devices will be published")
    return backends


async def select_backends(config: DiscoveryConfig) -> list[DiscoveryBackend]:
    return await asyncio.to_thread(select_backends_sync, config)
