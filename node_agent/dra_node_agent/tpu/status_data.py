"""What a TPU claim's ``status.devices`` data adds to the UUID and PCI bus ID: the chip's index on
its host and, on a multi-host slice, the pod's worker ID and every worker's hostname, the identity
its TPU_WORKER_* environment carries (``container_env.multihost_worker``). Pure (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_node_agent.devices import DiscoveredDevice, DiscoveredInventory
from dra_node_agent.opaqueconfig import DriverConfig, TpuConfig
from dra_node_agent.tpu.container_env import multihost_worker
from dra_node_agent.tpu.workers import TpuWorkers


class TpuStatusData:
    """The ``device_status.VendorStatusData`` of TPU drivers."""

    def device_data(self, device: DiscoveredDevice, *, inventory: DiscoveredInventory) -> Mapping[str, Any]:
        index = device.attributes.get("index")
        return {"index": index.value} if index is not None else {}

    def claim_data(
        self,
        devices: Sequence[DiscoveredDevice],
        *,
        inventory: DiscoveredInventory,
        config: DriverConfig | None,
        context: TpuWorkers | None,
    ) -> Mapping[str, Any]:
        host = inventory.tpu_host
        if host is None:
            return {}
        identity = multihost_worker(
            host=host,
            chips=len(devices),
            config=config if isinstance(config, TpuConfig) else None,
            workers=context,
        )
        if identity is None:
            return {}
        worker_id, hostnames = identity
        out: dict[str, Any] = {"workerId": worker_id}
        if hostnames:
            out["workerHostnames"] = list(hostnames)
        return out
