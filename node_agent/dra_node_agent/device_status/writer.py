"""Writes the ``status.devices`` entries of one driver's prepared claims, in the background.

Prepare (after it succeeded), unprepare and the health monitor only say what changed (``prepared``,
``unprepared``, ``devices_changed``) and return at once: a claim is marked dirty and one task per
claim makes the server match what this writer holds now. That task reads the claim, sets this
driver's entries (a ``Ready`` condition from the device's health now, and its data) or removes them,
keeps every other entry, and PUTs ``/status`` with the resourceVersion it read; a 409 starts over
from a fresh read. Timeouts, connection errors, 429 and 5xx are retried with a growing delay until
the write is done; several changes while a write is under way make one more write, not several.
At most ``concurrency`` claims are written at once.

What ends a claim's writes without retrying: the claim is gone (404) or replaced (another UID),
not allocated (the API server keeps no entries then), or the server rejected the content (4xx,
logged). What ends all of them: ``StatusSupport`` (the field is dropped, or RBAC refuses).

After a restart ``seed`` takes the prepared claims from the checkpoint. Their data is rebuilt
without what prepare alone knew (the vendor's context of the claim: a TPU pod's worker identity),
so data already on the server stays.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from prometheus_client import Counter

from dra_api import times
from dra_api.aiotasks import BackgroundTasks
from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent.checkpoint import CheckpointedDevice, ClaimEntry, ClaimState
from dra_node_agent.claim_reader import describe
from dra_node_agent.device_status.claim_api import TRANSPORT_ERRORS, ClaimStatusApi, HttpError, error_message
from dra_node_agent.device_status.conditions import readiness
from dra_node_agent.device_status.data import VendorStatusData, claim_device_data
from dra_node_agent.device_status.entries import (
    DesiredEntry,
    EntryKey,
    allocated_keys,
    current_entries,
    merged_entries,
)
from dra_node_agent.device_status.support import StatusSupport
from dra_node_agent.devices import DiscoveredDevice, DiscoveredInventory
from dra_node_agent.health.state import DeviceHealthState
from dra_node_agent.opaqueconfig import DriverConfig

logger = logging.getLogger(__name__)

STATUS_WRITES = Counter(
    "dra_agent_device_status_writes_total",
    "Writes of ResourceClaim status.devices, by driver and result (written, error).",
    ["driver", "result"],
)

# At stop, writes still under way get this many seconds before they are cancelled.
STOP_GRACE: Final = 5.0
_RETRIED_STATUS: Final = frozenset({429, 500, 502, 503, 504})


class HealthView(Protocol):
    """The health monitor as this writer reads it (``health.HealthMonitor``)."""

    def states(self) -> Mapping[str, DeviceHealthState]: ...


@dataclass(frozen=True)
class _Device:
    key: EntryKey
    name: str
    data: Mapping[str, Any]


@dataclass(frozen=True)
class _Prepared:
    ref: ClaimRef
    devices: tuple[_Device, ...]
    data_known: bool


@dataclass(frozen=True)
class _Removal:
    ref: ClaimRef
    keys: frozenset[EntryKey]


class _Transient(Exception):
    """Worth another try later."""


def _ref(entry: ClaimEntry) -> ClaimRef:
    return ClaimRef(namespace=entry.namespace, name=entry.name, uid=entry.uid)


class DeviceStatusWriter:
    """One driver's writer; its methods run on the event loop."""

    def __init__(
        self,
        *,
        driver: str,
        api: ClaimStatusApi,
        support: StatusSupport | None = None,
        vendor: VendorStatusData[Any] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        retry_delay: float = 0.5,
        max_retry_delay: float = 60.0,
        conflict_attempts: int = 5,
        concurrency: int = 4,
    ) -> None:
        self.driver = driver
        self._api = api
        self.support = support or StatusSupport()
        self._vendor = vendor
        self._clock = clock
        self._sleep = sleep
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self._conflict_attempts = max(1, conflict_attempts)
        self._health: HealthView | None = None
        self._prepared: dict[str, _Prepared] = {}
        self._removals: dict[str, _Removal] = {}
        self._dirty: set[str] = set()
        self._running: set[str] = set()
        self._rejected: set[str] = set()
        self._tasks = BackgroundTasks()
        # A few writes at a time: a burst (a restart's rewrite of every claim) must not take the
        # API client's connections from prepare's own claim reads.
        self._slots = asyncio.Semaphore(max(1, concurrency))
        self._started = False

    # --- what happened ---------------------------------------------------------------------------

    def use_health(self, health: HealthView | None) -> None:
        """Follow ``health`` for the Ready conditions (None: the driver's health is not watched)."""
        self._health = health
        self.devices_changed([d.name for claim in self._prepared.values() for d in claim.devices])

    def prepared(
        self,
        entry: ClaimEntry,
        *,
        devices: Sequence[DiscoveredDevice],
        inventory: DiscoveredInventory,
        config: DriverConfig | None = None,
        context: Any = None,
    ) -> None:
        """A claim was prepared (``entry`` is PrepareCompleted); ``devices`` as prepare set them up,
        ``config`` and ``context`` as prepare had them (``claim_context``)."""
        if not self.support.enabled(self.driver):
            return
        data = claim_device_data(
            entry.devices,
            devices={d.name: d for d in devices},
            inventory=inventory,
            vendor=self._vendor,
            config=config,
            context=context,
        )
        self._prepared[entry.uid] = self._tracked(entry, data, data_known=True)
        self._removals.pop(entry.uid, None)
        self._schedule(entry.uid)

    def unprepared(self, entry: ClaimEntry) -> None:
        """A claim was unprepared: its entries go."""
        self._prepared.pop(entry.uid, None)
        if not self.support.enabled(self.driver):
            return
        self._removals[entry.uid] = _Removal(
            ref=_ref(entry), keys=frozenset(self._key(p) for p in entry.devices)
        )
        self._schedule(entry.uid)

    def seed(self, entries: Iterable[ClaimEntry], *, inventory: DiscoveredInventory) -> None:
        """The claims an earlier run prepared (from the checkpoint); written once ``start`` runs."""
        if not self.support.enabled(self.driver):
            return
        devices = inventory.by_name()
        for entry in entries:
            if entry.state is not ClaimState.PREPARE_COMPLETED or entry.uid in self._prepared:
                continue
            data = claim_device_data(entry.devices, devices=devices, inventory=inventory, vendor=self._vendor)
            self._prepared[entry.uid] = self._tracked(entry, data, data_known=False)
            self._schedule(entry.uid)

    def devices_changed(self, names: Iterable[str]) -> None:
        """The health of ``names`` changed: rewrite the claims holding them (a health listener)."""
        changed = set(names)
        for uid, claim in self._prepared.items():
            if any(d.name in changed for d in claim.devices):
                self._schedule(uid)

    # --- running -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin writing. What was recorded before (the checkpoint's claims) waits until now, so the
        agent calls this once the health monitor is attached and the conditions can follow it."""
        self._started = True
        for uid in sorted(self._dirty - self._running):
            self._spawn(uid)

    async def stop(self, *, grace: float = STOP_GRACE) -> None:
        """Give writes under way ``grace`` seconds, then cancel them; nothing starts after this."""
        self._started = False
        await self._tasks.drain(grace=grace)

    async def join(self) -> None:
        """Wait until no write is under way (tests)."""
        await self._tasks.join()

    def _schedule(self, uid: str) -> None:
        if not self.support.enabled(self.driver):
            return
        self._dirty.add(uid)
        if self._started and uid not in self._running:
            self._spawn(uid)

    def _spawn(self, uid: str) -> None:
        self._running.add(uid)
        self._tasks.spawn(self._work(uid), name=f"device-status-{self.driver}-{uid}")

    async def _work(self, uid: str) -> None:
        failures = 0
        try:
            while uid in self._dirty and self.support.enabled(self.driver):
                self._dirty.discard(uid)
                try:
                    async with self._slots:
                        await self._sync(uid)
                    failures = 0
                except _Transient as exc:
                    STATUS_WRITES.labels(self.driver, "error").inc()
                    failures += 1
                    self._dirty.add(uid)
                    delay = min(self._max_retry_delay, self._retry_delay * 2 ** (failures - 1))
                    log = logger.warning if failures == 1 or failures % 10 == 0 else logger.debug
                    log(
                        "writing the device status of claim %s (driver %s) failed (%s), attempt %d; "
                        "retrying in %g s",
                        uid,
                        self.driver,
                        exc,
                        failures,
                        delay,
                    )
                    await self._sleep(delay)
        finally:
            self._running.discard(uid)

    # --- one write ---------------------------------------------------------------------------------

    async def _sync(self, uid: str) -> None:
        """Make the claim's entries of this driver what this writer holds now."""
        for _ in range(self._conflict_attempts):
            target = self._prepared.get(uid) or self._removals.get(uid)
            if target is None:
                return
            ref = target.ref
            try:
                obj = await self._api.get(ref)
            except HttpError as exc:
                self._settle(exc, ref, uid)
                return
            except TRANSPORT_ERRORS as exc:
                raise _Transient(f"reading the claim: {type(exc).__name__} {exc}") from exc
            if (obj.get("metadata") or {}).get("uid") != ref.uid:
                self._finished(uid, target)  # replaced under the same name: not ours any more
                return
            allocated = allocated_keys(obj)
            if not allocated:
                self._finished(uid, target)  # deallocated: the API server dropped every entry
                return
            # What this writer holds may have changed while the claim was read.
            target = self._prepared.get(uid) or self._removals.get(uid)
            if target is None:
                return
            desired = self._desired(target, allocated)
            remove = target.keys if isinstance(target, _Removal) else frozenset()
            current = current_entries(obj)
            entries = merged_entries(
                current, desired=desired, remove=remove, now=times.rfc3339(self._clock())
            )
            if entries == current:
                self._finished(uid, target)
                return
            status = dict(obj.get("status") or {})
            if entries:
                status["devices"] = entries
            else:
                status.pop("devices", None)
            try:
                written = await self._api.replace_status(ref, {**obj, "status": status})
            except HttpError as exc:
                if exc.status == 409:
                    continue  # someone else wrote the claim meanwhile: read it again
                self._settle(exc, ref, uid)
                return
            except TRANSPORT_ERRORS as exc:
                raise _Transient(f"writing the status: {type(exc).__name__} {exc}") from exc
            STATUS_WRITES.labels(self.driver, "written").inc()
            if desired and allocated_keys(written):
                kept = {EntryKey.of(e) for e in current_entries(written)}
                if not {d.key for d in desired} <= kept:
                    self.support.dropped()
                    return
            logger.debug("wrote the device status of %s for driver %s", describe(ref), self.driver)
            self._finished(uid, target)
            return
        raise _Transient(f"the claim changed under {self._conflict_attempts} writes in a row (409)")

    def _desired(self, target: _Prepared | _Removal, allocated: frozenset[EntryKey]) -> list[DesiredEntry]:
        if not isinstance(target, _Prepared):
            return []
        states = self._health.states() if self._health is not None else {}
        return [
            DesiredEntry(
                key=d.key,
                readiness=readiness(states.get(d.name), monitored=self._health is not None),
                data=d.data,
                data_known=target.data_known,
            )
            for d in target.devices
            if d.key in allocated  # the API server accepts entries of allocated devices only
        ]

    def _settle(self, exc: HttpError, ref: ClaimRef, uid: str) -> None:
        """An HTTP error: retried (raises ``_Transient``) or the end of this claim's writes."""
        if exc.status in _RETRIED_STATUS:
            raise _Transient(f"{exc.status} {exc.reason}") from exc
        if exc.status == 404:
            target = self._prepared.get(uid) or self._removals.get(uid)
            if target is not None:
                self._finished(uid, target)  # the claim is gone, and its entries with it
            return
        STATUS_WRITES.labels(self.driver, "error").inc()
        if exc.status == 403:
            self.support.refused(self.driver, f"403 {error_message(exc)}")
            return
        if uid not in self._rejected:
            self._rejected.add(uid)
            logger.warning(
                "the API server rejected the device status of %s for driver %s: %s %s",
                describe(ref),
                self.driver,
                exc.status,
                error_message(exc),
            )

    def _finished(self, uid: str, target: _Prepared | _Removal) -> None:
        # A removal done is forgotten; a prepared claim stays tracked for health changes.
        if isinstance(target, _Removal) and self._removals.get(uid) is target:
            del self._removals[uid]

    # --- helpers -----------------------------------------------------------------------------------

    def _key(self, device: CheckpointedDevice) -> EntryKey:
        return EntryKey(driver=self.driver, pool=device.pool, device=device.device, share_id=device.share_id)

    def _tracked(
        self, entry: ClaimEntry, data: Mapping[str, Mapping[str, Any]], *, data_known: bool
    ) -> _Prepared:
        return _Prepared(
            ref=_ref(entry),
            devices=tuple(
                _Device(key=self._key(p), name=p.device, data=data[p.device]) for p in entry.devices
            ),
            data_known=data_known,
        )
