"""The prepared-claims checkpoint: what the agent has prepared, surviving restarts.

One JSON file per driver:

    {"apiVersion": "dra.accel.dev/v1", "kind": "Checkpoint", "checksum": "sha256:<hex>",
     "data": {"driver": ..., "nodeBootID": ..., "preparedClaims": {<uid>: {...}}}}

The checksum covers the canonical JSON of `data`. Prepare is two-phase: `begin` records
PrepareStarted (with the planned devices) before any side effect, `complete` records
PrepareCompleted with the devices and CDI IDs per request. A checkpoint written in another boot
(different /proc/sys/kernel/random/boot_id) is invalidated on load: nothing prepared then exists now.

Corruption (bad JSON, checksum mismatch, unknown version) fails closed: `CheckpointCorrupt` is
raised by every call until an operator calls `quarantine()`, and the file is left untouched for
inspection. Never silently emptied. Listeners (`add_corruption_listener`) hear of it every time a
call is refused, so the agent can tell the cluster (`checkpoint_report`), and hear `None` after
`quarantine()`.

Every method blocks (file I/O, fsync, flock): async callers use `asyncio.to_thread`. Each mutation
re-reads the file under an exclusive flock on `<path>.lock`, so two agent processes sharing the
directory during a rolling update see each other's writes.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dra_api import times
from dra_api.kubeletapi.model import ClaimRef  # the checkpoint records claims as kubelet names them
from dra_api.names import PROJECT_DOMAIN

log = logging.getLogger(__name__)

API_VERSION = f"{PROJECT_DOMAIN}/v1"
KIND = "Checkpoint"
# Bounds of the file, which each write rewrites whole: claims of one driver prepared on the node
# (the agent's --max-prepared-claims), bytes of one claim's entry (32 devices with long pool and
# device names take under 24 KiB) and of the whole file.
DEFAULT_MAX_CLAIMS = 1024
MAX_ENTRY_BYTES = 32 * 1024
MAX_FILE_BYTES = 8 * 1024 * 1024
DEFAULT_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_TEMP_MARKER = ".tmp-"


# --- atomic files ----------------------------------------------------------------------------


def fsync_directory(directory: Path) -> None:
    """Make a rename or unlink in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_file(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace `path` with `data` so readers see the old or the new file, never a partial one.

    Temp file in the same directory, fsync, rename, fsync the directory. On failure (disk full)
    the temp file is removed and `path` is unchanged.
    """
    temp = path.parent / f".{path.name}{_TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    fsync_directory(path.parent)


def remove_temp_files(directory: Path, *, prefix: str) -> int:
    """Delete leftovers of interrupted atomic writes (`<prefix>*.tmp-*`) in `directory`."""
    removed = 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    for name in names:
        if name.startswith(prefix) and _TEMP_MARKER in name:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory / name)
                removed += 1
    return removed


# --- records ---------------------------------------------------------------------------------


class ClaimState(enum.StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True)
class PassthroughRecord:
    """A GPU a claim takes for passthrough: recorded before the first sysfs write, so unprepare and
    the start-up clean-up give it back to the NVIDIA driver from the record alone."""

    pci_bus_id: str
    iommu_group: int

    def to_json(self) -> dict[str, Any]:
        return {"pciBusID": self.pci_bus_id, "iommuGroup": self.iommu_group}

    @staticmethod
    def from_json(raw: dict[str, Any]) -> PassthroughRecord:
        return PassthroughRecord(pci_bus_id=str(raw["pciBusID"]), iommu_group=int(raw["iommuGroup"]))


@dataclass(frozen=True)
class CheckpointedDevice:
    """One allocated device of a claim as the checkpoint records it: request, pool, name, CDI IDs once
    prepared, and what prepare changed on the device (so unprepare can undo it)."""

    request: str
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...] = ()
    admin_access: bool = False
    # Consumable capacity: the allocator gave this claim a share of a device that several claims may
    # hold at once (allowMultipleAllocations); ``share_id`` is that share's ID, when it has one.
    shared: bool = False
    share_id: str | None = None
    # What the share consumes of the device's capacities, in base units (checked against them at
    # prepare, with the other shares recorded on the device).
    consumed: tuple[tuple[str, int], ...] = ()
    # The time slice (timeSlicingConfig.interval) this claim set on the GPU, reset when the last claim
    # holding the GPU with one is unprepared (``nvidia.gpu_sharing``).
    time_slice: str | None = None
    # The claim's MPS control daemon serves this GPU (``nvidia.mps``); stopped when the claim is unprepared.
    mps: bool = False
    # A dynamic MIG placement: its instance is created at prepare (``mig_uuid`` once it exists) and
    # destroyed at unprepare (``nvidia.dynamic_mig``).
    dynamic_mig: bool = False
    mig_uuid: str | None = None
    # A GPU passed through: bound to vfio-pci at prepare, back to the NVIDIA driver at unprepare.
    vfio: PassthroughRecord | None = None
    # A compute-domain channel or daemon: the ComputeDomain (its UID) the claim joined the node to,
    # which unprepare leaves (``nvidia.cd_membership``).
    compute_domain: str | None = None

    @property
    def exclusive(self) -> bool:
        """Whether no other claim may hold this device while this one does."""
        return not (self.admin_access or self.shared)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request": self.request,
            "pool": self.pool,
            "device": self.device,
            "cdiDeviceIDs": list(self.cdi_device_ids),
        }
        if self.admin_access:
            out["adminAccess"] = True
        if self.shared:
            out["shared"] = True
        if self.share_id is not None:
            out["shareID"] = self.share_id
        if self.consumed:
            out["consumedCapacity"] = dict(self.consumed)
        if self.time_slice is not None:
            out["timeSlice"] = self.time_slice
        if self.mps:
            out["mps"] = True
        if self.dynamic_mig:
            out["dynamicMIG"] = True
        if self.mig_uuid is not None:
            out["migUUID"] = self.mig_uuid
        if self.vfio is not None:
            out["vfio"] = self.vfio.to_json()
        if self.compute_domain is not None:
            out["computeDomain"] = self.compute_domain
        return out

    @staticmethod
    def from_json(raw: dict[str, Any]) -> CheckpointedDevice:
        return CheckpointedDevice(
            request=str(raw["request"]),
            pool=str(raw["pool"]),
            device=str(raw["device"]),
            cdi_device_ids=tuple(str(i) for i in raw.get("cdiDeviceIDs", [])),
            admin_access=bool(raw.get("adminAccess", False)),
            shared=bool(raw.get("shared", False)),
            share_id=None if raw.get("shareID") is None else str(raw["shareID"]),
            consumed=tuple(sorted((str(k), int(v)) for k, v in (raw.get("consumedCapacity") or {}).items())),
            time_slice=None if raw.get("timeSlice") is None else str(raw["timeSlice"]),
            mps=bool(raw.get("mps", False)),
            dynamic_mig=bool(raw.get("dynamicMIG", False)),
            mig_uuid=None if raw.get("migUUID") is None else str(raw["migUUID"]),
            vfio=None if raw.get("vfio") is None else PassthroughRecord.from_json(raw["vfio"]),
            compute_domain=None if raw.get("computeDomain") is None else str(raw["computeDomain"]),
        )


@dataclass(frozen=True)
class ClaimEntry:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[CheckpointedDevice, ...]
    started_at: str
    completed_at: str | None = None

    def cdi_device_ids(self, request: str | None = None) -> list[str]:
        return [i for d in self.devices if request is None or d.request == request for i in d.cdi_device_ids]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state.value,
            "devices": [d.to_json() for d in self.devices],
            "startedAt": self.started_at,
        }
        if self.completed_at is not None:
            out["completedAt"] = self.completed_at
        return out

    @staticmethod
    def from_json(uid: str, raw: dict[str, Any]) -> ClaimEntry:
        return ClaimEntry(
            uid=uid,
            namespace=str(raw["namespace"]),
            name=str(raw["name"]),
            state=ClaimState(raw["state"]),
            devices=tuple(CheckpointedDevice.from_json(d) for d in raw["devices"]),
            started_at=str(raw["startedAt"]),
            completed_at=str(raw["completedAt"]) if raw.get("completedAt") is not None else None,
        )


class CheckpointCorrupt(Exception):
    """The checkpoint file cannot be trusted; prepare and unprepare are refused until it is fixed."""


# Called, in the thread that used the store, with the error each time a call is refused because the
# checkpoint is corrupt, and with None once it is trusted again. Must return at once.
CorruptionListener = Callable[[CheckpointCorrupt | None], None]


class DeviceAlreadyPrepared(Exception):
    """A device is already prepared for another claim (the double-allocation guard)."""


class CheckpointFull(Exception):
    """Recording the claim would take the checkpoint past one of its bounds; nothing was written."""


@dataclass
class _Contents:
    boot_id: str
    claims: dict[str, ClaimEntry] = field(default_factory=dict)


def _check_entry_size(entry: ClaimEntry) -> None:
    size = len(_canonical(entry.to_json()))
    if size > MAX_ENTRY_BYTES:
        raise CheckpointFull(
            f"claim {entry.namespace}/{entry.name}'s checkpoint entry would be {size} bytes, more than "
            f"the {MAX_ENTRY_BYTES} one claim may take"
        )


def _now() -> str:
    return times.rfc3339()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def checksum_of(data: Any) -> str:
    return "sha256:" + hashlib.sha256(_canonical(data)).hexdigest()


def read_boot_id(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as err:
        raise RuntimeError(f"boot ID {path}: cannot read ({err.strerror})") from err


class CheckpointStore:
    """The checkpoint of one driver at `path` (e.g. <plugins>/gpu.nvidia.com/checkpoint.json)."""

    def __init__(
        self,
        path: str | Path,
        boot_id_path: str | Path = DEFAULT_BOOT_ID_PATH,
        *,
        driver: str = "",
        use_flock: bool = True,
        max_claims: int = DEFAULT_MAX_CLAIMS,
    ) -> None:
        self.max_claims = max_claims
        self.path = Path(path)
        self.boot_id_path = Path(boot_id_path)
        self.driver = driver
        self._use_flock = use_flock
        self._lock = threading.Lock()
        self._boot_id: str | None = None
        self.corrupt: CheckpointCorrupt | None = None
        self._corruption_listeners: list[CorruptionListener] = []
        # Entries dropped at load because the node rebooted since they were written.
        self.invalidated: tuple[ClaimEntry, ...] = ()

    # --- public API --------------------------------------------------------------------------

    def add_corruption_listener(self, listener: CorruptionListener) -> None:
        """Call ``listener`` on every refusal for corruption, and with None after `quarantine()`."""
        self._corruption_listeners.append(listener)

    def load(self) -> list[ClaimEntry]:
        """Read the file (creating an empty checkpoint if there is none) and return its entries.

        Raises `CheckpointCorrupt` and stays in that state if the file cannot be trusted. Entries
        from another boot are dropped (listed in `invalidated`) and the file is rewritten.
        """
        with self._transaction(write=False) as contents:
            return list(contents.claims.values())

    def get(self, uid: str) -> ClaimEntry | None:
        with self._transaction(write=False) as contents:
            return contents.claims.get(uid)

    def entries(self, state: ClaimState | None = None) -> list[ClaimEntry]:
        with self._transaction(write=False) as contents:
            return [e for e in contents.claims.values() if state is None or e.state == state]

    def begin(self, claim: ClaimRef, devices: Sequence[CheckpointedDevice]) -> ClaimEntry:
        """Record PrepareStarted for `claim` with the devices about to be set up.

        A PrepareCompleted entry for the same UID is returned unchanged (prepare is idempotent);
        a PrepareStarted one is replaced (the caller rolls back and redoes the partial work).
        Raises `DeviceAlreadyPrepared` if another claim holds one of the devices.
        """
        with self._transaction(write=True) as contents:
            existing = contents.claims.get(claim.uid)
            if existing is not None and existing.state == ClaimState.PREPARE_COMPLETED:
                return existing
            if existing is None and len(contents.claims) >= self.max_claims:
                raise CheckpointFull(
                    f"{len(contents.claims)} claims of driver {self.driver} are prepared on this node, the "
                    f"most the agent keeps (--max-prepared-claims={self.max_claims}); try again once "
                    "others are unprepared"
                )
            self._check_overlap(contents, claim.uid, devices, namespace=claim.namespace)
            entry = ClaimEntry(
                uid=claim.uid,
                namespace=claim.namespace,
                name=claim.name,
                state=ClaimState.PREPARE_STARTED,
                devices=tuple(replace(d, cdi_device_ids=()) for d in devices),
                started_at=_now(),
            )
            _check_entry_size(entry)
            contents.claims[claim.uid] = entry
            return entry

    def complete(self, uid: str, devices: Sequence[CheckpointedDevice]) -> ClaimEntry:
        """Record PrepareCompleted with the prepared devices and their CDI IDs."""
        with self._transaction(write=True) as contents:
            existing = contents.claims.get(uid)
            if existing is None:
                raise KeyError(f"claim {uid}: not in the checkpoint; call begin() first")
            self._check_overlap(contents, uid, devices, namespace=existing.namespace)
            entry = replace(
                existing,
                state=ClaimState.PREPARE_COMPLETED,
                devices=tuple(devices),
                completed_at=_now(),
            )
            _check_entry_size(entry)
            contents.claims[uid] = entry
            return entry

    def remove(self, uid: str) -> ClaimEntry | None:
        """Forget a claim (after unprepare); returns the removed entry, None if absent (no write)."""
        with self._transaction(write=True) as contents:
            return contents.claims.pop(uid, None)

    def started_before(self, cutoff: datetime) -> list[ClaimEntry]:
        """PrepareStarted entries older than `cutoff`: candidates for the stale-claim cleanup."""
        stale = []
        for entry in self.entries(ClaimState.PREPARE_STARTED):
            started = datetime.fromisoformat(entry.started_at.replace("Z", "+00:00"))
            if started < cutoff:
                stale.append(entry)
        return stale

    def quarantine(self) -> Path | None:
        """Operator recovery: move a corrupt file aside (`<name>.corrupt-<time>`) and start empty.

        Never called automatically; returns where the file went (None if there was none).
        """
        with self._locked():
            target: Path | None = None
            if self.path.exists():
                stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
                target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
                os.replace(self.path, target)
                fsync_directory(self.path.parent)
                log.warning("checkpoint %s moved aside to %s; starting empty", self.path, target)
            self.corrupt = None
            self._write(_Contents(boot_id=self._current_boot_id()))
            self._notify(None)
            return target

    # --- internals ---------------------------------------------------------------------------

    def _current_boot_id(self) -> str:
        if self._boot_id is None:
            self._boot_id = read_boot_id(self.boot_id_path)
        return self._boot_id

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self._use_flock:
                yield
                return
            lock_fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(lock_fd)  # closing releases the flock

    @contextlib.contextmanager
    def _transaction(self, *, write: bool) -> Iterator[_Contents]:
        with self._locked():
            try:
                if self.corrupt is not None:
                    raise self.corrupt
                contents, rewrite = self._read()
            except CheckpointCorrupt as err:
                self._notify(err)
                raise
            before = _canonical(self._encode_data(contents))
            yield contents
            after = _canonical(self._encode_data(contents)) if write else before
            if len(after) > max(len(before), MAX_FILE_BYTES):
                # Only growth is refused: a removal always goes through.
                raise CheckpointFull(
                    f"the checkpoint would grow to {len(after)} bytes, more than the {MAX_FILE_BYTES} "
                    "it may take"
                )
            if rewrite or after != before:
                self._write(contents)

    def _notify(self, error: CheckpointCorrupt | None) -> None:
        for listener in self._corruption_listeners:
            try:
                listener(error)
            except Exception:  # a reporting bug must not change what the store answers
                log.exception("checkpoint %s: corruption listener failed", self.path)

    def _read(self) -> tuple[_Contents, bool]:
        """Parse and verify the file; returns the contents and whether they must be rewritten."""
        boot_id = self._current_boot_id()
        try:
            raw_bytes = self.path.read_bytes()
        except FileNotFoundError:
            return _Contents(boot_id=boot_id), False
        try:
            claims, file_boot_id = self._decode(raw_bytes)
        except CheckpointCorrupt as err:
            self.corrupt = err
            log.error("%s; refusing prepare and unprepare, file kept for inspection", err)
            raise
        if file_boot_id != boot_id:
            if claims:
                log.warning(
                    "checkpoint %s was written in boot %s, this is boot %s: dropping %d prepared "
                    "claim(s) that no longer exist (%s)",
                    self.path,
                    file_boot_id,
                    boot_id,
                    len(claims),
                    ", ".join(sorted(claims)),
                )
            self.invalidated = tuple(claims.values())
            return _Contents(boot_id=boot_id), True
        return _Contents(boot_id=boot_id, claims=claims), False

    def _decode(self, raw_bytes: bytes) -> tuple[dict[str, ClaimEntry], str]:
        where = f"checkpoint {self.path}"
        try:
            doc = json.loads(raw_bytes)
        except (ValueError, UnicodeDecodeError) as err:
            raise CheckpointCorrupt(f"{where}: not valid JSON ({err})") from err
        if not isinstance(doc, dict):
            raise CheckpointCorrupt(f"{where}: top level is not an object")
        if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
            raise CheckpointCorrupt(
                f"{where}: unknown version {doc.get('apiVersion')!r} kind {doc.get('kind')!r} "
                f"(this agent reads {API_VERSION} {KIND})"
            )
        data = doc.get("data")
        expected = checksum_of(data)
        if doc.get("checksum") != expected:
            raise CheckpointCorrupt(
                f"{where}: checksum mismatch (file says {doc.get('checksum')!r}, content is {expected})"
            )
        try:
            assert isinstance(data, dict)
            boot_id = str(data["nodeBootID"])
            claims = {uid: ClaimEntry.from_json(uid, entry) for uid, entry in data["preparedClaims"].items()}
        except (AssertionError, KeyError, TypeError, ValueError, AttributeError) as err:
            raise CheckpointCorrupt(f"{where}: malformed content ({err!r})") from err
        return claims, boot_id

    def _encode_data(self, contents: _Contents) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "nodeBootID": contents.boot_id,
            "preparedClaims": {uid: contents.claims[uid].to_json() for uid in sorted(contents.claims)},
        }

    def _write(self, contents: _Contents) -> None:
        data = self._encode_data(contents)
        doc = {"apiVersion": API_VERSION, "kind": KIND, "checksum": checksum_of(data), "data": data}
        atomic_write_file(self.path, (json.dumps(doc, indent=2) + "\n").encode())

    def remove_stale_temp_files(self) -> int:
        """Delete temp files a crash left mid-write (call at startup)."""
        with self._locked():
            return remove_temp_files(self.path.parent, prefix=f".{self.path.name}")

    def _check_overlap(
        self, contents: _Contents, uid: str, devices: Sequence[CheckpointedDevice], *, namespace: str
    ) -> None:
        # Admin access never conflicts (the allocator ignores it too). Consumable-capacity shares of
        # a device coexist with each other, never with an exclusive hold. The error reaches the
        # pod's Events: a claim of another namespace (another tenant, now that shares put tenants
        # on one GPU) is not named there, only in the log.
        wanted = {(d.pool, d.device) for d in devices if d.exclusive}
        shares = {(d.pool, d.device) for d in devices if d.shared and not d.admin_access}
        for other in contents.claims.values():
            if other.uid == uid:
                continue
            held = {(d.pool, d.device) for d in other.devices if d.exclusive}
            held_shares = {(d.pool, d.device) for d in other.devices if d.shared and not d.admin_access}
            clash = sorted((wanted & (held | held_shares)) | (shares & held))
            if clash:
                pool, device = clash[0]
                if other.namespace != namespace:
                    log.warning(
                        "device %s/%s: claim %s is refused, claim %s/%s (%s) holds it",
                        pool,
                        device,
                        uid,
                        other.namespace,
                        other.name,
                        other.uid,
                    )
                    holder = f"a claim of another namespace ({other.state.value})"
                else:
                    holder = f"claim {other.namespace}/{other.name} ({other.uid}, {other.state.value})"
                raise DeviceAlreadyPrepared(f"device {pool}/{device} is already prepared for {holder}")
