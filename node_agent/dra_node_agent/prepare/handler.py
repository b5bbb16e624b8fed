"""NodePrepareResources / NodeUnprepareResources for one driver: the ``DRAHandler`` the plugin calls.

It serialises the calls, runs each claim through ``claim_steps.ClaimSteps`` and maps what failed
to the claim's error and a metric: errors stay per claim. A corrupt checkpoint refuses both calls,
claim by claim. With a ``DeviceStatusWriter`` the claims it prepares get ``status.devices`` entries;
at start it learns the claims prepared before from the checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from dra_api.kubeletapi.model import ClaimRef, PrepareResult
from dra_node_agent import checkpoint as cp
from dra_node_agent.cdi import CdiWriter, VendorEnv
from dra_node_agent.claim_messages import ClaimMessageLimiter
from dra_node_agent.claim_reader import ClaimError, ClaimSource, describe
from dra_node_agent.device_setup import DeviceSetupError, MigInstances, MpsControl, TimeSlicing
from dra_node_agent.device_status import DeviceStatusWriter
from dra_node_agent.devices import DiscoveredInventory
from dra_node_agent.opaqueconfig import OpaqueConfigParser
from dra_node_agent.prepare.claim_steps import ClaimSteps
from dra_node_agent.prepare.driver_node import DriverNode, TpuWorkerSource
from dra_node_agent.prepare.errors import PrepareError
from dra_node_agent.prepare.metrics import CHECKPOINT_ERRORS, OPERATION_ERRORS, PREPARE_SECONDS
from dra_node_agent.prepare.pause_points import PausePoints
from dra_node_agent.prepare.plan import Planner
from dra_node_agent.prepare.set_up import DeviceSetUp
from dra_node_agent.prepare.start_up import clean_up_files, reconcile_mig, reconcile_mps
from dra_node_agent.tenant_text import one_line

logger = logging.getLogger(__name__)

CHECKPOINT_FILE: Final = "checkpoint.json"


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
        vendor_env: VendorEnv | None = None,
        device_status: DeviceStatusWriter | None = None,
        max_prepared_claims: int = cp.DEFAULT_MAX_CLAIMS,
    ) -> None:
        self.driver = driver
        self.device_status = device_status
        self.node_name = node_name
        self.state_dir = state_dir
        self._node = DriverNode(
            driver=driver,
            node_name=node_name,
            inventory=inventory,
            gpu_sharing=gpu_sharing,
            mps=mps,
            dynamic_mig=dynamic_mig,
            tpu_workers=tpu_workers,
        )
        self.store = cp.CheckpointStore(
            state_dir / CHECKPOINT_FILE,
            proc_root / "sys/kernel/random/boot_id",
            driver=driver,
            max_claims=max_prepared_claims,
        )
        self.cdi = CdiWriter(driver=driver, cdi_dir=cdi_dir, node_name=node_name, vendor_env=vendor_env)
        self._devices = DeviceSetUp(self._node, self.store, self.cdi)
        self._steps = ClaimSteps(
            node=self._node,
            claims=claims,
            store=self.store,
            cdi=self.cdi,
            planner=Planner(self._node, config_parser or OpaqueConfigParser()),
            devices=self._devices,
            pauses=PausePoints(state_dir),
            device_status=device_status,
        )
        # The plugin serializes calls already; this keeps the handler safe when used directly.
        self._lock = asyncio.Lock()
        # A claim that fails every retry logs its failure once, not once per retry.
        self.failure_log = ClaimMessageLimiter(kind="log")

    # The tools are the shared DriverNode's, so one set here (as tests do) reaches every step.
    @property
    def gpu_sharing(self) -> TimeSlicing | None:
        return self._node.gpu_sharing

    @gpu_sharing.setter
    def gpu_sharing(self, tool: TimeSlicing | None) -> None:
        self._node.gpu_sharing = tool

    @property
    def mps(self) -> MpsControl[Any] | None:
        return self._node.mps

    @property
    def dynamic_mig(self) -> MigInstances | None:
        return self._node.dynamic_mig

    @property
    def tpu_workers(self) -> TpuWorkerSource | None:
        return self._node.tpu_workers

    @property
    def inventory(self) -> DiscoveredInventory:
        return self._node.inventory

    @property
    def device_setups(self) -> int:
        """Device set-ups done by this handler (a repeated prepare does none)."""
        return self._devices.count

    def set_inventory(self, inventory: DiscoveredInventory) -> None:
        """Use a newer discovery result for claims prepared from now on."""
        self._node.use_inventory(inventory)

    async def start(self) -> None:
        """Load the checkpoint and clean up what a crash or a reboot left behind."""
        await asyncio.to_thread(
            clean_up_files,
            driver=self.driver,
            state_dir=self.state_dir,
            store=self.store,
            cdi=self.cdi,
        )
        if self._node.mps is not None:
            await reconcile_mps(self.driver, self.store, self._node.mps)
        if self._node.dynamic_mig is not None:
            await reconcile_mig(self._node, self.store, self._node.dynamic_mig)
        if self.device_status is not None:
            try:
                prepared = await asyncio.to_thread(self.store.entries, cp.ClaimState.PREPARE_COMPLETED)
            except cp.CheckpointCorrupt:
                prepared = []  # reported already; nothing can be unprepared either until it is fixed
            self.device_status.seed(prepared, inventory=self._node.inventory)

    # --- DRAHandler ------------------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        async with self._lock:
            for claim in claims:
                began = time.perf_counter()
                try:
                    results[claim.uid] = PrepareResult(devices=await self._steps.prepare(claim))
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
                except cp.CheckpointFull as exc:
                    results[claim.uid] = self._failed(
                        "prepare", claim, f"{describe(claim)}: refused: {exc}", reason="checkpoint-full"
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
                    await self._steps.unprepare(claim)
                    errors[claim.uid] = ""
                    self.failure_log.forget(claim.uid)
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
        # The message may carry a tenant's text: one line, bounded, for the log and the kubelet.
        message = one_line(message)
        verdict = self.failure_log.allow(claim.uid, f"{operation} {message}")
        if verdict.allowed:
            logger.warning("%s of %s failed: %s%s", operation, describe(claim), message, verdict.suffix())
        return PrepareResult(error=message)

    # --- stale entries ---------------------------------------------------------------------

    async def clean_up_stale(self, *, older_than: float) -> list[str]:
        """Unprepare ``PrepareStarted`` entries older than ``older_than`` seconds whose claim is gone.

        A prepare that failed for good leaves such an entry; if its claim was then deleted (or
        replaced under the same name) no kubelet call will ever come for it. Entries whose claim
        still exists are kept: the kubelet retries those. Returns the UIDs cleaned up.
        """
        cutoff = datetime.now(UTC) - timedelta(seconds=older_than)
        async with self._lock:
            return await self._steps.clean_up_stale(cutoff)
