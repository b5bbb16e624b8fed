"""Device set-up for a planned claim, and its undoing.

Set-up creates a dynamic MIG placement's instance, sets a GpuConfig's time slice and starts its MPS
daemon, joins the node to the ComputeDomains of a claim's channels and daemons, and binds a GPU for
passthrough to vfio-pci, through the tools of ``device_setup``.
Tear-down undoes all of it; it must be safe on devices that were never set up, since a crash can
come at any step.

This module changes devices and nothing else: it reads the checkpoint (what other claims hold) but
never writes it, nor a CDI spec. ``claim_steps`` orders its steps with the checkpoint's and the
spec's, so it runs in two: ``make_instances`` (after which the steps record each instance's UUID,
before anything names it), then ``share``.

Set-up touches only what the claim holds. A result with admin access observes its device, which
other claims may hold: the planner refuses sharing for it, and a dynamic MIG placement it observes
must already have its instance (a claim that holds the placement made it), which it never creates
nor destroys. Tear-down never destroys an instance another recorded claim holds.

A GPU for passthrough goes to a virtual machine with its whole IOMMU group: ``check_passthrough``
refuses one whose group holds a device another recorded claim holds (as a GPU, a MIG device or for
passthrough), and a device whose GPU another claim passes through, before anything is recorded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from dra_node_agent import checkpoint as cp
from dra_node_agent.claim_reader import describe
from dra_node_agent.device_setup import DeviceSetupError, Membership, Passthrough
from dra_node_agent.devices import ContainerEdits, DiscoveredDevice, format_quantity
from dra_node_agent.prepare.driver_node import DriverNode
from dra_node_agent.prepare.errors import PrepareError
from dra_node_agent.prepare.metrics import DEVICE_SETUPS
from dra_node_agent.prepare.plan import PreparePlan, shares_of
from dra_node_agent.prepare.records import entry_ref

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Instances:
    """What ``make_instances`` did: the devices as the CDI spec must name them (a dynamic MIG device
    with its instance's UUID and nodes), and the instances' UUIDs by device name (None: the claim
    has no dynamic MIG placement, so there is nothing to record)."""

    devices: list[DiscoveredDevice]
    uuids: dict[str, str] | None


class DeviceSetUp:
    """Sets the devices of one driver's claims up and tears them down."""

    def __init__(self, node: DriverNode, recorded: Callable[[], list[cp.ClaimEntry]]) -> None:
        self._node = node
        # The checkpoint's entries (blocking; read in a thread): what the other claims hold.
        self._recorded = recorded
        self.count = 0

    async def check_shares(self, entry: cp.ClaimEntry, plan: PreparePlan) -> None:
        """Before any device is touched: the shares of each device, this claim's and those recorded
        for other claims, fit its capacity. The allocators account for them; this is the last line
        against a device booked beyond what it has (two allocators racing, a stale view)."""
        mine = shares_of(plan.results)
        if not mine:
            return
        others = [e for e in await asyncio.to_thread(self._recorded) if e.uid != entry.uid]
        for name, consumed in sorted(mine.items()):
            device = self._node.devices.get(name)
            held: dict[str, int] = {}
            holders = []
            for other in others:
                theirs = shares_of(other.devices).get(name)
                if theirs:
                    holders.append(f"{other.namespace}/{other.name}")
                    for capacity, amount in theirs.items():
                        held[capacity] = held.get(capacity, 0) + amount
            for capacity, amount in sorted(consumed.items()):
                total = None if device is None else device.capacity.get(capacity)
                if total is None or amount + held.get(capacity, 0) <= total:
                    continue
                logger.error(
                    "%s: device %s: its shares would consume %s of its %s %s; the claims holding it: %s",
                    describe(entry_ref(entry)),
                    name,
                    format_quantity(amount + held.get(capacity, 0)),
                    capacity,
                    format_quantity(total),
                    ", ".join(holders),
                )
                # Other tenants' claims are counted, not named: this text reaches the pod's Events.
                raise PrepareError(
                    f"{describe(entry_ref(entry))}: device {name}: its shares would consume "
                    f"{format_quantity(amount + held.get(capacity, 0))} of its {capacity} "
                    f"{format_quantity(total)} ({format_quantity(amount)} for this claim, "
                    f"{format_quantity(held.get(capacity, 0))} for {len(holders)} other claim(s) prepared "
                    "here): more than it has, so it was allocated beyond its capacity; the claim is not "
                    "prepared"
                )

    async def make_instances(self, entry: cp.ClaimEntry, plan: PreparePlan) -> Instances:
        """The first step of a set-up: create the instance of each dynamic MIG placement. A placement
        the claim only observes (admin access) gets the instance that is there, or an error."""
        self.count += 1
        DEVICE_SETUPS.labels(self._node.driver).inc()
        devices = plan.devices
        if not any(d.mig_placement is not None for d in devices):
            return Instances(devices=list(devices), uuids=None)
        mig = self._node.dynamic_mig
        assert mig is not None  # the planner refused such devices without it
        ready: list[DiscoveredDevice] = []
        uuids: dict[str, str] = {}
        for device in devices:
            if device.mig_placement is None:
                ready.append(device)
                continue
            requests = sorted({p.request for p in plan.results if p.device == device.name})
            where = f"{describe(entry_ref(entry))}: request {', '.join(requests)}: device {device.name}"
            try:
                if plan.observes_only(device.name):
                    found = await asyncio.to_thread(mig.existing, device.mig_placement)
                    if found is None:
                        raise PrepareError(
                            f"{where}: admin access observes a dynamic MIG placement, and it has no "
                            "instance: a claim that holds the placement makes it, admin access never does"
                        )
                    instance = found
                else:
                    instance = await asyncio.to_thread(mig.create, device.mig_placement)
            except DeviceSetupError as exc:
                raise PrepareError(f"{where}: {exc}") from exc
            uuids[device.name] = instance.uuid
            ready.append(await asyncio.to_thread(mig.edits, device, instance))
        return Instances(devices=ready, uuids=uuids)

    async def check_passthrough(self, entry: cp.ClaimEntry, plan: PreparePlan) -> None:
        """Refuse a claim whose GPUs for passthrough, or whose devices, would share a GPU or an IOMMU
        group with another recorded claim; then ask the tool whether each such GPU is free."""
        tool = self._node.passthrough
        vfio = [p for p in plan.results if p.vfio is not None]
        others = [e for e in await asyncio.to_thread(self._recorded) if e.uid != entry.uid]
        if tool is None or not (vfio or any(d.vfio is not None for e in others for d in e.devices)):
            return
        where = describe(entry_ref(entry))
        for held_by, held, members in await self._groups(tool, others):
            for mine in plan.results:
                bus = self._bus_of(mine)
                if bus in members and mine.device != held.device:
                    raise PrepareError(
                        f"{where}: request {mine.request}: device {mine.device} is on IOMMU group "
                        f"{held.vfio.iommu_group if held.vfio else ''}, which {_holder(entry, held_by)} "
                        f"holds for passthrough ({held.device}); a virtual machine has its group alone"
                    )
        for mine in vfio:
            assert mine.vfio is not None
            try:
                members = await asyncio.to_thread(tool.group_members, mine.vfio)
                for other in others:
                    for held in other.devices:
                        if self._bus_of(held) in members:
                            raise PrepareError(
                                f"{where}: request {mine.request}: GPU {mine.vfio.pci_bus_id} (device "
                                f"{mine.device}) would go to a virtual machine with IOMMU group "
                                f"{mine.vfio.iommu_group}, which holds {held.device}, prepared for "
                                f"{_holder(entry, other)}; a GPU in use is not passed through"
                            )
                await asyncio.to_thread(tool.check, mine.vfio, gpu_minor=self._minor(mine.vfio.pci_bus_id))
            except DeviceSetupError as exc:
                raise PrepareError(f"{where}: request {mine.request}: device {mine.device}: {exc}") from exc

    async def _groups(
        self, tool: Passthrough, others: Sequence[cp.ClaimEntry]
    ) -> list[tuple[cp.ClaimEntry, cp.CheckpointedDevice, list[str]]]:
        """Each device other claims hold for passthrough, with its claim and its group's members."""
        found = []
        for other in others:
            for held in other.devices:
                if held.vfio is not None:
                    try:
                        members = await asyncio.to_thread(tool.group_members, held.vfio)
                    except DeviceSetupError:
                        members = [held.vfio.pci_bus_id]
                    found.append((other, held, members))
        return found

    def _bus_of(self, held: cp.CheckpointedDevice) -> str | None:
        """The PCI function a recorded device uses (a MIG device's: its GPU's)."""
        if held.vfio is not None:
            return held.vfio.pci_bus_id
        device = self._node.devices.get(held.device)
        return device.pci_bus_id if device is not None else None

    def _minor(self, bus_id: str) -> int | None:
        """The GPU's minor (its /dev/nvidia<minor>), from its CUDA device; None if it has none."""
        for device in self._node.devices.values():
            if device.kind == "gpu" and device.pci_bus_id == bus_id and device.local_id.isdigit():
                return int(device.local_id)
        return None

    async def pass_through(
        self,
        entry: cp.ClaimEntry,
        devices: Sequence[DiscoveredDevice],
        plan: PreparePlan,
        *,
        between_steps: Callable[[], Awaitable[None]],
    ) -> tuple[list[DiscoveredDevice], ContainerEdits | None]:
        """Bind each GPU for passthrough to vfio-pci (its recorded entry says what to undo), in two
        steps with ``between_steps`` between them; returns the devices as the spec names them and
        the edits every container of the claim gets instead of the GPU driver's (None: none such)."""
        tool = self._node.passthrough
        if plan.iommu is None or tool is None:
            return list(devices), None
        by_device = {p.device: p.vfio for p in entry.devices if p.vfio is not None}
        ready: list[DiscoveredDevice] = []
        common = ContainerEdits()
        for device in devices:
            target = by_device.get(device.name)
            if target is None:
                ready.append(device)
                continue
            try:
                await asyncio.to_thread(tool.release, target)
                await between_steps()
                await asyncio.to_thread(tool.bind, target)
                named, edits = await asyncio.to_thread(tool.edits, device, target, plan.iommu)
            except DeviceSetupError as exc:
                raise PrepareError(f"{describe(entry_ref(entry))}: device {device.name}: {exc}") from exc
            ready.append(named)
            common = common.merged(edits)
        return ready, common

    async def join_domains(
        self, entry: cp.ClaimEntry, devices: Sequence[DiscoveredDevice], plan: PreparePlan
    ) -> list[DiscoveredDevice]:
        """Join the node to the domains the claim's channels and daemons name (a compute-domain
        claim); returns the devices with the edits that gives them."""
        if not plan.domain_devices:
            return list(devices)
        domains = self._node.domains
        assert domains is not None  # the planner refused such devices without it
        by_device = {p.device: p for p in entry.devices}
        wanted = dict(plan.domain_devices)
        others = await asyncio.to_thread(self._held_elsewhere, entry.uid)
        joined: list[DiscoveredDevice] = []
        for device in devices:
            record = by_device.get(device.name)
            if device.name not in wanted or record is None or record.compute_domain is None:
                joined.append(device)
                continue
            member = Membership(
                namespace=entry.namespace,
                claim=entry.name,
                uid=entry.uid,
                device=device,
                domain=record.compute_domain,
                all_channels=wanted[device.name],
            )
            try:
                edits = await domains.join(member, others=others)
            except DeviceSetupError as exc:
                raise PrepareError(f"{describe(entry_ref(entry))}: request {record.request}: {exc}") from exc
            joined.append(dataclasses.replace(device, edits=device.edits.merged(edits)))
        return joined

    def _held_elsewhere(self, uid: str) -> list[tuple[str, str]]:
        """(device, domain) of what other recorded claims joined (blocking: reads the checkpoint)."""
        return [
            (held.device, held.compute_domain)
            for other in self._recorded()
            if other.uid != uid
            for held in other.devices
            if held.compute_domain is not None
        ]

    async def share(
        self, entry: cp.ClaimEntry, devices: Sequence[DiscoveredDevice], plan: PreparePlan
    ) -> None:
        """The second step: the time slices, then the MPS daemon the claim's GpuConfig (or, for MIG
        devices, MigDeviceConfig) asks for."""
        await self._set_up_time_slices(entry, devices)
        if plan.mps_limits is not None:
            assert self._node.mps is not None
            try:
                await self._node.mps.start(entry.uid, plan.mps_limits)
            except DeviceSetupError as exc:
                requests = sorted({p.request for p in entry.devices if p.mps})
                raise PrepareError(
                    f"{describe(entry_ref(entry))}: request {', '.join(requests)}: {plan.mps_kind} "
                    f"sharing.strategy MPS: {exc}"
                ) from exc

    async def _set_up_time_slices(self, entry: cp.ClaimEntry, devices: Sequence[DiscoveredDevice]) -> None:
        wanted = {p.device: p for p in entry.devices if p.time_slice is not None}
        if not wanted:
            return
        sharing = self._node.gpu_sharing
        assert sharing is not None  # the planner refused time-slicing without it
        others = await asyncio.to_thread(self._recorded)
        for other in others:
            if other.uid == entry.uid:
                continue
            for held in other.devices:
                mine = wanted.get(held.device)
                if mine is None or held.time_slice is None or held.time_slice == mine.time_slice:
                    continue
                # The error reaches the pod's Events: another tenant's claim is named in the log only.
                holder = f"claim {other.namespace}/{other.name} (request {held.request})"
                if other.namespace != entry.namespace:
                    logger.warning(
                        "%s: the time slice on GPU %s was set by %s", entry.uid, held.device, holder
                    )
                    holder = "a claim of another namespace"
                raise PrepareError(
                    f"{describe(entry_ref(entry))}: request {mine.request}: GpuConfig "
                    f"sharing.timeSlicingConfig.interval {mine.time_slice} conflicts with interval "
                    f"{held.time_slice} that {holder} set on GPU {held.device}; a GPU has one time "
                    "slice, so claims sharing it must ask for the same interval"
                )
        by_name = {d.name: d for d in devices}
        by_interval: dict[str, list[str]] = {}
        for name, prepared in sorted(wanted.items()):
            assert prepared.time_slice is not None
            by_interval.setdefault(prepared.time_slice, []).append(by_name[name].uuid)
        for interval, uuids in by_interval.items():
            try:
                await sharing.set_time_slice(uuids, interval)
            except DeviceSetupError as exc:
                requests = sorted({p.request for p in wanted.values() if p.time_slice == interval})
                raise PrepareError(
                    f"{describe(entry_ref(entry))}: request {', '.join(requests)}: GpuConfig "
                    f"sharing.timeSlicingConfig.interval {interval} could not be applied: {exc}"
                ) from exc

    async def tear_down(self, entry: cp.ClaimEntry, *, strict: bool = False) -> None:
        """Undo the set-up. A device that cannot be reset raises ``DeviceSetupError`` when ``strict``
        (unprepare, which the kubelet retries); otherwise it is logged and left."""
        try:
            await self._tear_down(entry)
        except DeviceSetupError as exc:
            if strict:
                raise
            logger.warning("%s: undoing its device set-up failed: %s", describe(entry_ref(entry)), exc)

    async def _tear_down(self, entry: cp.ClaimEntry) -> None:
        """Undo the set-up; must be safe on devices that were never set up (a reset to Default is).

        A GPU's time slice goes back to Default when no other recorded claim holds it with one.
        """
        if self._node.mps is not None:
            await self._node.mps.stop(entry.uid)  # nothing to do for a claim without a daemon
        await self._leave_domains(entry)
        await self._tear_down_migs(entry)
        await self._give_back(entry)
        sliced = {p.device for p in entry.devices if p.time_slice is not None}
        sharing = self._node.gpu_sharing
        if not sliced or sharing is None:
            return
        others = await asyncio.to_thread(self._recorded)
        still_used = {
            held.device
            for other in others
            if other.uid != entry.uid
            for held in other.devices
            if held.time_slice is not None
        }
        uuids = [
            device.uuid
            for name in sorted(sliced - still_used)
            if (device := self._node.devices.get(name)) is not None
        ]
        if uuids:
            await sharing.reset_time_slice(uuids)

    async def _leave_domains(self, entry: cp.ClaimEntry) -> None:
        """Leave the domains the claim joined (safe for one that never did)."""
        joined = [p for p in entry.devices if p.compute_domain is not None]
        domains = self._node.domains
        if not joined or domains is None:
            return
        others = await asyncio.to_thread(self._held_elsewhere, entry.uid)
        for prepared in joined:
            assert prepared.compute_domain is not None
            await domains.leave(device=prepared.device, domain=prepared.compute_domain, others=others)

    async def _tear_down_migs(self, entry: cp.ClaimEntry) -> None:
        """Destroy the instances of the claim's dynamic MIG placements (found by placement: one that
        was never created, or already destroyed, is no error), but never one another recorded claim
        holds, nor one this claim only observed (an admin-access entry of an older agent)."""
        if not any(p.dynamic_mig for p in entry.devices):
            return
        others = await asyncio.to_thread(self._recorded)
        held_elsewhere = {
            held.device
            for other in others
            if other.uid != entry.uid
            for held in other.devices
            if held.dynamic_mig and not held.admin_access
        }
        for prepared in entry.devices:
            if not prepared.dynamic_mig:
                continue
            if prepared.admin_access or prepared.device in held_elsewhere:
                logger.warning(
                    "%s: device %s: its MIG instance (%s) is left in place: %s",
                    describe(entry_ref(entry)),
                    prepared.device,
                    prepared.mig_uuid or "unknown",
                    "this claim only observed it" if prepared.admin_access else "another claim holds it",
                )
                continue
            device = self._node.devices.get(prepared.device)
            mig = self._node.dynamic_mig
            if device is None or device.mig_placement is None or mig is None:
                logger.error(
                    "%s: device %s was a dynamic MIG placement, but this node no longer publishes it in "
                    "that mode; its instance (%s) is left for the start-up clean-up",
                    describe(entry_ref(entry)),
                    prepared.device,
                    prepared.mig_uuid or "never created",
                )
                continue
            await asyncio.to_thread(mig.destroy, device.mig_placement)

    async def _give_back(self, entry: cp.ClaimEntry) -> None:
        """Give the claim's GPUs for passthrough back to the NVIDIA driver (safe on a GPU never
        taken: it is found where it is)."""
        targets = [p.vfio for p in entry.devices if p.vfio is not None]
        if not targets:
            return
        tool = self._node.passthrough
        if tool is None:
            raise DeviceSetupError(
                f"{len(targets)} GPU(s) for passthrough ({', '.join(t.pci_bus_id for t in targets)}) "
                f"cannot be given back: driver {self._node.driver} has no passthrough tool here"
            )
        for target in targets:
            await asyncio.to_thread(tool.restore, target)


def _holder(entry: cp.ClaimEntry, other: cp.ClaimEntry) -> str:
    """``other`` as a refusal of ``entry`` names it: the text reaches the pod's Events, so a claim of
    another namespace (another tenant) is named in the agent's log only."""
    if other.namespace == entry.namespace:
        return f"claim {other.namespace}/{other.name}"
    logger.warning(
        "%s: refused for passthrough, claim %s/%s is in the way", entry.uid, other.namespace, other.name
    )
    return "a claim of another namespace"
