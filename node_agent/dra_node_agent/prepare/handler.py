"""NodePrepareResources / NodeUnprepareResources for one driver: the ``DRAHandler`` the plugin calls.

It runs each claim through ``claim_steps.ClaimSteps``, which orders the checkpoint, the device
set-up and the CDI spec under its lock, one claim at a time, and maps what failed to the claim's
error and a metric: errors stay per claim. A corrupt checkpoint refuses both calls, claim by claim.
With a ``DeviceStatusWriter`` the claims it prepares get ``status.devices`` entries; at start it
learns the claims prepared before from the checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from dra_api.kubeletapi.model import ClaimRef, PrepareResult
from dra_node_agent import checkpoint as cp
from dra_node_agent.cdi import CdiWriter, VendorEnv
from dra_node_agent.claim_context import ClaimContextSource
from dra_node_agent.claim_messages import ClaimMessageLimiter
from dra_node_agent.claim_reader import ClaimError, ClaimSource, describe
from dra_node_agent.device_setup import (
    DeviceSetupError,
    DomainMembership,
    MigInstances,
    MpsControl,
    Passthrough,
    TimeSlicing,
)
from dra_node_agent.device_status import DeviceStatusWriter
from dra_node_agent.devices import DiscoveredInventory
from dra_node_agent.opaqueconfig import OpaqueConfigParser
from dra_node_agent.prepare.claim_steps import ClaimSteps
from dra_node_agent.prepare.driver_node import DriverNode
from dra_node_agent.prepare.errors import PrepareError
from dra_node_agent.prepare.holds import Holds
from dra_node_agent.prepare.metrics import CHECKPOINT_ERRORS, OPERATION_ERRORS, PREPARE_SECONDS
from dra_node_agent.prepare.pause_points import PausePoints
from dra_node_agent.prepare.plan import Planner
from dra_node_agent.tenant_text import one_line

logger = logging.getLogger(__name__)

CHECKPOINT_FILE: Final = "checkpoint.json"
# How long a prepare waits for a compute-domain channel's domain to be ready on this node before it
# answers the kubelet with a retryable error: inside the kubelet's 45 s deadline for the call.
DEFAULT_READY_BUDGET_S: Final = 40.0


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
        claim_context: ClaimContextSource[Any] | None = None,
        gpu_sharing: TimeSlicing | None = None,
        mps: MpsControl[Any] | None = None,
        dynamic_mig: MigInstances | None = None,
        passthrough: Passthrough | None = None,
        vendor_env: VendorEnv[Any] | None = None,
        device_status: DeviceStatusWriter | None = None,
        max_prepared_claims: int = cp.DEFAULT_MAX_CLAIMS,
        domains: DomainMembership | None = None,
        ready_budget_s: float = DEFAULT_READY_BUDGET_S,
    ) -> None:
        self.driver = driver
        self.ready_budget_s = ready_budget_s
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
            passthrough=passthrough,
            claim_context=claim_context,
            domains=domains,
        )
        self.store = cp.CheckpointStore(
            state_dir / CHECKPOINT_FILE,
            proc_root / "sys/kernel/random/boot_id",
            driver=driver,
            max_claims=max_prepared_claims,
        )
        self.cdi = CdiWriter(driver=driver, cdi_dir=cdi_dir, node_name=node_name, vendor_env=vendor_env)
        # The steps alone write the checkpoint and the CDI specs; the two are here for the agent
        # (the checkpoint's path, its corruption reports) and for tests.
        self._steps = ClaimSteps(
            node=self._node,
            claims=claims,
            store=self.store,
            cdi=self.cdi,
            planner=Planner(self._node, config_parser or OpaqueConfigParser()),
            pauses=PausePoints(state_dir),
            device_status=device_status,
        )
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
    def claim_context(self) -> ClaimContextSource[Any] | None:
        return self._node.claim_context

    @property
    def domains(self) -> DomainMembership | None:
        return self._node.domains

    @property
    def inventory(self) -> DiscoveredInventory:
        return self._node.inventory

    @property
    def waits_for_readiness(self) -> bool:
        """Whether a prepare may wait, outside its lock, for something another prepare of this
        driver brings about (a channel for its domain's daemon, whose claim is this driver's too):
        then the kubelet's calls must not be serialised."""
        return self._node.domains is not None

    @property
    def device_setups(self) -> int:
        """Device set-ups done by this handler (a repeated prepare does none)."""
        return self._steps.devices.count

    @property
    def holds(self) -> Holds:
        """Which GPUs the prepared claims hold for passthrough, and which for containers."""
        return self._steps.holds

    def add_holds_listener(self, listener: Callable[[Holds], None]) -> None:
        """Call ``listener`` on the event loop when ``holds`` changes (it must return at once)."""
        self._steps.add_holds_listener(listener)

    def set_inventory(self, inventory: DiscoveredInventory) -> None:
        """Use a newer discovery result for claims prepared from now on."""
        self._node.use_inventory(inventory)

    async def start(self) -> None:
        """Load the checkpoint and clean up what a crash or a reboot left behind."""
        await self._steps.start_up(state_dir=self.state_dir)

    # --- DRAHandler ------------------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        for claim in claims:
            began = time.perf_counter()
            results[claim.uid] = await self._prepare_one(claim)
            PREPARE_SECONDS.labels(self.driver, "prepare").observe(time.perf_counter() - began)
        return results

    async def _prepare_one(self, claim: ClaimRef) -> PrepareResult:
        began = time.monotonic()
        try:
            devices = await self._steps.prepare(claim)
            try:
                await self._wait_ready(claim, budget_s=self.ready_budget_s - (time.monotonic() - began))
            except DeviceSetupError as exc:
                # Prepared, but what it joined is not ready on this node yet: the kubelet calls again.
                return self._failed("prepare", claim, f"{describe(claim)}: {exc}", reason="not-ready")
            return PrepareResult(devices=devices)
        except (PrepareError, ClaimError) as exc:
            return self._failed("prepare", claim, str(exc), reason="claim")
        except cp.CheckpointCorrupt as exc:
            return self._failed(
                "prepare",
                claim,
                f"{describe(claim)}: refused, the checkpoint is corrupt: {exc}",
                reason="checkpoint-corrupt",
            )
        except cp.DeviceAlreadyPrepared as exc:
            return self._failed("prepare", claim, f"{describe(claim)}: refused: {exc}", reason="device-busy")
        except cp.CheckpointFull as exc:
            return self._failed(
                "prepare", claim, f"{describe(claim)}: refused: {exc}", reason="checkpoint-full"
            )
        except OSError as exc:
            return self._failed(
                "prepare", claim, f"{describe(claim)}: writing state failed: {exc}", reason="io"
            )
        except Exception as exc:  # a bug must fail this claim only, with a trace in the log
            logger.exception("prepare of %s failed unexpectedly", describe(claim))
            return self._failed("prepare", claim, f"{describe(claim)}: {exc!r}", reason="internal")

    async def _wait_ready(self, claim: ClaimRef, *, budget_s: float) -> None:
        """Wait, outside the steps' lock, until the domains the claim's channels joined are ready on
        this node (``DomainMembership.wait_ready``); ``DeviceSetupError`` when the budget ran out."""
        domains = self._node.domains
        if domains is None:
            return
        entry = await asyncio.to_thread(self.store.get, claim.uid)
        kinds = {d.name: d.kind for d in self._node.inventory.devices}
        joined = sorted(
            {
                p.compute_domain
                for p in (entry.devices if entry else ())
                if p.compute_domain and kinds.get(p.device) == "channel"
            }
        )
        for domain in joined:
            await domains.wait_ready(claim=describe(claim), domain=domain, budget_s=max(0.0, budget_s))

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        errors: dict[str, str] = {}
        for claim in claims:
            began = time.perf_counter()
            errors[claim.uid] = await self._unprepare_one(claim)
            PREPARE_SECONDS.labels(self.driver, "unprepare").observe(time.perf_counter() - began)
        return errors

    async def _unprepare_one(self, claim: ClaimRef) -> str:
        try:
            await self._steps.unprepare(claim)
        except cp.CheckpointCorrupt as exc:
            return self._failed(
                "unprepare",
                claim,
                f"{describe(claim)}: refused, the checkpoint is corrupt: {exc}",
                reason="checkpoint-corrupt",
            ).error
        except OSError as exc:
            return self._failed(
                "unprepare", claim, f"{describe(claim)}: removing state failed: {exc}", reason="io"
            ).error
        except DeviceSetupError as exc:
            # The entry stays: the kubelet retries, and the reset with it.
            return self._failed(
                "unprepare",
                claim,
                f"{describe(claim)}: undoing its device set-up failed: {exc}",
                reason="device",
            ).error
        self.failure_log.forget(claim.uid)
        return ""

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
        return await self._steps.clean_up_stale(cutoff)
