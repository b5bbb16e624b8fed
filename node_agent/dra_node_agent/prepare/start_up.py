"""At start-up, clean up what a crash or a reboot left behind: temporary files, the CDI specs of
claims the checkpoint does not hold, MIG instances and MPS daemons of no recorded claim, GPUs an
interrupted prepare took for passthrough."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from dra_node_agent import checkpoint as cp
from dra_node_agent.cdi import CdiWriter
from dra_node_agent.claim_reader import describe
from dra_node_agent.device_setup import DeviceSetupError, MigInstances, MpsControl, Passthrough
from dra_node_agent.prepare.driver_node import DriverNode
from dra_node_agent.prepare.metrics import CHECKPOINT_ERRORS
from dra_node_agent.prepare.records import entry_ref

logger = logging.getLogger(__name__)


def clean_up_files(*, driver: str, state_dir: Path, store: cp.CheckpointStore, cdi: CdiWriter) -> None:
    """Load the checkpoint; remove temporary files and the CDI specs of claims it does not hold.
    Blocks: run it in a thread."""
    state_dir.mkdir(parents=True, exist_ok=True)
    removed = store.remove_stale_temp_files() + cdi.remove_stale_temp_files()
    if removed:
        logger.info("driver %s: removed %d temporary files left by an interrupted write", driver, removed)
    try:
        entries = store.load()
    except cp.CheckpointCorrupt as exc:
        # Fail closed: prepare and unprepare refuse until an operator looks at the file.
        CHECKPOINT_ERRORS.labels(driver, "read").inc()
        logger.error("driver %s: %s; prepare and unprepare will be refused", driver, exc)
        return
    for entry in store.invalidated:
        cdi.remove_claim_spec(entry.uid)
    known = {entry.uid for entry in entries}
    for uid in sorted(cdi.claim_uids() - known):
        # A spec without a checkpoint entry belongs to nothing prepared in this boot.
        logger.info("driver %s: removing CDI spec of claim %s, not in the checkpoint", driver, uid)
        cdi.remove_claim_spec(uid)
    logger.info(
        "driver %s: checkpoint %s holds %d claims (%d completed)",
        driver,
        store.path,
        len(entries),
        sum(1 for e in entries if e.state == cp.ClaimState.PREPARE_COMPLETED),
    )


async def reconcile_mig(node: DriverNode, store: cp.CheckpointStore, mig: MigInstances) -> None:
    """Destroy MIG instances on dynamic-MIG GPUs that no recorded claim holds: what a crash
    between creating one and recording it left (the kubelet's retry creates it again)."""
    try:
        entries = await asyncio.to_thread(store.entries)
    except cp.CheckpointCorrupt:
        return  # fail closed: nothing is touched
    held = {
        (placement.parent_uuid, placement.profile_id, placement.start)
        for entry in entries
        for p in entry.devices
        if p.dynamic_mig
        and (device := node.devices.get(p.device)) is not None
        and (placement := device.mig_placement) is not None
    }
    parents = sorted({d.mig_placement.parent_uuid for d in node.devices.values() if d.mig_placement})
    if not parents:
        return
    try:
        live = await asyncio.to_thread(mig.live, parents)
        for instance in live:
            if (instance.parent_uuid, instance.profile_id, instance.start) in held:
                continue
            logger.warning(
                "driver %s: destroying MIG GPU instance %d (profile %d at memory slice %d) of GPU %s: "
                "no claim in the checkpoint holds it",
                node.driver,
                instance.gi_id,
                instance.profile_id,
                instance.start,
                instance.parent_uuid,
            )
            await asyncio.to_thread(mig.destroy_live, instance)
    except DeviceSetupError as exc:
        logger.error("driver %s: cleaning up MIG instances failed: %s", node.driver, exc)


async def reconcile_mps(driver: str, store: cp.CheckpointStore, mps: MpsControl[Any]) -> None:
    """Keep the daemons of prepared MPS claims (start again those that are gone, as after a
    restart of the agent's container), stop those of claims no longer recorded."""
    try:
        entries = await asyncio.to_thread(store.entries)
    except cp.CheckpointCorrupt:
        return  # fail closed, as for everything else: nothing is touched
    wanted = {e.uid: e for e in entries if any(d.mps for d in e.devices)}
    for uid in await asyncio.to_thread(mps.claims):
        if uid not in wanted:
            logger.info("driver %s: stopping the MPS daemon of claim %s, not in the checkpoint", driver, uid)
            await mps.stop(uid)
    for uid, entry in wanted.items():
        if entry.state != cp.ClaimState.PREPARE_COMPLETED or await asyncio.to_thread(mps.running, uid):
            continue  # an interrupted prepare is rolled back and redone by the kubelet's retry
        limits = await asyncio.to_thread(mps.recorded_limits, uid)
        if limits is None:
            logger.error("%s: its MPS daemon is gone and its settings with it", describe(entry_ref(entry)))
            continue
        logger.warning(
            "%s: its MPS control daemon is gone (the agent's container restarted?); starting it again, "
            "CUDA processes that were connected to it must be restarted",
            describe(entry_ref(entry)),
        )
        try:
            await mps.start(uid, limits)
        except DeviceSetupError as exc:
            logger.error("%s: starting its MPS daemon again failed: %s", describe(entry_ref(entry)), exc)


async def reconcile_passthrough(driver: str, store: cp.CheckpointStore, tool: Passthrough) -> None:
    """Give back to the NVIDIA driver the GPUs an interrupted prepare took for passthrough (a crash
    between two binding steps leaves a GPU no driver holds); the kubelet's retry takes them again.
    Prepared claims keep theirs: their virtual machines run on."""
    try:
        entries = await asyncio.to_thread(store.entries, cp.ClaimState.PREPARE_STARTED)
    except cp.CheckpointCorrupt:
        return  # fail closed: nothing is touched
    for entry in entries:
        for device in entry.devices:
            if device.vfio is None:
                continue
            logger.warning(
                "%s: its prepare was interrupted; giving GPU %s (device %s) back to the NVIDIA driver",
                describe(entry_ref(entry)),
                device.vfio.pci_bus_id,
                device.device,
            )
            try:
                await asyncio.to_thread(tool.restore, device.vfio)
            except DeviceSetupError as exc:
                logger.error("driver %s: %s", driver, exc)
