"""A fake NVML with health: ``FakeNvml`` plus the event set and the polled health readings.

For the simulated backend (a demo can inject an XID or lose a GPU) and for tests. Events wait on a
queue, so ``nvmlEventSetWait`` blocks like the real one and times out with ``NVMLError_Timeout``.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from dra_node_agent.devices import DiscoveredDevice
from dra_node_agent.health.probe import PollResult
from dra_node_agent.nvidia.health_probe import INSTANCE_ANY, NvmlHealthProbe
from dra_node_agent.simulated.fakehw import FakeGpu, FakeNvml, _Handle

# The health functions the NVML probe calls beyond discovery's.
HEALTH_FUNCTIONS = (
    "nvmlDeviceGetHandleByUUID",
    "nvmlEventSetCreate",
    "nvmlEventSetFree",
    "nvmlEventSetWait",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
)
_LOST_CODE = pynvml.NVML_ERROR_GPU_IS_LOST
# Under the simulated backend's state folder: where a demo drops fault files (see FaultDirectory).
FAULTS_FOLDER = "faults"


@dataclass
class FakeGpuHealth:
    """Health readings of one fake GPU; tests and the demo change them between polls."""

    temperature: int = 40
    power_mw: int = 75_000
    memory_used: int = 1 << 30
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (error type, counter) -> count
    ecc_supported: bool = True
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corrected, uncorrected, pending, failed
    events_supported: int = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
    lost: bool = False


class _EventSet:
    def __init__(self) -> None:
        self.queue: queue.Queue[SimpleNamespace | int] = queue.Queue()
        self.registered: dict[str, int] = {}
        self.freed = False


class FakeNvmlHealth(FakeNvml):
    """``FakeNvml`` that also answers the health calls, with injectors for events and faults."""

    def __init__(self, *, gpus: Sequence[FakeGpu], **kwargs: Any) -> None:
        super().__init__(gpus=gpus, **kwargs)
        self.health: dict[str, FakeGpuHealth] = {gpu.uuid: FakeGpuHealth() for gpu in gpus}
        self.event_sets: list[_EventSet] = []

    @classmethod
    def wrapping(cls, fake: FakeNvml) -> FakeNvmlHealth:
        """A health-capable fake over the same GPUs as ``fake`` (the simulated backend's), and the same
        sysfs: a GPU the NVIDIA driver gives up (to vfio-pci) is none of its either."""
        return cls(
            gpus=fake.gpus,
            driver_version=fake.driver_version,
            cuda_driver_version=fake.cuda_driver_version,
            sysfs_root=fake.sysfs_root,
        )

    # --- injectors -------------------------------------------------------------------------------
    def inject_event(
        self, uuid: str, *, event_type: int, data: int = 0, gi: int = INSTANCE_ANY, ci: int = INSTANCE_ANY
    ) -> None:
        gpu = self._by_uuid(uuid)
        for event_set in self.event_sets:
            if event_set.registered.get(uuid, 0) & event_type:
                event = SimpleNamespace(
                    device=_Handle(gpu),
                    eventType=event_type,
                    eventData=data,
                    gpuInstanceId=gi,
                    computeInstanceId=ci,
                )
                event_set.queue.put(event)

    def inject_xid(self, uuid: str, xid: int, *, gi: int = INSTANCE_ANY, ci: int = INSTANCE_ANY) -> None:
        self.inject_event(uuid, event_type=pynvml.nvmlEventTypeXidCriticalError, data=xid, gi=gi, ci=ci)

    def lose(self, uuid: str, *, via_event: bool = True) -> None:
        """The GPU falls off the bus: its calls fail with GPU_IS_LOST (and a wait reports it once)."""
        self.health[uuid].lost = True
        if via_event:
            for event_set in self.event_sets:
                if uuid in event_set.registered:
                    event_set.queue.put(_LOST_CODE)

    def restore(self, uuid: str) -> None:
        self.health[uuid].lost = False

    # --- helpers ---------------------------------------------------------------------------------
    def _by_uuid(self, uuid: str) -> FakeGpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def _healthy_gpu(self, handle: Any, function: str) -> tuple[FakeGpu, FakeGpuHealth]:
        gpu = self._gpu(handle, function)
        readings = self.health[gpu.uuid]
        if readings.lost:
            raise pynvml.NVMLError(_LOST_CODE)
        return gpu, readings

    # --- NVML ------------------------------------------------------------------------------------
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        self._ready()
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        gpu = self._by_uuid(text)
        if not self._held(gpu):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)  # as FakeNvml: vfio-pci holds it
        if self.health[text].lost:
            raise pynvml.NVMLError(_LOST_CODE)
        return _Handle(gpu)

    def nvmlEventSetCreate(self) -> _EventSet:
        self._ready()
        event_set = _EventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        event_set.freed = True
        if event_set in self.event_sets:
            self.event_sets.remove(event_set)

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        _, readings = self._healthy_gpu(handle, "nvmlDeviceGetSupportedEventTypes")
        if not readings.events_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return readings.events_supported

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: _EventSet) -> None:
        gpu, _ = self._healthy_gpu(handle, "nvmlDeviceRegisterEvents")
        event_set.registered[gpu.uuid] = event_set.registered.get(gpu.uuid, 0) | event_types

    def nvmlEventSetWait(self, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        self._ready()
        try:
            item = event_set.queue.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None
        if isinstance(item, int):
            raise pynvml.NVMLError(item)
        return item

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        del sensor
        return self._healthy_gpu(handle, "nvmlDeviceGetTemperature")[1].temperature

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._healthy_gpu(handle, "nvmlDeviceGetPowerUsage")[1].power_mw

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: Any = None) -> SimpleNamespace:
        info = super().nvmlDeviceGetMemoryInfo(handle, version)
        if handle.mig is None:
            readings = self.health[handle.gpu.uuid]
            if readings.lost:
                raise pynvml.NVMLError(_LOST_CODE)
            info.used = readings.memory_used
            info.free = info.total - readings.memory_used
        return info

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        _, readings = self._healthy_gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if not readings.ecc_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return readings.ecc.get((error_type, counter_type), 0)

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        return self._healthy_gpu(handle, "nvmlDeviceGetRemappedRows")[1].remapped_rows


class FaultDirectory:
    """Faults for a simulated node, dropped in as files (for demos: ``touch <dir>/xid-1-79``).

    ``xid-<minor>-<code>`` delivers one XID to GPU ``<minor>`` and is then removed;
    ``lost-<minor>`` makes the GPU lost while the file exists. Read before every poll.
    """

    def __init__(self, *, path: Path, nvml: FakeNvmlHealth) -> None:
        self.path = path
        self._nvml = nvml

    def apply(self) -> None:
        by_minor = {str(gpu.minor): gpu.uuid for gpu in self._nvml.gpus}
        try:
            names = sorted(p.name for p in self.path.iterdir())
        except OSError:
            names = []
        lost = set()
        for name in names:
            kind, _, rest = name.partition("-")
            if kind == "xid":
                minor, _, code = rest.partition("-")
                if minor in by_minor and code.isdigit():
                    self._nvml.inject_xid(by_minor[minor], int(code))
                (self.path / name).unlink(missing_ok=True)
            elif kind == "lost" and rest in by_minor:
                lost.add(by_minor[rest])
        for uuid, readings in self._nvml.health.items():
            if uuid in lost and not readings.lost:
                self._nvml.lose(uuid)
            elif uuid not in lost and readings.lost:
                self._nvml.restore(uuid)


class SimulatedNvmlProbe(NvmlHealthProbe):
    """The NVML probe over a ``FakeNvmlHealth``, taking faults from a ``FaultDirectory`` before each poll."""

    def __init__(self, *, faults: FaultDirectory, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.faults = faults

    def poll(self, *, devices: Sequence[DiscoveredDevice], now: float) -> PollResult:
        self.faults.apply()
        return super().poll(devices=devices, now=now)
