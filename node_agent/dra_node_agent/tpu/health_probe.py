"""TPU health: each chip's PCI function in sysfs and its device nodes in /dev, checked on every poll.

TPUs report no health events a node agent can watch without a running workload, so presence is
what there is (Google's TPU driver checks the device file every 10 s the same way).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from dra_node_agent.devices import DiscoveredDevice
from dra_node_agent.health.probe import Emit, PollResult, XidReport
from dra_node_agent.health.state import Observation, ProblemKind


class TpuHealthProbe:
    """Polls presence under ``sysfs_root`` and ``dev_root`` (the host's trees as the agent sees them)."""

    def __init__(self, *, sysfs_root: str | Path = "/sys", dev_root: str | Path = "/dev") -> None:
        self._sysfs_root = Path(sysfs_root)
        self._dev_root = Path(dev_root)

    @property
    def backend(self) -> str:
        return "tpu-devfs"

    def start(
        self, *, devices: Sequence[DiscoveredDevice], emit: Emit, xid: Callable[[XidReport], None]
    ) -> None:
        del devices, emit, xid  # nothing to watch between polls

    def stop(self) -> None:
        return None

    def poll(self, *, devices: Sequence[DiscoveredDevice], now: float) -> PollResult:
        result = PollResult()
        for device in devices:
            missing: list[Observation] = []
            if (
                device.pci_bus_id
                and not (self._sysfs_root / "bus" / "pci" / "devices" / device.pci_bus_id).exists()
            ):
                missing.append(
                    Observation(
                        device=device.name,
                        time=now,
                        kind=ProblemKind.UNHEALTHY,
                        value="pci-device-missing",
                        message=f"PCI device {device.pci_bus_id} of {device.name} is gone",
                    )
                )
            for node in device.edits.device_nodes:
                relative = node.path.removeprefix("/dev/")
                if not (self._dev_root / relative).exists():
                    missing.append(
                        Observation(
                            device=device.name,
                            time=now,
                            kind=ProblemKind.UNHEALTHY,
                            value="device-node-missing",
                            message=f"TPU device file {node.path} of {device.name} is missing",
                        )
                    )
            result.observations.extend(missing or [Observation(device=device.name, time=now)])
        return result
