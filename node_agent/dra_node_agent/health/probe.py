"""What a health probe is: a blocking checker the monitor runs in worker threads.

``start`` may begin a background thread that reports events as they happen (NVML's event set);
``poll`` checks every device once and returns what it saw. Both are blocking: the monitor calls
them through ``asyncio.to_thread`` and receives event observations through a thread-safe callback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dra_node_agent.devices import DiscoveredDevice
from dra_node_agent.health.metrics import Telemetry
from dra_node_agent.health.state import Observation

Emit = Callable[[Observation], None]


@dataclass(frozen=True)
class XidReport:
    """An XID delivered for ``device``; ``fatal`` False for application XIDs (not device faults)."""

    device: str
    xid: int
    fatal: bool


@dataclass
class PollResult:
    observations: list[Observation] = field(default_factory=list)
    # device -> why it could not be checked this time
    unknown: dict[str, str] = field(default_factory=dict)
    telemetry: dict[str, Telemetry] = field(default_factory=dict)


class HealthProbe(Protocol):
    @property
    def backend(self) -> str:
        """Short name for metrics and logs: ``nvml``, ``tpu-devfs``."""
        ...

    def start(
        self, *, devices: Sequence[DiscoveredDevice], emit: Emit, xid: Callable[[XidReport], None]
    ) -> None:
        """Begin watching for events (may start a thread); raises if the backend cannot be used."""
        ...

    def poll(self, *, devices: Sequence[DiscoveredDevice], now: float) -> PollResult: ...

    def stop(self) -> None:
        """Stop the event thread (returns within the probe's wait timeout) and release the backend."""
        ...


def by_name(devices: Sequence[DiscoveredDevice]) -> Mapping[str, DiscoveredDevice]:
    return {d.name: d for d in devices}
