"""GPU shares (``--consumable-shares``, NVIDIA's ConsumableShares): whole GPUs published so that
several claims may each hold a share of one (KEP-5075 consumable capacity).

A shared GPU has ``allowMultipleAllocations`` and a request policy on its ``memory`` (rounded down
to whole MiB, its step), as NVIDIA's driver publishes it:

- ``memory``: a claim consumes the whole memory unless it asks for less (``capacity.requests.memory``),
  so claims that ask for nothing still get the GPU to themselves;
- ``unlimited``: a claim consumes no memory unless it asks;
- a number N: memory as ``unlimited``, and a capacity ``shares`` of N, a claim taking one share
  unless it asks for more.

Only whole GPUs are shared. NVIDIA's driver marks MIG devices multi-allocatable too, but their
engine capacities carry no policy, and a capacity without one is consumed whole by each claim: a
MIG device serves one claim at a time there as well. Here it is published as before. Pure (no I/O).
"""

from __future__ import annotations

import dataclasses
from typing import Final

from dra_node_agent.devices import CapacityPolicy, DiscoveredDevice

MEMORY: Final = "memory"
SHARES: Final = "shares"
MEMORY_STEP: Final = 1 << 20  # 1Mi, NVIDIA's step


def shared(device: DiscoveredDevice, mode: str | int | None) -> DiscoveredDevice:
    """``device`` as published under ``mode`` (``discovery_config.consumable_shares``); unchanged
    when sharing is off or the device is not a whole GPU."""
    if mode is None or device.kind != "gpu":
        return device
    capacity = dict(device.capacity)
    policies: dict[str, CapacityPolicy] = {}
    total = capacity.get(MEMORY)
    if total is not None:
        # The API wants default and max on the step's grid; NVIDIA rounds the memory down to it.
        whole = total // MEMORY_STEP * MEMORY_STEP
        capacity[MEMORY] = whole
        by_default = whole if mode == "memory" else 0
        policies[MEMORY] = CapacityPolicy(
            default=by_default,
            minimum=MEMORY_STEP if mode == "memory" else 0,
            maximum=whole,
            step=MEMORY_STEP,
        )
        if isinstance(mode, int):
            capacity[SHARES] = mode
            policies[SHARES] = CapacityPolicy(default=1, minimum=1, maximum=mode, step=1)
    return dataclasses.replace(
        device, capacity=capacity, allow_multiple_allocations=True, capacity_policies=policies
    )
