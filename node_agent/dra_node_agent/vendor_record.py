"""What one vendor brings to the drivers of this node: the record the agent's wiring reads.

A ``VendorRecord`` says, for the backends of one vendor, everything the vendor-neutral core gets
from that vendor: which discovery backends run on this node, the health probe of their devices,
the tools that set their devices up at prepare (time slices, MPS daemons, dynamic MIG instances,
passthrough),
the environment the vendor adds to a claim's CDI spec, the data it adds to a claim's device status,
and what it learns about a claim at prepare (its ``claim_context``). Each vendor package defines
its own (``nvidia.record``, ``tpu.record``, ``simulated.record``); the wiring (``vendors``) lists
them and reads the one a backend names (``DiscoveryBackend.vendor``). A new vendor is a new record
and one entry in that list, not one more branch in each wiring module.

A record's parts take the backend that found the devices; a part a vendor leaves out gives None
(no such tool: a config asking for it is refused, no probe: no health reports). Every part may
block (it may build simulated hardware, look for the driver's tools or probe NVML): the agent
calls them in a thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from dra_node_agent.cdi import VendorEnv
from dra_node_agent.claim_context import ClaimContextSource
from dra_node_agent.device_setup import (
    DomainMembership,
    MigInstances,
    MpsControl,
    MpsOptions,
    Passthrough,
    TimeSlicing,
)
from dra_node_agent.device_status import VendorStatusData
from dra_node_agent.devices import DiscoveryBackend
from dra_node_agent.discovery_config import DiscoveryConfig
from dra_node_agent.health.probe import HealthProbe

Backend = TypeVar("Backend", bound=DiscoveryBackend)


@dataclass(frozen=True)
class ProbeOptions:
    """How the agent's settings tune a health probe (each vendor reads what applies to it)."""

    # XIDs that are application errors rather than device faults (NVIDIA).
    ignored_xids: frozenset[int]
    # A GPU hotter than this (Celsius) is unhealthy; None: temperature is not watched (NVIDIA).
    temperature_limit: float | None = None


@dataclass(frozen=True)
class ApiAccess:
    """What a vendor's client modules need to read from the API server for one driver."""

    # The agent's kubernetes_asyncio ApiClient; only a vendor's client modules use it.
    api: Any = field(repr=False)
    api_version: str
    node_name: str
    driver: str
    # Each request's deadline (seconds).
    request_timeout: float = 10.0


@dataclass(frozen=True)
class DomainOptions:
    """How the agent's settings tune a driver that joins the node to domains (NVIDIA's
    ComputeDomains)."""

    # The driver's namespace: where the domains' daemons and their claims live.
    namespace: str
    # The kubelet's plugins folder (each domain's daemon folder goes under it).
    plugins_dir: Path
    # The host's IMEX daemon's socket, with host-managed IMEX; None: the driver runs the daemons.
    host_imex_socket: str | None = None
    # Whether the agent keeps the node's nvidia.com/gpu.clique label.
    clique_label: bool = True


def _nothing(*_: object) -> None:
    return None


@dataclass(frozen=True)
class VendorRecord(Generic[Backend]):
    """The parts one vendor brings, each built from the backend that found the devices."""

    # The name backends of this vendor give as ``DiscoveryBackend.vendor``.
    name: str
    # The backends of this vendor that run on this node (blocking: may probe the hardware).
    backends: Callable[[DiscoveryConfig], list[Backend]]
    # Watches the devices' health.
    health_probe: Callable[[Backend, ProbeOptions], HealthProbe | None] = _nothing
    # Applies GpuConfig time-slicing.
    time_slicing: Callable[[Backend], TimeSlicing | None] = _nothing
    # Runs one MPS control daemon per claim, kept under the given folder, bounded by the options.
    mps_daemons: Callable[[Backend, Path, MpsOptions | None], MpsControl[Any] | None] = _nothing
    # Creates and destroys the instances of dynamic MIG placements (None: dynamic MIG is off).
    mig_instances: Callable[[Backend], MigInstances | None] = _nothing
    # Binds GPUs to vfio-pci for passthrough and back (built whether or not they are published
    # for it: a GPU a claim holds must go back even after the setting is turned off).
    passthrough: Callable[[Backend], Passthrough | None] = _nothing
    # The environment the vendor adds to a claim's CDI spec.
    container_env: Callable[[Backend], VendorEnv[Any] | None] = _nothing
    # The data the vendor adds to a claim's device status.
    status_data: Callable[[Backend], VendorStatusData[Any] | None] = _nothing
    # Works out the vendor's context of a claim at prepare (``claim_context``).
    claim_context: Callable[[Backend, ApiAccess], ClaimContextSource[Any] | None] = _nothing
    # Joins the node to the domains its claims name (NVIDIA's compute-domain driver).
    domains: Callable[[Backend, ApiAccess, DomainOptions], DomainMembership | None] = _nothing
    # Whether its claims get ``status.devices`` entries (KEP-4817); a driver whose devices have no
    # health and no data (compute-domain channels and daemons) writes none.
    device_status: Callable[[Backend], bool] = lambda backend: True
