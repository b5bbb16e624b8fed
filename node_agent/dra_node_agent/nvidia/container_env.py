"""The environment of an NVIDIA claim's containers: ``NVIDIA_VISIBLE_DEVICES=void``, as NVIDIA's
generated CDI specs set it. The spec itself gives the container its GPUs (device nodes) and the
driver's files (``driver_files``); ``void`` tells an NVIDIA container runtime that still reads the
variable to add nothing, and overrides whatever the pod set, ``all`` included. Pure (no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from dra_node_agent.devices import DiscoveredDevice, DiscoveredInventory
from dra_node_agent.opaqueconfig import DriverConfig

VISIBLE_DEVICES_VOID: Final = "NVIDIA_VISIBLE_DEVICES=void"


class NvidiaEnv:
    """The CDI writer's ``VendorEnv`` for NVIDIA drivers."""

    def device_env(
        self, device: DiscoveredDevice, *, claim_uid: str, inventory: DiscoveredInventory
    ) -> tuple[str, ...]:
        return ()

    def claim_env(
        self,
        devices: Sequence[DiscoveredDevice],
        *,
        inventory: DiscoveredInventory,
        node_name: str | None,
        config: DriverConfig | None,
        context: object,
    ) -> tuple[str, ...]:
        """``void`` for a claim with GPUs, MIG devices or GPUs for passthrough (NVIDIA's VFIO specs
        set it too); nothing for one without, which leaves the variable to whatever else gives the
        container its devices."""
        return (VISIBLE_DEVICES_VOID,) if any(d.kind in ("gpu", "mig", "vfio") for d in devices) else ()
