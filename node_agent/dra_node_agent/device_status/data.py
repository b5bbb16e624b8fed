"""``status.devices[].data``: what helps a prepared device's workload and its owner find it.

Every device gets what discovery knows of any device: its ``uuid`` (a dynamic MIG device's once
prepare created its instance), the ``parentUUID`` of a MIG device's GPU and the ``pciBusID``. The
vendor adds its own through ``VendorStatusData`` (``tpu.status_data``: the chip index, and the
worker identity of a multi-host slice), picked by the agent's wiring as ``cdi.VendorEnv`` is, so
this core knows no vendor. The API keeps at most 10 KiB of JSON per entry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol, TypeVar

from dra_node_agent.checkpoint import CheckpointedDevice
from dra_node_agent.devices import DiscoveredDevice, DiscoveredInventory
from dra_node_agent.opaqueconfig import DriverConfig

MAX_DATA_BYTES: Final = 10 * 1024

# The vendor's context of a claim (``claim_context``), which only its own data reads.
Context = TypeVar("Context", contravariant=True)


class VendorStatusData(Protocol[Context]):
    """What a vendor adds to the data of its prepared devices (pure, no I/O)."""

    def device_data(self, device: DiscoveredDevice, *, inventory: DiscoveredInventory) -> Mapping[str, Any]:
        """Fields of one device."""

    def claim_data(
        self,
        devices: Sequence[DiscoveredDevice],
        *,
        inventory: DiscoveredInventory,
        config: DriverConfig | None,
        context: Context | None,
    ) -> Mapping[str, Any]:
        """Fields every device of the claim gets; ``config`` and ``context`` as prepare had them
        (None after an agent restart, when only the checkpoint is left)."""


def _size(data: Mapping[str, Any]) -> int:
    return len(json.dumps(data, sort_keys=True).encode())


def bounded(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` within the API's limit: list fields (a big slice's hostnames) go first, then all."""
    out = dict(data)
    if _size(out) <= MAX_DATA_BYTES:
        return out
    out = {k: v for k, v in out.items() if not isinstance(v, list | dict)}
    return out if _size(out) <= MAX_DATA_BYTES else {}


def claim_device_data(
    prepared: Sequence[CheckpointedDevice],
    *,
    devices: Mapping[str, DiscoveredDevice],
    inventory: DiscoveredInventory,
    vendor: VendorStatusData[Any] | None,
    config: DriverConfig | None = None,
    context: Any = None,
) -> dict[str, dict[str, Any]]:
    """The data of each prepared device of one claim, by device name. ``devices`` are the devices as
    prepare set them up (or as discovery has them now); one it lacks gets what the checkpoint says."""
    known = [devices[p.device] for p in prepared if p.device in devices]
    shared: Mapping[str, Any] = {}
    if vendor is not None and known:
        shared = vendor.claim_data(known, inventory=inventory, config=config, context=context)
    out: dict[str, dict[str, Any]] = {}
    for p in prepared:
        device = devices.get(p.device)
        data: dict[str, Any] = {}
        uuid = p.mig_uuid or (device.uuid if device is not None else "")
        if uuid:
            data["uuid"] = uuid
        if device is not None:
            if device.parent_uuid:
                data["parentUUID"] = device.parent_uuid
            if device.pci_bus_id:
                data["pciBusID"] = device.pci_bus_id
            if vendor is not None:
                data.update(vendor.device_data(device, inventory=inventory))
        data.update(shared)
        out[p.device] = bounded(data)
    return out
