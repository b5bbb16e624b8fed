"""Device set-up for a planned claim, and its undoing.

Set-up creates a dynamic MIG placement's instance, sets a GpuConfig's time slice and starts its MPS
daemon, through the tools of ``device_setup``. Tear-down undoes all of it; it must be safe on
devices that were never set up, since a crash can come at any step.

This module changes devices and nothing else: it reads the checkpoint (what other claims hold) but
never writes it, nor a CDI spec. ``claim_steps`` orders its steps with the checkpoint's and the
spec's, so it runs in two: ``make_instances`` (after which the steps record each instance's UUID,
before anything names it), then ``share``.

Set-up touches only what the claim holds. A result with admin access observes its device, which
other claims may hold: the planner refuses sharing for it, and a dynamic MIG placement it observes
must already have its instance (a claim that holds the placement made it), which it never creates
nor destroys. Tear-down never destroys an instance another recorded claim holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dra_node_agent import checkpoint as cp
from dra_node_agent.claim_reader import describe
from dra_node_agent.device_setup import DeviceSetupError, Membership
from dra_node_agent.devices import DiscoveredDevice
from dra_node_agent.prepare.driver_node import DriverNode
from dra_node_agent.prepare.errors import PrepareError
from dra_node_agent.prepare.metrics import DEVICE_SETUPS
from dra_node_agent.prepare.plan import PreparePlan
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
        """The second step: the time slices, then the MPS daemon the claim's GpuConfig asks for."""
        await self._set_up_time_slices(entry, devices)
        if plan.mps_limits is not None:
            assert self._node.mps is not None
            try:
                await self._node.mps.start(entry.uid, plan.mps_limits)
            except DeviceSetupError as exc:
                requests = sorted({p.request for p in entry.devices if p.mps})
                raise PrepareError(
                    f"{describe(entry_ref(entry))}: request {', '.join(requests)}: GpuConfig "
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
                raise PrepareError(
                    f"{describe(entry_ref(entry))}: request {mine.request}: GpuConfig "
                    f"sharing.timeSlicingConfig.interval {mine.time_slice} conflicts with interval "
                    f"{held.time_slice} that claim {other.namespace}/{other.name} (request {held.request}) "
                    f"set on GPU {held.device}; a GPU has one time slice, so claims sharing it must ask for "
                    "the same interval"
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
