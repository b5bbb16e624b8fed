"""The steps of preparing and unpreparing one claim: checkpoint, plan, device set-up, CDI spec.

This is the one place that orders the checkpoint, the device set-up and the CDI spec, and it does so
under one lock per driver (``ClaimSteps.lock``): one claim's prepare, unprepare or clean-up at a
time, and the start-up clean-up before any. No other module writes the checkpoint or a CDI spec
(``set_up`` changes devices only, ``start_up`` runs from here), as dra-example-driver's device state
does under its mutex.

Prepare:
  1. already ``PrepareCompleted`` in the checkpoint -> the recorded answer, nothing re-written;
  2. GET the claim, check its UID, keep this driver's allocation results;
  3. plan (``plan.Planner``), and work out the vendor's context of the claim (``claim_context``: for
     a TPU claim with every chip of a host of a multi-host slice, the pod's worker identity);
  4. a ``PrepareStarted`` entry left by a crash -> roll its partial work back first;
  5. record ``PrepareStarted`` (written while the claim is read, the two slow steps overlapping),
     check that the device shares it holds fit beside those recorded for other claims, set the
     devices up (``set_up.DeviceSetUp``; the devices are recorded first, a dynamic MIG
     instance's UUID as soon as it exists), write the claim's CDI spec, record
     ``PrepareCompleted``; a GPU for passthrough is recorded before it is bound to vfio-pci, and
     refused before anything is recorded when it or its IOMMU group is another claim's (``set_up``);
     the checkpoint refuses a device held by another claim (unless both use
     admin access) before a device is touched, and at the latest at ``PrepareCompleted``, and a
     refused attempt leaves no trace;
  6. answer with the CDI device IDs per result, and hand the prepared claim to the device status
     writer (``device_status``), which writes it in the background.
Unprepare works from the checkpoint alone (the claim may be gone): tear down, remove the CDI spec,
drop the entry, and tell the device status writer. Unknown UIDs are a no-op.

Where GPUs are published for passthrough, the steps keep ``holds`` (``prepare.holds``): which GPUs
the recorded claims hold for passthrough and which for containers, and tell the listeners (the
agent's wiring: what it publishes and what the health monitor watches) when it changes. A GPU's
passthrough hold is told before its binding's first step, so nothing watches it go.

Every file and checkpoint call runs in a thread (``asyncio.to_thread``): the event loop serves
other drivers' calls meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from dra_api.kubeletapi.model import ClaimRef, PreparedDevice
from dra_node_agent import checkpoint as cp
from dra_node_agent.cdi import CdiWriter, SpecTooLarge
from dra_node_agent.claim_reader import ClaimAllocation, ClaimError, ClaimGone, ClaimSource, describe
from dra_node_agent.device_setup import DeviceSetupError
from dra_node_agent.device_status import DeviceStatusWriter
from dra_node_agent.devices import ContainerEdits, DiscoveredDevice
from dra_node_agent.prepare.driver_node import DriverNode
from dra_node_agent.prepare.errors import PrepareError
from dra_node_agent.prepare.holds import Holds, holds_of
from dra_node_agent.prepare.pause_points import PausePoints
from dra_node_agent.prepare.plan import Planner, PreparePlan
from dra_node_agent.prepare.records import answer, entry_ref
from dra_node_agent.prepare.set_up import DeviceSetUp
from dra_node_agent.prepare.start_up import (
    clean_up_files,
    reconcile_mig,
    reconcile_mps,
    reconcile_passthrough,
)

logger = logging.getLogger(__name__)


class ClaimSteps:
    """Prepares and unprepares one driver's claims, one at a time under ``lock``."""

    def __init__(
        self,
        *,
        node: DriverNode,
        claims: ClaimSource,
        store: cp.CheckpointStore,
        cdi: CdiWriter,
        planner: Planner,
        pauses: PausePoints,
        device_status: DeviceStatusWriter | None = None,
    ) -> None:
        self._node = node
        self._status = device_status
        self._claims = claims
        self._store = store
        self._cdi = cdi
        self._planner = planner
        self._pauses = pauses
        self.devices = DeviceSetUp(node, store.entries)
        # The plugin serialises the kubelet's calls already; this keeps the order of checkpoint,
        # set-up and spec whole when the steps are called otherwise (the stale-claim clean-up).
        self.lock = asyncio.Lock()
        self.holds = Holds()
        self._holds_listeners: list[Callable[[Holds], None]] = []

    def add_holds_listener(self, listener: Callable[[Holds], None]) -> None:
        """Call ``listener`` (on the event loop; it must return at once) when ``holds`` changes."""
        self._holds_listeners.append(listener)

    async def _update_holds(self, *, passthrough: bool = False) -> None:
        """Read the holds from the checkpoint and tell the listeners if they changed. Only where
        GPUs are (or were) published for passthrough, or ``passthrough`` (a claim for one)."""
        tracked = (
            passthrough
            or self.holds.passed_through
            or any(d.kind == "vfio" for d in self._node.devices.values())
        )
        if self._node.passthrough is None or not tracked:
            return
        try:
            entries = await asyncio.to_thread(self._store.entries)
        except cp.CheckpointCorrupt:
            return  # reported already; nothing changes while it is
        holds = holds_of(entries, self._node.devices)
        if holds == self.holds:
            return
        self.holds = holds
        for listener in self._holds_listeners:
            try:
                listener(holds)
            except Exception:  # a listener's bug must not fail the claim
                logger.exception("a passthrough holds listener of driver %s failed", self._node.driver)

    async def start_up(self, *, state_dir: Path) -> None:
        """Load the checkpoint and clean up what a crash or a reboot left behind; then tell the
        device status writer of the claims prepared before."""
        async with self.lock:
            driver = self._node.driver
            await asyncio.to_thread(
                clean_up_files, driver=driver, state_dir=state_dir, store=self._store, cdi=self._cdi
            )
            if self._node.mps is not None:
                await reconcile_mps(driver, self._store, self._node.mps)
            if self._node.dynamic_mig is not None:
                await reconcile_mig(self._node, self._store, self._node.dynamic_mig)
            if self._node.passthrough is not None:
                await reconcile_passthrough(driver, self._store, self._node.passthrough)
            await self._update_holds()
            if self._status is not None:
                try:
                    prepared = await asyncio.to_thread(self._store.entries, cp.ClaimState.PREPARE_COMPLETED)
                except cp.CheckpointCorrupt:
                    prepared = []  # reported already; nothing can be unprepared either until it is fixed
                self._status.seed(prepared, inventory=self._node.inventory)

    async def prepare(self, claim: ClaimRef) -> tuple[PreparedDevice, ...]:
        async with self.lock:
            try:
                return await self._prepare(claim)
            finally:
                await self._update_holds()

    async def _prepare(self, claim: ClaimRef) -> tuple[PreparedDevice, ...]:
        store = self._store
        existing = await asyncio.to_thread(store.get, claim.uid)
        if existing is not None and existing.state == cp.ClaimState.PREPARE_COMPLETED:
            logger.debug("%s already prepared; answering from the checkpoint", describe(claim))
            return answer(existing)

        # PrepareStarted goes to disk while the claim is read: the GET and the checkpoint write are
        # the two slow steps and neither needs the other. The devices are recorded, and checked
        # against other claims, before any device is touched (``PreparePlan.touches_devices``) and
        # at the latest by PrepareCompleted, before the kubelet hears of them.
        reading = asyncio.ensure_future(self._claims.read(claim))
        try:
            if existing is not None:
                # PrepareStarted from an interrupted attempt: undo what it may have done, then redo.
                logger.info("%s: rolling back an interrupted prepare before redoing it", describe(claim))
                await self._roll_back(existing)
            entry = await asyncio.to_thread(store.begin, claim, ())
        except BaseException:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            raise
        if entry.state == cp.ClaimState.PREPARE_COMPLETED:  # another agent instance finished it
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            return answer(entry)
        try:
            allocation = await reading
            plan = self._planner.plan(allocation)
            context = await self._claim_context(allocation, plan) if plan.results else None
        except (ClaimError, PrepareError):
            await asyncio.to_thread(store.remove, claim.uid)  # nothing was done: forget it
            raise
        if not plan.results:
            await asyncio.to_thread(store.remove, claim.uid)
            logger.info(
                "%s has no devices of driver %s; nothing to prepare", describe(claim), self._node.driver
            )
            return ()
        await self._pauses.reached("prepare-started")
        return await self._set_up_and_complete(claim, entry=entry, plan=plan, context=context)

    async def _set_up_and_complete(
        self, claim: ClaimRef, *, entry: cp.ClaimEntry, plan: PreparePlan, context: Any
    ) -> tuple[PreparedDevice, ...]:
        """Steps 5 and 6 for a planned claim whose ``PrepareStarted`` entry is written."""
        store = self._store
        try:
            try:
                await self.devices.check_passthrough(entry, plan)
            except PrepareError:
                await self._forget(entry)  # nothing is recorded or touched yet
                raise
            if plan.touches_devices:
                entry = await asyncio.to_thread(store.begin, claim, plan.results)
            if plan.iommu is not None:
                await self._update_holds(passthrough=True)  # before the GPU's binding is touched
            try:
                entry, devices, common = await self._set_up(entry, plan)
            except PrepareError:
                # Nothing of a failed set-up stays behind: undo what it did, forget the attempt.
                await self._forget(entry)
                raise
            await self._pauses.reached("devices-set-up")

            try:
                ids = await asyncio.to_thread(
                    self._cdi.write_claim_spec,
                    claim_uid=claim.uid,
                    devices=devices,
                    inventory=self._node.inventory,
                    config=plan.claim_config,
                    context=context,
                    common=common,
                )
            except SpecTooLarge as exc:
                await self._forget(entry)
                raise PrepareError(f"{describe(claim)}: {exc}") from exc
            await self._pauses.reached("cdi-written")

            by_device = {d.name: cdi_id for d, cdi_id in zip(devices, ids, strict=True)}
            # The recorded devices carry what set-up learned (a dynamic MIG instance's UUID). A device
            # that needs no CDI device (a channel without NVLink fabric) gets no ID.
            recorded = {p.device: p.mig_uuid for p in entry.devices}
            prepared = [
                dataclasses.replace(
                    p,
                    cdi_device_ids=(cdi_id,) if (cdi_id := by_device[p.device]) is not None else (),
                    mig_uuid=recorded.get(p.device),
                )
                for p in plan.results
            ]
            done = await asyncio.to_thread(store.complete, claim.uid, prepared)
        except (cp.DeviceAlreadyPrepared, cp.CheckpointFull):
            # Another claim holds a device, or the checkpoint is at a bound: leave no trace of this attempt.
            await self._forget(entry)
            raise
        logger.info(
            "prepared %s: %s",
            describe(claim),
            ", ".join(f"{d.request}={d.pool}/{d.device}" for d in done.devices),
        )
        if self._status is not None:
            try:
                self._status.prepared(
                    done,
                    devices=devices,
                    inventory=self._node.inventory,
                    config=plan.claim_config,
                    context=context,
                )
            except Exception:  # the claim is prepared: a status bug must not fail it
                logger.exception("recording the device status of %s failed", describe(claim))
        return answer(done)

    async def _set_up(
        self, entry: cp.ClaimEntry, plan: PreparePlan
    ) -> tuple[cp.ClaimEntry, list[DiscoveredDevice], ContainerEdits | None]:
        """Set the devices up: dynamic MIG instances, whose UUIDs are recorded before anything names
        them (a crash from here on leaves an entry that says what to destroy), then the domains its
        compute-domain devices join, time slices and the MPS daemon, then GPUs for passthrough to
        vfio-pci (recorded before: ``begin``); the device shares it holds are checked first. Returns
        the entry, the devices as the CDI spec must name them, and the edits every container gets
        instead of the driver's (None: the driver's)."""
        await self.devices.check_shares(entry, plan)
        made = await self.devices.make_instances(entry, plan)
        if made.uuids is not None:
            uuids = made.uuids
            recorded = [
                dataclasses.replace(p, mig_uuid=uuids.get(p.device, p.mig_uuid)) for p in entry.devices
            ]
            entry = await asyncio.to_thread(self._store.begin, entry_ref(entry), recorded)
        joined = await self.devices.join_domains(entry, made.devices, plan)
        await self.devices.share(entry, joined, plan)
        devices, common = await self.devices.pass_through(
            entry, joined, plan, between_steps=lambda: self._pauses.reached("vfio-unbound")
        )
        return entry, devices, common

    async def _claim_context(self, allocation: ClaimAllocation, plan: PreparePlan) -> Any:
        """The vendor's context of the claim (``claim_context``); None where it has none."""
        source = self._node.claim_context
        if source is None:
            return None
        return await source.resolve(
            allocation=allocation,
            inventory=self._node.inventory,
            devices=plan.devices,
            config=plan.claim_config,
        )

    async def _roll_back(self, entry: cp.ClaimEntry, *, strict: bool = False) -> None:
        """Tear the claim's devices down, then remove its CDI spec (``DeviceSetUp.tear_down`` says
        what ``strict`` does)."""
        await self.devices.tear_down(entry, strict=strict)
        await asyncio.to_thread(self._cdi.remove_claim_spec, entry.uid)

    async def _forget(self, entry: cp.ClaimEntry) -> None:
        """Roll a failed attempt back and drop its entry: it leaves no trace."""
        await self._roll_back(entry)
        await asyncio.to_thread(self._store.remove, entry.uid)

    async def unprepare(self, claim: ClaimRef) -> None:
        async with self.lock:
            entry = await asyncio.to_thread(self._store.get, claim.uid)
            if entry is None:
                logger.debug("%s is not prepared here; unprepare is a no-op", describe(claim))
                return
            await self._pauses.reached("unprepare-started")
            await self._roll_back(entry, strict=True)
            await asyncio.to_thread(self._store.remove, claim.uid)
            await self._update_holds()
            if self._status is not None:
                try:
                    self._status.unprepared(entry)
                except Exception:  # the claim is unprepared: a status bug must not fail it
                    logger.exception("recording the device status of %s failed", describe(claim))
            logger.info("unprepared %s", describe(claim))

    async def clean_up_stale(self, cutoff: datetime) -> list[str]:
        """Unprepare ``PrepareStarted`` entries from before ``cutoff`` whose claim is gone; returns
        their UIDs. Entries whose claim still exists are kept: the kubelet retries those."""
        async with self.lock:
            try:
                return await self._clean_up_stale(cutoff)
            finally:
                await self._update_holds()

    async def _clean_up_stale(self, cutoff: datetime) -> list[str]:
        removed: list[str] = []
        try:
            stale = await asyncio.to_thread(self._store.started_before, cutoff)
        except cp.CheckpointCorrupt:
            return removed
        for entry in stale:
            ref = entry_ref(entry)
            try:
                await self._claims.read(ref)
                continue
            except ClaimGone:
                pass
            except ClaimError:
                continue  # exists but unusable, or the API is unreachable: decide later
            try:
                await self._roll_back(entry, strict=True)
            except DeviceSetupError as exc:
                logger.warning("stale claim %s: %s; trying again later", describe(ref), exc)
                continue
            await asyncio.to_thread(self._store.remove, entry.uid)
            removed.append(entry.uid)
            logger.info("unprepared stale claim %s: it no longer exists", describe(ref))
        return removed
