"""The environment of an NVIDIA claim's containers: NVIDIA_VISIBLE_DEVICES, which the NVIDIA
container runtime reads to expose the claim's GPUs and MIG devices. Pure (no I/O)."""

from __future__ import annotations

from collections.abc import Sequence

from dra_node_agent.devices import DiscoveredDevice, DiscoveredInventory, TpuWorkers
from dra_node_agent.opaqueconfig import DriverConfig


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
        workers: TpuWorkers | None,
    ) -> tuple[str, ...]:
        """The UUIDs of the claim's GPUs and MIG devices; nothing when it has none, since an empty
        NVIDIA_VISIBLE_DEVICES would hide GPUs that another driver's spec gives the container."""
        uuids = ",".join(d.uuid for d in devices if d.kind in ("gpu", "mig"))
        return (f"NVIDIA_VISIBLE_DEVICES={uuids}",) if uuids else ()
