"""NVIDIA health through NVML: an event thread for XIDs and double-bit ECC errors, and polls.

Events are registered on each physical GPU (MIG devices share their parent's event stream; an
event that names a GPU and compute instance goes to that MIG device, a whole-GPU event to every
device of the GPU). ``nvmlEventSetWait`` returns after ``event_timeout_ms`` at most, so ``stop``
never waits longer than that. Polls read ECC counters, row remapping, temperature, power and
memory; any call that says the GPU is lost (or a GPU whose UUID is no longer found) marks its
devices ``gpu-lost``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import pynvml

from dra_node_agent.devices import DiscoveredDevice
from dra_node_agent.health.metrics import Telemetry
from dra_node_agent.health.probe import Emit, PollResult, XidReport
from dra_node_agent.health.state import Observation, ProblemKind

logger = logging.getLogger(__name__)

# Application errors, not device faults (NVIDIA's device plugin and DRA driver ignore them too).
DEFAULT_IGNORED_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})
INSTANCE_ANY: Final = 0xFFFFFFFF
WATCHED_EVENTS: Final = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
_LOST: Final = (pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_NOT_FOUND)
_ERROR_PAUSE: Final = 1.0  # seconds between retries after a failed wait: never a busy loop


def parse_xid_list(raw: str | Iterable[int]) -> frozenset[int]:
    """``"13,31, 43"`` or an iterable of ints -> a set of XIDs; bad entries are a one-line error."""
    if not isinstance(raw, str):
        return frozenset(int(x) for x in raw)
    out: set[int] = set()
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise ValueError(f"XID list {raw!r}: {part!r} is not a non-negative integer")
        out.add(int(part))
    return frozenset(out)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _physical(device: DiscoveredDevice) -> str:
    return device.parent_uuid or device.uuid


def _instance_ids(device: DiscoveredDevice) -> tuple[int, int] | None:
    """(GPU instance, compute instance) of a MIG device from its ``minor:gi:ci`` local id."""
    if device.kind != "mig":
        return None
    parts = device.local_id.split(":")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[1]), int(parts[2])


def targets(
    devices: Iterable[DiscoveredDevice], *, gpu_uuid: str, gi: int, ci: int
) -> list[DiscoveredDevice]:
    """The devices an event of GPU ``gpu_uuid`` at instance (``gi``, ``ci``) concerns."""
    on_gpu = [d for d in devices if _physical(d) == gpu_uuid]
    if gi == INSTANCE_ANY or ci == INSTANCE_ANY:
        return on_gpu
    exact = [d for d in on_gpu if _instance_ids(d) == (gi, ci)]
    return exact or on_gpu


class NvmlHealthProbe:
    """Watches NVIDIA devices; ``nvml`` is the pynvml module or a stand-in with the same functions."""

    def __init__(
        self,
        *,
        nvml: Any = None,
        ignored_xids: Iterable[int] = DEFAULT_IGNORED_XIDS,
        event_timeout_ms: int = 5000,
        temperature_limit: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nvml = nvml if nvml is not None else pynvml
        self.ignored_xids = frozenset(ignored_xids)
        self._timeout_ms = event_timeout_ms
        self._temperature_limit = temperature_limit
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._initialised = False
        self._last_volatile_uncorrected: dict[str, int] = {}
        self._devices: tuple[DiscoveredDevice, ...] = ()
        self._lock = threading.Lock()

    @property
    def backend(self) -> str:
        return "nvml"

    @property
    def nvml(self) -> Any:
        """The NVML module in use (a ``FakeNvmlHealth`` under simulation: inject faults there)."""
        return self._nvml

    # --- events ----------------------------------------------------------------------------------
    def start(
        self, *, devices: Sequence[DiscoveredDevice], emit: Emit, xid: Callable[[XidReport], None]
    ) -> None:
        nvml = self._nvml
        nvml.nvmlInitWithFlags(0)
        self._initialised = True
        self.set_devices(devices)
        self._event_set = nvml.nvmlEventSetCreate()
        for uuid in sorted({_physical(d) for d in devices}):
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                nvml.nvmlDeviceRegisterEvents(handle, WATCHED_EVENTS & supported, self._event_set)
            except pynvml.NVMLError_NotSupported:
                logger.warning("GPU %s cannot report health events; it is polled only", uuid)
            except pynvml.NVMLError as err:
                if getattr(err, "value", None) in _LOST:
                    logger.warning("GPU %s is lost; its events cannot be watched", uuid)
                else:
                    logger.warning("cannot watch health events of GPU %s: %s; it is polled only", uuid, err)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._event_loop, kwargs={"emit": emit, "xid": xid}, name="nvml-health-events", daemon=True
        )
        self._thread.start()

    def set_devices(self, devices: Sequence[DiscoveredDevice]) -> None:
        with self._lock:
            self._devices = tuple(devices)

    def _current(self) -> tuple[DiscoveredDevice, ...]:
        with self._lock:
            return self._devices

    def _event_loop(self, *, emit: Emit, xid: Callable[[XidReport], None]) -> None:
        nvml = self._nvml
        while not self._stop.is_set():
            try:
                event = nvml.nvmlEventSetWait(self._event_set, self._timeout_ms)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as err:
                if getattr(err, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST:
                    self._report_lost(emit=emit)
                else:
                    logger.warning("waiting for NVML events failed: %s", err)
                self._stop.wait(_ERROR_PAUSE)
                continue
            try:
                self._dispatch(event, emit=emit, xid=xid)
            except pynvml.NVMLError as err:
                logger.warning("cannot attribute an NVML event (type %s): %s", event.eventType, err)

    def _report_lost(self, *, emit: Emit) -> None:
        """NVML says a GPU is lost but not which: ask each GPU, and suspect all only if none answers so."""
        devices = self._current()
        lost = [uuid for uuid in sorted({_physical(d) for d in devices}) if self._is_lost(uuid)]
        suspects = [d for d in devices if _physical(d) in lost] if lost else list(devices)
        now = self._clock()
        for device in suspects:
            emit(
                Observation(
                    device=device.name,
                    time=now,
                    kind=ProblemKind.GPU_LOST,
                    message=f"GPU {_physical(device)} fell off the bus"
                    if lost
                    else "NVML reports a lost GPU it cannot name",
                )
            )

    def _is_lost(self, uuid: str) -> bool:
        try:
            handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
            self._nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        except pynvml.NVMLError as err:
            return getattr(err, "value", None) in _LOST
        return False

    def _dispatch(self, event: Any, *, emit: Emit, xid: Callable[[XidReport], None]) -> None:
        uuid = _text(self._nvml.nvmlDeviceGetUUID(event.device))
        hit = targets(
            self._current(), gpu_uuid=uuid, gi=int(event.gpuInstanceId), ci=int(event.computeInstanceId)
        )
        now = self._clock()
        kind = int(event.eventType)
        if kind == pynvml.nvmlEventTypeXidCriticalError:
            code = int(event.eventData)
            fatal = code not in self.ignored_xids
            for device in hit:
                xid(XidReport(device=device.name, xid=code, fatal=fatal))
                if fatal:
                    emit(
                        Observation(
                            device=device.name,
                            time=now,
                            kind=ProblemKind.XID,
                            value=str(code),
                            message=f"XID {code} on GPU {uuid}",
                        )
                    )
            if not fatal:
                logger.info("application XID %d on GPU %s (not a device fault)", code, uuid)
        elif kind == pynvml.nvmlEventTypeDoubleBitEccError:
            for device in hit:
                emit(
                    Observation(
                        device=device.name,
                        time=now,
                        kind=ProblemKind.UNHEALTHY,
                        value="ecc-double-bit",
                        message=f"double-bit ECC error on GPU {uuid}",
                    )
                )
        else:
            logger.debug("ignoring NVML event type %#x on GPU %s", kind, uuid)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError as err:
                logger.debug("freeing the NVML event set failed: %s", err)
            self._event_set = None
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except pynvml.NVMLError as err:
                logger.debug("NVML shutdown failed: %s", err)

    # --- polls -----------------------------------------------------------------------------------
    def poll(self, *, devices: Sequence[DiscoveredDevice], now: float) -> PollResult:
        self.set_devices(devices)
        result = PollResult()
        for uuid in sorted({_physical(d) for d in devices}):
            mine = [d for d in devices if _physical(d) == uuid]
            problems, telemetry = self._poll_gpu(uuid, now=now)
            for device in mine:
                if device.kind == "gpu":
                    result.telemetry[device.name] = telemetry
                if not problems:
                    result.observations.append(Observation(device=device.name, time=now))
                for kind, value, message in problems:
                    result.observations.append(
                        Observation(device=device.name, time=now, kind=kind, value=value, message=message)
                    )
        return result

    def _poll_gpu(self, uuid: str, *, now: float) -> tuple[list[tuple[ProblemKind, str, str]], Telemetry]:
        nvml = self._nvml
        telemetry = Telemetry()
        problems: list[tuple[ProblemKind, str, str]] = []
        lost = (ProblemKind.GPU_LOST, "", f"GPU {uuid} is lost (fell off the bus or no longer found)")
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        except pynvml.NVMLError as err:
            if getattr(err, "value", None) in _LOST:
                return [lost], telemetry
            raise

        def read(function: str, *args: Any) -> Any:
            try:
                return getattr(nvml, function)(handle, *args)
            except pynvml.NVMLError as err:
                if getattr(err, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST:
                    raise
                if not isinstance(err, pynvml.NVMLError_NotSupported):
                    logger.debug("%s on GPU %s: %s", function, uuid, err)
                return None

        try:
            temperature = read("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU)
            power = read("nvmlDeviceGetPowerUsage")
            memory = read("nvmlDeviceGetMemoryInfo")
            ecc: dict[tuple[str, str], int] = {}
            for type_name, error_type in (
                ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            ):
                for scope, counter in (
                    ("volatile", pynvml.NVML_VOLATILE_ECC),
                    ("aggregate", pynvml.NVML_AGGREGATE_ECC),
                ):
                    count = read("nvmlDeviceGetTotalEccErrors", error_type, counter)
                    if count is not None:
                        ecc[(type_name, scope)] = int(count)
            rows = read("nvmlDeviceGetRemappedRows")
        except pynvml.NVMLError:
            return [lost], telemetry
        if temperature is not None:
            telemetry.temperature_celsius = float(temperature)
            if self._temperature_limit is not None and temperature >= self._temperature_limit:
                problems.append(
                    (ProblemKind.UNHEALTHY, "over-temperature", f"GPU {uuid} at {temperature} °C")
                )
        if power is not None:
            telemetry.power_watts = int(power) / 1000.0  # NVML reports milliwatts
        if memory is not None:
            telemetry.memory_used_bytes = int(memory.used)
            telemetry.memory_total_bytes = int(memory.total)
        telemetry.ecc_errors = ecc
        volatile = ecc.get(("uncorrected", "volatile"))
        if volatile is not None:
            before = self._last_volatile_uncorrected.get(uuid)
            self._last_volatile_uncorrected[uuid] = volatile
            if before is not None and volatile > before:
                problems.append(
                    (
                        ProblemKind.UNHEALTHY,
                        "ecc-uncorrected",
                        f"{volatile - before} new uncorrected ECC errors on GPU {uuid}",
                    )
                )
        if rows is not None:
            corrected, uncorrected, pending, failed = (int(x) for x in rows)
            telemetry.remapped_rows = {"correctable": corrected, "uncorrectable": uncorrected}
            telemetry.row_remap_pending = bool(pending)
            telemetry.row_remap_failure = bool(failed)
            if failed:
                problems.append(
                    (ProblemKind.UNHEALTHY, "row-remap-failure", f"row remapping failed on GPU {uuid}")
                )
            elif pending:
                problems.append(
                    (ProblemKind.UNHEALTHY, "row-remap-pending", f"GPU {uuid} needs a reset to remap rows")
                )
        del now
        return problems, telemetry
