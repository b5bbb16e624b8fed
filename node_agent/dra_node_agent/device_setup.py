"""What prepare asks of the tools that set a claim's devices up, and how those tools fail.

The prepare pipeline is vendor-neutral: it knows these protocols, not their implementations. The
NVIDIA package implements them (``nvidia.gpu_sharing``, ``nvidia.mps``, ``nvidia.dynamic_mig``);
the vendor's record (``vendor_record``) builds them for a driver, and the agent's wiring
(``prepare_tools``) hands them to ``PrepareHandler``.
Methods that are not coroutines block, so prepare calls them in a thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol, TypeVar

from dra_node_agent.checkpoint import PassthroughRecord
from dra_node_agent.devices import ContainerEdits, DiscoveredDevice, MigPlacement
from dra_node_agent.opaqueconfig import IommuConfig, MpsConfig


class DeviceSetupError(Exception):
    """A device set-up or tear-down that did not take (a time slice, an MPS daemon, a MIG
    instance); the message says which device and why. Unprepare keeps the claim recorded, so the
    kubelet's retry tries again."""


class TimeSlicing(Protocol):
    """Sets and resets the time slice of whole GPUs (GpuConfig ``sharing.strategy: TimeSlicing``)."""

    async def set_time_slice(self, uuids: Sequence[str], interval: str) -> None: ...

    async def reset_time_slice(self, uuids: Sequence[str]) -> None: ...


@dataclass(frozen=True)
class MigInstance:
    """A live MIG device: its GPU and compute instance IDs and its UUID ("MIG-...")."""

    gi_id: int
    ci_id: int
    uuid: str


@dataclass(frozen=True)
class LiveInstance:
    """A GPU instance found on a GPU: where it sits (profile ID, start) and its ID."""

    parent_uuid: str
    profile_id: int
    start: int
    gi_id: int


class MigInstances(Protocol):
    """Makes and removes the MIG instance of a dynamic placement, found by placement."""

    def create(self, placement: MigPlacement) -> MigInstance: ...

    def existing(self, placement: MigPlacement) -> MigInstance | None: ...

    def edits(self, device: DiscoveredDevice, instance: MigInstance) -> DiscoveredDevice: ...

    def destroy(self, placement: MigPlacement) -> bool: ...

    def live(self, parent_uuids: Sequence[str]) -> list[LiveInstance]: ...

    def destroy_live(self, instance: LiveInstance) -> None: ...


class Passthrough(Protocol):
    """Hands a whole GPU to a virtual machine: binds it to vfio-pci and back, one sysfs step at a
    time, so that a crash between two leaves a state the next call goes on from. Every method
    blocks; every step is idempotent."""

    def group_members(self, target: PassthroughRecord) -> list[str]:
        """The PCI functions of the GPU's IOMMU group, the GPU among them."""
        ...

    def check(self, target: PassthroughRecord, *, gpu_minor: int | None) -> None:
        """Refuse (``DeviceSetupError``, naming what is in the way) a GPU that cannot be handed over
        whole: its group holds a function that another driver holds, or a process has it open."""
        ...

    def release(self, target: PassthroughRecord) -> None:
        """The first step: only vfio-pci may take the GPU now, and its driver lets it go."""
        ...

    def bind(self, target: PassthroughRecord) -> None:
        """The second step: vfio-pci takes it."""
        ...

    def edits(
        self, device: DiscoveredDevice, target: PassthroughRecord, iommu: IommuConfig
    ) -> tuple[DiscoveredDevice, ContainerEdits]:
        """The device as the claim's spec names it (the group's node, or its IOMMUFD cdev) and the
        edits every container of the claim gets instead of the GPU driver's (the API device)."""
        ...

    def restore(self, target: PassthroughRecord) -> None:
        """Give the GPU back to the NVIDIA driver, from whatever step it is at."""
        ...


_GIB: Final = 1 << 30


@dataclass(frozen=True)
class MpsOptions:
    """How this node runs the MPS daemons: the agent's ``--mps-*`` and ``--cgroup-root`` flags."""

    shm_size: int = _GIB  # bytes of each claim's shm tmpfs
    memory_limit: int = _GIB  # bytes each claim's daemon and its servers may use
    cgroup_parent: str = "accel-dra-mps"  # "": the daemons stay in the agent's cgroup
    cgroup_root: Path = Path("/sys/fs/cgroup")


# The daemon-wide settings of one claim, as the MPS tool computes and records them; prepare only
# passes them along.
Limits = TypeVar("Limits")


class MpsControl(Protocol[Limits]):
    """Runs one MPS control daemon per claim, and finds the daemons of earlier runs."""

    def limits(
        self,
        config: MpsConfig,
        gpus: Sequence[DiscoveredDevice],
        *,
        where: str,
        shares: Mapping[str, Mapping[str, int]],
    ) -> Limits:
        """The daemon's settings for ``gpus``; ``shares``: what the claim's shares consume of the
        devices it holds shares of, by device name, which bound the limits on them."""
        ...

    def edits(self, uid: str, limits: Limits) -> ContainerEdits: ...

    async def start(self, uid: str, limits: Limits) -> None: ...

    async def stop(self, uid: str) -> None: ...

    def running(self, uid: str) -> bool: ...

    def recorded_limits(self, uid: str) -> Limits | None: ...

    def claims(self) -> list[str]: ...


@dataclass(frozen=True)
class Membership:
    """One device that joins a claim to a domain its node serves (NVIDIA's ComputeDomains): the
    claim, the device, the domain's ID and, for a channel, how many channels it asks for."""

    namespace: str
    claim: str
    uid: str
    device: DiscoveredDevice
    domain: str
    all_channels: bool = False


class DomainMembership(Protocol):
    """Joins a node to the domains its claims name, and waits for the domain to be ready there.

    ``join`` is a device set-up (a channel labels the node so the domain's daemon lands; a daemon
    gets the domain's folder) and returns the container edits the device then needs; ``leave``
    undoes it from the checkpoint alone (the claim may be gone) and is safe on a device that never
    joined; ``wait_ready`` is asked after prepare, outside its lock, and raises
    ``DeviceSetupError`` while the domain is not ready on this node when ``budget_s`` runs out.
    ``run`` keeps the node's own facts in the cluster (its NVLink clique label) until cancelled;
    ``aclose`` stops what it started.
    """

    async def join(self, member: Membership, *, others: Sequence[tuple[str, str]]) -> ContainerEdits: ...

    async def leave(self, *, device: str, domain: str, others: Sequence[tuple[str, str]]) -> None: ...

    async def wait_ready(self, *, claim: str, domain: str, budget_s: float) -> None: ...

    async def run(self) -> None: ...

    async def aclose(self) -> None: ...
