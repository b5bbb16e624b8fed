"""NodePrepareResources / NodeUnprepareResources for one driver: the ``DRAHandler`` the plugin calls.

Prepare, per claim:
  1. already ``PrepareCompleted`` in the checkpoint -> the recorded answer, nothing re-written;
  2. GET the claim, check its UID, keep this driver's allocation results;
  3. map each result to a device this node published, validate this driver's opaque config
     (class entries, then claim entries, per request); for a TPU claim with every chip of a host of
     a multi-host slice, derive the pod's worker identity from its Job (``tpu.multihost``);
  4. a ``PrepareStarted`` entry left by a crash -> roll its partial work back first;
  5. record ``PrepareStarted`` (written while the claim is read, the two slow steps overlapping),
     set the devices up (a dynamic MIG placement's instance, recorded with its UUID before the CDI
     spec names it; a GpuConfig's time slice; its MPS daemon: the tools of ``device_setup``;
     the devices are recorded first), write the claim's CDI spec, record ``PrepareCompleted``; the checkpoint
     refuses a device held by another claim (unless both use admin access) before a device is
     touched, and at the latest at ``PrepareCompleted``, and a refused attempt leaves no trace;
  6. answer with the CDI device IDs per result.
Unprepare works from the checkpoint alone (the claim may be gone): tear down, remove the CDI spec,
drop the entry. Unknown UIDs are a no-op. A corrupt checkpoint refuses both, claim by claim.

Every file and checkpoint call runs in a thread (``asyncio.to_thread``). Errors stay per claim.

Fault injection for the tests: ``DRA_AGENT_TEST_PAUSE_AT`` names one point where a call stops:

- ``prepare-started``: ``PrepareStarted`` recorded, no device touched;
- ``devices-set-up``: devices set up, no CDI spec yet;
- ``cdi-written``: CDI spec written, not yet ``PrepareCompleted``;
- ``unprepare-started``: unprepare of a recorded claim, before anything is torn down or removed.

There the call writes ``<state dir>/paused-at-<point>`` and waits until that file is removed, so a
test can SIGKILL the agent exactly there (crash tests) or restart the kubelet and then let the call
go on (kubelet restart tests). Each point pauses once per handler, so a reissued call goes through.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Protocol

from prometheus_client import Counter, Histogram

from dra_api.kubeletapi.model import ClaimRef, PreparedDevice, PrepareResult
from dra_node_agent import checkpoint as cp
from dra_node_agent.cdi import CdiWriter
from dra_node_agent.claim_reader import ClaimAllocation, ClaimError, ClaimGone, ClaimSource, describe
from dra_node_agent.device_setup import DeviceSetupError, MigInstances, MpsControl, TimeSlicing
from dra_node_agent.devices import (
    ContainerEdits,
    DiscoveredDevice,
    DiscoveredInventory,
    TpuHostInfo,
    TpuWorkers,
)
from dra_node_agent.opaqueconfig import (
    GoogleTpuConfig,
    GpuConfig,
    MpsConfig,
    OpaqueConfigError,
    OpaqueConfigParser,
    RequestConfig,
    Sharing,
    TpuConfig,
    VfioDeviceConfig,
    effective_entry,
    not_implemented,
)

logger = logging.getLogger(__name__)

PAUSE_ENV: Final = "DRA_AGENT_TEST_PAUSE_AT"
PAUSE_POINTS: Final = ("prepare-started", "devices-set-up", "cdi-written", "unprepare-started")
PAUSE_POLL_SECONDS: Final = 0.1
CHECKPOINT_FILE: Final = "checkpoint.json"

PREPARE_SECONDS = Histogram(
    "dra_agent_claim_operation_seconds",
    "Time to prepare or unprepare one claim, by driver and operation.",
    ["driver", "operation"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
OPERATION_ERRORS = Counter(
    "dra_agent_claim_operation_errors_total",
    "Claims whose prepare or unprepare failed, by driver, operation and reason (claim: the claim or "
    "its config is wrong; device-busy; checkpoint-corrupt; io: state could not be written; internal).",
    ["driver", "operation", "reason"],
)
CHECKPOINT_ERRORS = Counter(
    "dra_agent_checkpoint_errors_total",
    "Failed reads (corrupt checkpoint) or writes of the prepared-claims checkpoint, by driver and operation.",
    ["driver", "operation"],
)
DEVICE_SETUPS = Counter(
    "dra_agent_device_setups_total",
    "Device set-ups done for prepared claims (a repeated prepare does none), by driver.",
    ["driver"],
)


class TpuWorkerSource(Protocol):
    """Multi-host TPU worker identity for a claim (``tpu.multihost.TpuWorkerResolver``); raises
    ``ClaimError`` when it cannot be told right."""

    async def resolve(
        self, *, allocation: ClaimAllocation, host: TpuHostInfo, chips: int, config: TpuConfig | None
    ) -> TpuWorkers | None: ...


class PrepareError(Exception):
    """A claim that cannot be prepared; the message names the claim and the reason."""


class PrepareHandler:
    """Prepares and unprepares one driver's claims on this node."""

    def __init__(
        self,
        *,
        driver: str,
        node_name: str,
        inventory: DiscoveredInventory,
        claims: ClaimSource,
        state_dir: Path,
        cdi_dir: Path,
        proc_root: Path = Path("/proc"),
        config_parser: OpaqueConfigParser | None = None,
        tpu_workers: TpuWorkerSource | None = None,
        gpu_sharing: TimeSlicing | None = None,
        mps: MpsControl[Any] | None = None,
        dynamic_mig: MigInstances | None = None,
    ) -> None:
        self.driver = driver
        # Creates and destroys the instances of dynamic MIG placements (GPU drivers in that mode).
        self.dynamic_mig = dynamic_mig
        # Runs a claim's MPS control daemon (GPU drivers); None: a config asking for MPS is refused.
        self.mps = mps
        # Applies GpuConfig time-slicing (GPU drivers); None: a config asking for it is refused.
        self.gpu_sharing = gpu_sharing
        # Derives the worker identity of a pod on a multi-host TPU slice from its Job (TPU drivers).
        self.tpu_workers = tpu_workers
        self.node_name = node_name
        self._inventory = inventory
        self._devices = inventory.by_name()
        self._claims = claims
        self.state_dir = state_dir
        self.store = cp.CheckpointStore(
            state_dir / CHECKPOINT_FILE,
            proc_root / "sys/kernel/random/boot_id",
            driver=driver,
        )
        self.cdi = CdiWriter(driver=driver, cdi_dir=cdi_dir, node_name=node_name)
        self._parser = config_parser or OpaqueConfigParser()
        # The plugin serializes calls already; this keeps the handler safe when used directly.
        self._lock = asyncio.Lock()
        self.device_setups = 0
        self._pause_at = os.environ.get(PAUSE_ENV, "")
        self._paused: set[str] = set()

    def set_inventory(self, inventory: DiscoveredInventory) -> None:
        """Use a newer discovery result for claims prepared from now on."""
        self._inventory = inventory
        self._devices = inventory.by_name()

    # --- start-up --------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the checkpoint and clean up what a crash or a reboot left behind."""
        await asyncio.to_thread(self._start_sync)
        if self.mps is not None:
            await self._reconcile_mps(self.mps)
        if self.dynamic_mig is not None:
            await self._reconcile_mig(self.dynamic_mig)

    async def _reconcile_mig(self, mig: MigInstances) -> None:
        """Destroy MIG instances on dynamic-MIG GPUs that no recorded claim holds: what a crash
        between creating one and recording it left (the kubelet's retry creates it again)."""
        try:
            entries = await asyncio.to_thread(self.store.entries)
        except cp.CheckpointCorrupt:
            return  # fail closed: nothing is touched
        held = {
            (placement.parent_uuid, placement.profile_id, placement.start)
            for entry in entries
            for p in entry.devices
            if p.dynamic_mig
            and (device := self._devices.get(p.device)) is not None
            and (placement := device.mig_placement) is not None
        }
        parents = sorted({d.mig_placement.parent_uuid for d in self._devices.values() if d.mig_placement})
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
                    self.driver,
                    instance.gi_id,
                    instance.profile_id,
                    instance.start,
                    instance.parent_uuid,
                )
                await asyncio.to_thread(mig.destroy_live, instance)
        except DeviceSetupError as exc:
            logger.error("driver %s: cleaning up MIG instances failed: %s", self.driver, exc)

    async def _reconcile_mps(self, mps: MpsControl[Any]) -> None:
        """Keep the daemons of prepared MPS claims (start again those that are gone, as after a
        restart of the agent's container), stop those of claims no longer recorded."""
        try:
            entries = await asyncio.to_thread(self.store.entries)
        except cp.CheckpointCorrupt:
            return  # fail closed, as for everything else: nothing is touched
        wanted = {e.uid: e for e in entries if any(d.mps for d in e.devices)}
        for uid in await asyncio.to_thread(mps.claims):
            if uid not in wanted:
                logger.info(
                    "driver %s: stopping the MPS daemon of claim %s, not in the checkpoint", self.driver, uid
                )
                await mps.stop(uid)
        for uid, entry in wanted.items():
            if entry.state != cp.ClaimState.PREPARE_COMPLETED or await asyncio.to_thread(mps.running, uid):
                continue  # an interrupted prepare is rolled back and redone by the kubelet's retry
            limits = await asyncio.to_thread(mps.recorded_limits, uid)
            if limits is None:
                logger.error(
                    "%s: its MPS daemon is gone and its settings with it", describe(entry_ref(entry))
                )
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

    def _start_sync(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        removed = self.store.remove_stale_temp_files() + self.cdi.remove_stale_temp_files()
        if removed:
            logger.info(
                "driver %s: removed %d temporary files left by an interrupted write", self.driver, removed
            )
        try:
            entries = self.store.load()
        except cp.CheckpointCorrupt as exc:
            # Fail closed: prepare and unprepare refuse until an operator looks at the file.
            CHECKPOINT_ERRORS.labels(self.driver, "read").inc()
            logger.error("driver %s: %s; prepare and unprepare will be refused", self.driver, exc)
            return
        for entry in self.store.invalidated:
            self.cdi.remove_claim_spec(entry.uid)
        known = {entry.uid for entry in entries}
        for uid in sorted(self.cdi.claim_uids() - known):
            # A spec without a checkpoint entry belongs to nothing prepared in this boot.
            logger.info("driver %s: removing CDI spec of claim %s, not in the checkpoint", self.driver, uid)
            self.cdi.remove_claim_spec(uid)
        logger.info(
            "driver %s: checkpoint %s holds %d claims (%d completed)",
            self.driver,
            self.store.path,
            len(entries),
            sum(1 for e in entries if e.state == cp.ClaimState.PREPARE_COMPLETED),
        )

    # --- DRAHandler ------------------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        async with self._lock:
            for claim in claims:
                began = time.perf_counter()
                try:
                    results[claim.uid] = PrepareResult(devices=await self._prepare_one(claim))
                except (PrepareError, ClaimError) as exc:
                    results[claim.uid] = self._failed("prepare", claim, str(exc), reason="claim")
                except cp.CheckpointCorrupt as exc:
                    results[claim.uid] = self._failed(
                        "prepare",
                        claim,
                        f"{describe(claim)}: refused, the checkpoint is corrupt: {exc}",
                        reason="checkpoint-corrupt",
                    )
                except cp.DeviceAlreadyPrepared as exc:
                    results[claim.uid] = self._failed(
                        "prepare", claim, f"{describe(claim)}: refused: {exc}", reason="device-busy"
                    )
                except OSError as exc:
                    results[claim.uid] = self._failed(
                        "prepare", claim, f"{describe(claim)}: writing state failed: {exc}", reason="io"
                    )
                except Exception as exc:  # a bug must fail this claim only, with a trace in the log
                    logger.exception("prepare of %s failed unexpectedly", describe(claim))
                    results[claim.uid] = self._failed(
                        "prepare", claim, f"{describe(claim)}: {exc!r}", reason="internal"
                    )
                PREPARE_SECONDS.labels(self.driver, "prepare").observe(time.perf_counter() - began)
        return results

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        errors: dict[str, str] = {}
        async with self._lock:
            for claim in claims:
                began = time.perf_counter()
                try:
                    await self._unprepare_one(claim)
                    errors[claim.uid] = ""
                except cp.CheckpointCorrupt as exc:
                    errors[claim.uid] = self._failed(
                        "unprepare",
                        claim,
                        f"{describe(claim)}: refused, the checkpoint is corrupt: {exc}",
                        reason="checkpoint-corrupt",
                    ).error
                except OSError as exc:
                    errors[claim.uid] = self._failed(
                        "unprepare", claim, f"{describe(claim)}: removing state failed: {exc}", reason="io"
                    ).error
                except DeviceSetupError as exc:
                    # The entry stays: the kubelet retries, and the reset with it.
                    errors[claim.uid] = self._failed(
                        "unprepare",
                        claim,
                        f"{describe(claim)}: undoing its device set-up failed: {exc}",
                        reason="device",
                    ).error
                PREPARE_SECONDS.labels(self.driver, "unprepare").observe(time.perf_counter() - began)
        return errors

    def _failed(self, operation: str, claim: ClaimRef, message: str, *, reason: str) -> PrepareResult:
        OPERATION_ERRORS.labels(self.driver, operation, reason).inc()
        if reason == "checkpoint-corrupt":
            CHECKPOINT_ERRORS.labels(self.driver, "read").inc()
        elif reason == "io":
            CHECKPOINT_ERRORS.labels(self.driver, "write").inc()
        logger.warning("%s of %s failed: %s", operation, describe(claim), message)
        return PrepareResult(error=message)

    # --- prepare ---------------------------------------------------------------------------

    async def _prepare_one(self, claim: ClaimRef) -> tuple[PreparedDevice, ...]:
        existing = await asyncio.to_thread(self.store.get, claim.uid)
        if existing is not None and existing.state == cp.ClaimState.PREPARE_COMPLETED:
            logger.debug("%s already prepared; answering from the checkpoint", describe(claim))
            return answer(existing)

        # PrepareStarted goes to disk while the claim is read: the GET and the checkpoint write are
        # the two slow steps and neither needs the other. The devices are recorded, and checked
        # against other claims, before any device is touched (``_touches_devices``) and at the
        # latest by PrepareCompleted, before the kubelet hears of them.
        reading = asyncio.ensure_future(self._claims.read(claim))
        try:
            if existing is not None:
                # PrepareStarted from an interrupted attempt: undo what it may have done, then redo.
                logger.info("%s: rolling back an interrupted prepare before redoing it", describe(claim))
                await self._roll_back(existing)
            entry = await asyncio.to_thread(self.store.begin, claim, ())
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
            planned, devices, tpu_config, mps_limits = self.plan(allocation)
            workers = await self._tpu_workers(allocation, devices, tpu_config) if planned else None
        except (ClaimError, PrepareError):
            await asyncio.to_thread(self.store.remove, claim.uid)  # nothing was done: forget it
            raise
        if not planned:
            await asyncio.to_thread(self.store.remove, claim.uid)
            logger.info("%s has no devices of driver %s; nothing to prepare", describe(claim), self.driver)
            return ()
        await self._pause("prepare-started")

        try:
            if self._touches_devices(planned):
                entry = await asyncio.to_thread(self.store.begin, claim, planned)
            try:
                entry, devices = await self._set_up(entry, devices, mps_limits)
            except PrepareError:
                # Nothing of a failed set-up stays behind: undo what it did, forget the attempt.
                await self._roll_back(entry)
                await asyncio.to_thread(self.store.remove, claim.uid)
                raise
            await self._pause("devices-set-up")

            ids = await asyncio.to_thread(
                self.cdi.write_claim_spec,
                claim_uid=claim.uid,
                devices=devices,
                inventory=self._inventory,
                config=tpu_config,
                workers=workers,
            )
            await self._pause("cdi-written")

            by_device = {d.name: cdi_id for d, cdi_id in zip(devices, ids, strict=True)}
            # The recorded devices carry what set-up learned (a dynamic MIG instance's UUID).
            recorded = {p.device: p.mig_uuid for p in entry.devices}
            prepared = [
                dataclasses.replace(p, cdi_device_ids=(by_device[p.device],), mig_uuid=recorded.get(p.device))
                for p in planned
            ]
            done = await asyncio.to_thread(self.store.complete, claim.uid, prepared)
        except cp.DeviceAlreadyPrepared:
            # Another claim holds a device: leave no trace of this attempt.
            await self._roll_back(entry)
            await asyncio.to_thread(self.store.remove, claim.uid)
            raise
        logger.info(
            "prepared %s: %s",
            describe(claim),
            ", ".join(f"{d.request}={d.pool}/{d.device}" for d in done.devices),
        )
        return answer(done)

    def plan(
        self, allocation: ClaimAllocation
    ) -> tuple[list[cp.CheckpointedDevice], list[DiscoveredDevice], TpuConfig | None, object | None]:
        """The checkpoint records for this driver's results, the distinct devices they use (with the
        container edits their configs add), the claim-wide `tpu.google.com` TpuConfig and the
        claim's MPS daemon settings, if any.

        Raises ``PrepareError`` for a device this node does not publish, an invalid config, or a
        valid config whose effect this driver does not implement yet.
        """
        where = describe(allocation.ref)
        try:
            configs = self._parser.for_driver(
                driver=self.driver,
                configs=allocation.config_entries,
                where=f"{where}: status.allocation.devices",
            )
        except OpaqueConfigError as exc:
            raise PrepareError(f"invalid opaque config: {exc}") from exc
        for rc in configs:
            # No VFIO device is ever published here, so such a config can never take effect: asking
            # for passthrough must fail rather than hand out a device bound to its usual driver.
            if isinstance(rc.config, VfioDeviceConfig):
                raise PrepareError(f"{rc.where}: {not_implemented(rc.config)}")
        planned: list[cp.CheckpointedDevice] = []
        devices: dict[str, DiscoveredDevice] = {}
        claim_env: dict[str, str] = {}
        tpu_configs: dict[TpuConfig, str] = {}
        mps_configs: list[tuple[MpsConfig, list[str]]] = []
        mps_devices: dict[str, DiscoveredDevice] = {}
        for result in allocation.devices:
            device = self._devices.get(result.device)
            if result.pool != self.node_name or device is None:
                raise PrepareError(
                    f"{where}: allocated device {result.pool}/{result.device} of driver {self.driver} "
                    f"is not published by node {self.node_name}"
                )
            if device.mig_placement is not None and self.dynamic_mig is None:
                raise PrepareError(
                    f"{where}: device {device.name} is a dynamic MIG placement, but dynamic MIG is off "
                    "on this node (--dynamic-mig=false)"
                )
            device, sharing = self._apply_config(
                configs,
                request=result.request,
                device=device,
                where=where,
                claim_env=claim_env,
                tpu_configs=tpu_configs,
            )
            time_slice = sharing.time_slice_interval if sharing is not None else None
            if sharing is not None and sharing.mps is not None:
                same = next((pair for pair in mps_configs if pair[0] == sharing.mps), None)
                if same is None:
                    mps_configs.append((sharing.mps, [result.request]))
                else:
                    same[1].append(result.request)
                mps_devices.setdefault(device.name, device)
            planned.append(
                cp.CheckpointedDevice(
                    request=result.request,
                    pool=result.pool,
                    device=result.device,
                    admin_access=result.admin_access,
                    shared=result.shared,
                    share_id=result.share_id,
                    time_slice=time_slice,
                    mps=sharing is not None and sharing.mps is not None,
                    dynamic_mig=device.mig_placement is not None,
                )
            )
            devices.setdefault(device.name, device)
        if len(tpu_configs) > 1:
            # Its settings become container-wide environment: two values would leave the outcome to
            # the order in which the runtime applies CDI devices.
            raise PrepareError(
                f"{where}: conflicting TPU configs within the claim: the {TpuConfig.GROUP} TpuConfig "
                f"entries {', '.join(sorted(tpu_configs.values()))} differ, but they apply to the whole "
                "container"
            )
        mps_limits = self._mps_limits(allocation, mps_configs, list(mps_devices.values()), devices)
        return planned, list(devices.values()), next(iter(tpu_configs), None), mps_limits

    def _mps_limits(
        self,
        allocation: ClaimAllocation,
        configs: Sequence[tuple[MpsConfig, list[str]]],
        gpus: Sequence[DiscoveredDevice],
        devices: dict[str, DiscoveredDevice],
    ) -> object | None:
        """One daemon serves the claim: its settings, and its folders and limits added to the
        container edits of the claim's first MPS GPU (``devices`` is updated)."""
        if not configs:
            return None
        where = describe(allocation.ref)
        requests = sorted({r for _, rs in configs for r in rs})
        if len(configs) > 1:
            raise PrepareError(
                f"{where}: requests {', '.join(requests)}: their GpuConfig sharing.mpsConfig entries differ, "
                "but one MPS control daemon serves the whole claim; give them the same mpsConfig"
            )
        assert self.mps is not None  # _apply_config refused MPS without it
        ((config, _),) = configs
        try:
            limits: object = self.mps.limits(
                config, gpus, where=f"request {', '.join(requests)}: GpuConfig sharing.mpsConfig"
            )
        except DeviceSetupError as exc:
            raise PrepareError(f"{where}: {exc}") from exc
        first = min(gpus, key=lambda d: d.pci_bus_id or d.name).name
        device = devices[first]
        devices[first] = dataclasses.replace(
            device, edits=device.edits.merged(self.mps.edits(allocation.ref.uid, limits))
        )
        return limits

    async def _tpu_workers(
        self, allocation: ClaimAllocation, devices: Sequence[DiscoveredDevice], config: TpuConfig | None
    ) -> TpuWorkers | None:
        """The multi-host worker identity of the claim's pod, when this is a TPU host of a multi-host
        slice and the claim has all its chips; None keeps the host's own (see ``tpu.multihost``)."""
        host = self._inventory.tpu_host
        if self.tpu_workers is None or host is None:
            return None
        return await self.tpu_workers.resolve(
            allocation=allocation, host=host, chips=len(devices), config=config
        )

    def _apply_config(
        self,
        configs: Sequence[RequestConfig],
        *,
        request: str,
        device: DiscoveredDevice,
        where: str,
        claim_env: dict[str, str],
        tpu_configs: dict[TpuConfig, str],
    ) -> tuple[DiscoveredDevice, Sharing | None]:
        """Carry out the config that applies to one device: the device, with the edits it adds, and
        the sharing a GpuConfig asks for on it (set up later, by ``_set_up``).

        Each API group's entries are resolved on their own (the two TPU groups set different
        things). A config this driver cannot carry out fails the prepare with the reason.
        """
        env: list[str] = []
        sharing: Sharing | None = None
        for group in sorted({rc.config.GROUP for rc in configs}):
            try:
                entry = effective_entry(
                    configs, request=request, device_kind=device.kind, device_name=device.name, group=group
                )
            except OpaqueConfigError as exc:
                raise PrepareError(str(exc)) from exc
            if entry is None:
                continue
            reason = not_implemented(entry.config)
            if reason is not None:
                raise PrepareError(f"{entry.where}: {reason} (request {request}, device {device.name})")
            config = entry.config
            if isinstance(config, GoogleTpuConfig):
                env.extend(config.env())
            elif isinstance(config, TpuConfig):
                tpu_configs.setdefault(config, entry.where)
            elif isinstance(config, GpuConfig) and config.sharing is not None:
                sharing = config.sharing
                if sharing.time_slice_interval is not None and self.gpu_sharing is None:
                    raise PrepareError(
                        f"{entry.where}: GpuConfig sharing.strategy TimeSlicing: this driver's GPUs cannot "
                        f"be time-sliced here (no NVML) (request {request}, device {device.name})"
                    )
                if sharing.mps is not None and self.mps is None:
                    raise PrepareError(
                        f"{entry.where}: GpuConfig sharing.strategy MPS: MPS is off on this node "
                        f"(--mps-support=false) (request {request}, device {device.name})"
                    )
            # GpuConfig and MigDeviceConfig without sharing ask for nothing beyond the default.
            logger.debug("request %s device %s: %s applies", request, device.name, entry.where)
        for item in env:
            name, value = item.split("=", 1)
            previous = claim_env.setdefault(name, value)
            if previous != value:
                # Same rule as Google's driver: the variable acts on the whole container.
                raise PrepareError(
                    f"{where}: conflicting TPU configs within the claim: {name} is set to both {previous!r} "
                    f"and {value!r}, but it applies to the whole container"
                )
        if not env:
            return device, sharing
        edited = dataclasses.replace(device, edits=device.edits.merged(ContainerEdits(env=tuple(env))))
        return edited, sharing

    def _touches_devices(self, planned: Sequence[cp.CheckpointedDevice]) -> bool:
        """Whether ``_set_up`` changes device state (then the devices are recorded before it runs, so
        a crash in between leaves an entry that says what to undo)."""
        return any(p.time_slice is not None or p.mps or p.dynamic_mig for p in planned)

    async def _set_up(
        self, entry: cp.ClaimEntry, devices: Sequence[DiscoveredDevice], mps_limits: object | None = None
    ) -> tuple[cp.ClaimEntry, list[DiscoveredDevice]]:
        """Device-side preparation: dynamic MIG instances, then the time slices and the MPS daemon
        the claim's GpuConfig asks for. Returns the entry and the devices as the CDI spec must name
        them (a dynamic MIG device with its instance's UUID and nodes)."""
        self.device_setups += 1
        DEVICE_SETUPS.labels(self.driver).inc()
        entry, ready = await self._set_up_migs(entry, devices)
        await self._set_up_time_slices(entry, ready)
        if mps_limits is not None:
            assert self.mps is not None
            try:
                await self.mps.start(entry.uid, mps_limits)
            except DeviceSetupError as exc:
                requests = sorted({p.request for p in entry.devices if p.mps})
                raise PrepareError(
                    f"{describe(entry_ref(entry))}: request {', '.join(requests)}: GpuConfig "
                    f"sharing.strategy MPS: {exc}"
                ) from exc
        return entry, ready

    async def _set_up_migs(
        self, entry: cp.ClaimEntry, devices: Sequence[DiscoveredDevice]
    ) -> tuple[cp.ClaimEntry, list[DiscoveredDevice]]:
        """Create the instance of each dynamic MIG placement and record its UUID before the CDI spec
        names it, so a crash from here on leaves an entry that says what to destroy."""
        if not any(d.mig_placement is not None for d in devices):
            return entry, list(devices)
        assert self.dynamic_mig is not None  # plan() refused such devices without it
        ready: list[DiscoveredDevice] = []
        uuids: dict[str, str] = {}
        for device in devices:
            if device.mig_placement is None:
                ready.append(device)
                continue
            try:
                instance = await asyncio.to_thread(self.dynamic_mig.create, device.mig_placement)
            except DeviceSetupError as exc:
                requests = sorted({p.request for p in entry.devices if p.device == device.name})
                where = f"{describe(entry_ref(entry))}: request {', '.join(requests)}"
                raise PrepareError(f"{where}: device {device.name}: {exc}") from exc
            uuids[device.name] = instance.uuid
            ready.append(await asyncio.to_thread(self.dynamic_mig.edits, device, instance))
        recorded = [dataclasses.replace(p, mig_uuid=uuids.get(p.device, p.mig_uuid)) for p in entry.devices]
        entry = await asyncio.to_thread(self.store.begin, entry_ref(entry), recorded)
        return entry, ready

    async def _set_up_time_slices(self, entry: cp.ClaimEntry, devices: Sequence[DiscoveredDevice]) -> None:
        wanted = {p.device: p for p in entry.devices if p.time_slice is not None}
        if not wanted:
            return
        assert self.gpu_sharing is not None  # plan() refused time-slicing without it
        others = await asyncio.to_thread(self.store.entries)
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
                await self.gpu_sharing.set_time_slice(uuids, interval)
            except DeviceSetupError as exc:
                requests = sorted({p.request for p in wanted.values() if p.time_slice == interval})
                raise PrepareError(
                    f"{describe(entry_ref(entry))}: request {', '.join(requests)}: GpuConfig "
                    f"sharing.timeSlicingConfig.interval {interval} could not be applied: {exc}"
                ) from exc

    async def _tear_down(self, entry: cp.ClaimEntry) -> None:
        """Undo ``_set_up``; must be safe on devices that were never set up (a reset to Default is).

        A GPU's time slice goes back to Default when no other recorded claim holds it with one.
        """
        if self.mps is not None:
            await self.mps.stop(entry.uid)  # nothing to do for a claim without a daemon
        await self._tear_down_migs(entry)
        sliced = {p.device for p in entry.devices if p.time_slice is not None}
        if not sliced or self.gpu_sharing is None:
            return
        others = await asyncio.to_thread(self.store.entries)
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
            if (device := self._devices.get(name)) is not None
        ]
        if uuids:
            await self.gpu_sharing.reset_time_slice(uuids)

    async def _tear_down_migs(self, entry: cp.ClaimEntry) -> None:
        """Destroy the instances of the claim's dynamic MIG placements (found by placement: one that
        was never created, or already destroyed, is no error)."""
        for prepared in entry.devices:
            if not prepared.dynamic_mig:
                continue
            device = self._devices.get(prepared.device)
            if device is None or device.mig_placement is None or self.dynamic_mig is None:
                logger.error(
                    "%s: device %s was a dynamic MIG placement, but this node no longer publishes it in "
                    "that mode; its instance (%s) is left for the start-up clean-up",
                    describe(entry_ref(entry)),
                    prepared.device,
                    prepared.mig_uuid or "never created",
                )
                continue
            await asyncio.to_thread(self.dynamic_mig.destroy, device.mig_placement)

    async def _roll_back(self, entry: cp.ClaimEntry, *, strict: bool = False) -> None:
        """Tear down and remove the CDI spec. A device that cannot be reset raises ``DeviceSetupError``
        when ``strict`` (unprepare, which the kubelet retries); otherwise it is logged and left."""
        try:
            await self._tear_down(entry)
        except DeviceSetupError as exc:
            if strict:
                raise
            logger.warning("%s: undoing its device set-up failed: %s", describe(entry_ref(entry)), exc)
        await asyncio.to_thread(self.cdi.remove_claim_spec, entry.uid)

    async def _pause(self, point: str) -> None:
        if self._pause_at != point or point in self._paused:
            return
        # Once only: the call the kubelet reissues after the paused one must go through.
        self._paused.add(point)
        marker = self.state_dir / f"paused-at-{point}"
        await asyncio.to_thread(marker.write_text, f"{os.getpid()}\n")
        logger.warning("test fault injection: pausing at %s until %s is removed", point, marker)
        # Polled: the marker is the only channel a test has into the agent process.
        while True:
            await asyncio.sleep(PAUSE_POLL_SECONDS)
            if not await asyncio.to_thread(marker.exists):
                break
        logger.warning("test fault injection: going on from %s", point)

    # --- stale entries ---------------------------------------------------------------------

    async def clean_up_stale(self, *, older_than: float) -> list[str]:
        """Unprepare ``PrepareStarted`` entries older than ``older_than`` seconds whose claim is gone.

        A prepare that failed for good leaves such an entry; if its claim was then deleted (or
        replaced under the same name) no kubelet call will ever come for it. Entries whose claim
        still exists are kept: the kubelet retries those. Returns the UIDs cleaned up.
        """
        cutoff = datetime.now(UTC) - timedelta(seconds=older_than)
        removed: list[str] = []
        async with self._lock:
            try:
                stale = await asyncio.to_thread(self.store.started_before, cutoff)
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
                await asyncio.to_thread(self.store.remove, entry.uid)
                removed.append(entry.uid)
                logger.info("unprepared stale claim %s: it no longer exists", describe(ref))
        return removed

    # --- unprepare -------------------------------------------------------------------------

    async def _unprepare_one(self, claim: ClaimRef) -> None:
        entry = await asyncio.to_thread(self.store.get, claim.uid)
        if entry is None:
            logger.debug("%s is not prepared here; unprepare is a no-op", describe(claim))
            return
        await self._pause("unprepare-started")
        await self._roll_back(entry, strict=True)
        await asyncio.to_thread(self.store.remove, claim.uid)
        logger.info("unprepared %s", describe(claim))


def entry_ref(entry: cp.ClaimEntry) -> ClaimRef:
    return ClaimRef(namespace=entry.namespace, name=entry.name, uid=entry.uid)


def answer(entry: cp.ClaimEntry) -> tuple[PreparedDevice, ...]:
    """The kubelet's answer for a recorded claim: one device per allocation result."""
    return tuple(
        PreparedDevice(
            requests=(d.request,),
            pool=d.pool,
            device=d.device,
            cdi_device_ids=d.cdi_device_ids,
            share_id=d.share_id,
        )
        for d in entry.devices
    )
