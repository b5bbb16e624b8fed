"""The steps of preparing and unpreparing one claim: checkpoint, plan, device set-up, CDI spec.

Prepare:
  1. already ``PrepareCompleted`` in the checkpoint -> the recorded answer, nothing re-written;
  2. GET the claim, check its UID, keep this driver's allocation results;
  3. plan (``plan.Planner``); for a TPU claim with every chip of a host of a multi-host slice,
     derive the pod's worker identity from its Job (``tpu.multihost``);
  4. a ``PrepareStarted`` entry left by a crash -> roll its partial work back first;
  5. record ``PrepareStarted`` (written while the claim is read, the two slow steps overlapping),
     set the devices up (``set_up.DeviceSetUp``; the devices are recorded first), write the claim's
     CDI spec, record ``PrepareCompleted``; the checkpoint refuses a device held by another claim
     (unless both use admin access) before a device is touched, and at the latest at
     ``PrepareCompleted``, and a refused attempt leaves no trace;
  6. answer with the CDI device IDs per result, and hand the prepared claim to the device status
     writer (``device_status``), which writes it in the background.
Unprepare works from the checkpoint alone (the claim may be gone): tear down, remove the CDI spec,
drop the entry, and tell the device status writer. Unknown UIDs are a no-op.

Every file and checkpoint call runs in a thread (``asyncio.to_thread``): the event loop serves
other drivers' calls meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import datetime

from dra_api.kubeletapi.model import ClaimRef, PreparedDevice
from dra_node_agent import checkpoint as cp
from dra_node_agent.cdi import CdiWriter, SpecTooLarge
from dra_node_agent.claim_reader import ClaimAllocation, ClaimError, ClaimGone, ClaimSource, describe
from dra_node_agent.device_setup import DeviceSetupError
from dra_node_agent.device_status import DeviceStatusWriter
from dra_node_agent.devices import TpuWorkers
from dra_node_agent.prepare.driver_node import DriverNode
from dra_node_agent.prepare.errors import PrepareError
from dra_node_agent.prepare.pause_points import PausePoints
from dra_node_agent.prepare.plan import Planner, PreparePlan
from dra_node_agent.prepare.records import answer, entry_ref
from dra_node_agent.prepare.set_up import DeviceSetUp

logger = logging.getLogger(__name__)


class ClaimSteps:
    """Prepares and unprepares one claim at a time; the caller serialises calls."""

    def __init__(
        self,
        *,
        node: DriverNode,
        claims: ClaimSource,
        store: cp.CheckpointStore,
        cdi: CdiWriter,
        planner: Planner,
        devices: DeviceSetUp,
        pauses: PausePoints,
        device_status: DeviceStatusWriter | None = None,
    ) -> None:
        self._node = node
        self._status = device_status
        self._claims = claims
        self._store = store
        self._cdi = cdi
        self._planner = planner
        self._devices = devices
        self._pauses = pauses

    async def prepare(self, claim: ClaimRef) -> tuple[PreparedDevice, ...]:
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
                await self._devices.roll_back(existing)
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
            workers = await self._tpu_workers(allocation, plan) if plan.results else None
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

        try:
            if plan.touches_devices:
                entry = await asyncio.to_thread(store.begin, claim, plan.results)
            try:
                entry, devices = await self._devices.set_up(entry, plan)
            except PrepareError:
                # Nothing of a failed set-up stays behind: undo what it did, forget the attempt.
                await self._devices.roll_back(entry)
                await asyncio.to_thread(store.remove, claim.uid)
                raise
            await self._pauses.reached("devices-set-up")

            try:
                ids = await asyncio.to_thread(
                    self._cdi.write_claim_spec,
                    claim_uid=claim.uid,
                    devices=devices,
                    inventory=self._node.inventory,
                    config=plan.tpu_config,
                    workers=workers,
                )
            except SpecTooLarge as exc:
                await self._devices.roll_back(entry)
                await asyncio.to_thread(store.remove, claim.uid)
                raise PrepareError(f"{describe(claim)}: {exc}") from exc
            await self._pauses.reached("cdi-written")

            by_device = {d.name: cdi_id for d, cdi_id in zip(devices, ids, strict=True)}
            # The recorded devices carry what set-up learned (a dynamic MIG instance's UUID).
            recorded = {p.device: p.mig_uuid for p in entry.devices}
            prepared = [
                dataclasses.replace(p, cdi_device_ids=(by_device[p.device],), mig_uuid=recorded.get(p.device))
                for p in plan.results
            ]
            done = await asyncio.to_thread(store.complete, claim.uid, prepared)
        except (cp.DeviceAlreadyPrepared, cp.CheckpointFull):
            # Another claim holds a device, or the checkpoint is at a bound: leave no trace of this attempt.
            await self._devices.roll_back(entry)
            await asyncio.to_thread(store.remove, claim.uid)
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
                    config=plan.tpu_config,
                    workers=workers,
                )
            except Exception:  # the claim is prepared: a status bug must not fail it
                logger.exception("recording the device status of %s failed", describe(claim))
        return answer(done)

    async def _tpu_workers(self, allocation: ClaimAllocation, plan: PreparePlan) -> TpuWorkers | None:
        """The multi-host worker identity of the claim's pod, when this is a TPU host of a multi-host
        slice and the claim has all its chips; None keeps the host's own (see ``tpu.multihost``)."""
        host = self._node.inventory.tpu_host
        resolver = self._node.tpu_workers
        if resolver is None or host is None:
            return None
        return await resolver.resolve(
            allocation=allocation, host=host, chips=len(plan.devices), config=plan.tpu_config
        )

    async def unprepare(self, claim: ClaimRef) -> None:
        entry = await asyncio.to_thread(self._store.get, claim.uid)
        if entry is None:
            logger.debug("%s is not prepared here; unprepare is a no-op", describe(claim))
            return
        await self._pauses.reached("unprepare-started")
        await self._devices.roll_back(entry, strict=True)
        await asyncio.to_thread(self._store.remove, claim.uid)
        if self._status is not None:
            try:
                self._status.unprepared(entry)
            except Exception:  # the claim is unprepared: a status bug must not fail it
                logger.exception("recording the device status of %s failed", describe(claim))
        logger.info("unprepared %s", describe(claim))

    async def clean_up_stale(self, cutoff: datetime) -> list[str]:
        """Unprepare ``PrepareStarted`` entries from before ``cutoff`` whose claim is gone; returns
        their UIDs. Entries whose claim still exists are kept: the kubelet retries those."""
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
                await self._devices.roll_back(entry, strict=True)
            except DeviceSetupError as exc:
                logger.warning("stale claim %s: %s; trying again later", describe(ref), exc)
                continue
            await asyncio.to_thread(self._store.remove, entry.uid)
            removed.append(entry.uid)
            logger.info("unprepared stale claim %s: it no longer exists", describe(ref))
        return removed
