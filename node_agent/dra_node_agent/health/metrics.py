"""Prometheus metrics of device health, in the default registry the agent's /metrics serves.

Per-device series carry ``driver`` and ``device`` (the ResourceSlice device name): a handful per
node, removed when a device disappears. Telemetry read from the hardware (temperature, power,
memory, ECC counts) is exposed by a collector from the latest poll, so NVML's own counters are
reported as counters without re-counting them here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX: Final = "dra_agent"

DEVICE_INFO = Gauge(
    f"{PREFIX}_device_info",
    "Devices this agent publishes; always 1, the labels describe the device.",
    ["driver", "node", "device", "uuid", "model"],
)
DEVICE_HEALTHY = Gauge(
    f"{PREFIX}_device_healthy",
    "1 when the device is healthy, 0 when it is unhealthy or its health is unknown.",
    ["driver", "device"],
)
DEVICE_HEALTH_STATE = Gauge(
    f"{PREFIX}_device_health_state",
    "The device's health state: 1 for the current state, 0 for the others.",
    ["driver", "device", "state"],
)
DEVICE_TAINT_INFO = Gauge(
    f"{PREFIX}_device_taint_info",
    "Taints the agent puts on a device in its ResourceSlice; always 1.",
    ["driver", "device", "key", "value", "effect"],
)
XID_ERRORS = Counter(
    f"{PREFIX}_xid_errors_total",
    "NVIDIA XID errors reported by NVML, by device and XID; fatal=false for application XIDs.",
    ["driver", "device", "xid", "fatal"],
)
HEALTH_EVENTS = Counter(
    f"{PREFIX}_health_events_total",
    "Health problems observed, by device and type (xid, gpu-lost, unhealthy).",
    ["driver", "device", "type"],
)
HEALTH_TRANSITIONS = Counter(
    f"{PREFIX}_device_health_transitions_total",
    "Device health state changes, by the state entered.",
    ["driver", "device", "state"],
)
MONITOR_UP = Gauge(
    f"{PREFIX}_health_monitor_up",
    "1 while the health monitor of the driver can watch its devices, 0 when it cannot.",
    ["driver", "backend"],
)
LAST_CHECK = Gauge(
    f"{PREFIX}_health_check_last_success_timestamp_seconds",
    "When the devices of the driver were last checked successfully (Unix time).",
    ["driver"],
)


@dataclass
class Telemetry:
    """The last polled readings of one device; None where the hardware does not report it."""

    temperature_celsius: float | None = None
    power_watts: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    # (type "corrected"|"uncorrected", scope "volatile"|"aggregate") -> count
    ecc_errors: dict[tuple[str, str], int] = field(default_factory=dict)
    remapped_rows: dict[str, int] = field(default_factory=dict)  # "correctable"|"uncorrectable"
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None


class TelemetryCollector(Collector):
    """Exposes the latest ``Telemetry`` per (driver, device); the monitors update it after each poll."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readings: dict[tuple[str, str], Telemetry] = {}

    def update(self, *, driver: str, readings: Mapping[str, Telemetry]) -> None:
        with self._lock:
            for key in [k for k in self._readings if k[0] == driver and k[1] not in readings]:
                del self._readings[key]
            for device, telemetry in readings.items():
                self._readings[(driver, device)] = telemetry

    def forget(self, *, driver: str) -> None:
        with self._lock:
            for key in [k for k in self._readings if k[0] == driver]:
                del self._readings[key]

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked collector: series appear only for polled devices

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            readings = sorted(self._readings.items())
        labels = ["driver", "device"]
        temperature = GaugeMetricFamily(
            f"{PREFIX}_device_temperature_celsius", "Device (GPU die) temperature.", labels=labels
        )
        power = GaugeMetricFamily(f"{PREFIX}_device_power_watts", "Device power draw.", labels=labels)
        used = GaugeMetricFamily(f"{PREFIX}_device_memory_used_bytes", "Device memory in use.", labels=labels)
        total = GaugeMetricFamily(
            f"{PREFIX}_device_memory_total_bytes", "Device memory in total.", labels=labels
        )
        ecc = CounterMetricFamily(
            f"{PREFIX}_device_ecc_errors",
            "ECC memory errors counted by the device (volatile: since the driver loaded; aggregate: "
            "over the device's life).",
            labels=[*labels, "type", "scope"],
        )
        rows = GaugeMetricFamily(
            f"{PREFIX}_device_remapped_rows", "Memory rows remapped by the device.", labels=[*labels, "type"]
        )
        pending = GaugeMetricFamily(
            f"{PREFIX}_device_row_remap_pending",
            "1 when a row remap waits for a device reset.",
            labels=labels,
        )
        failure = GaugeMetricFamily(
            f"{PREFIX}_device_row_remap_failure", "1 when a row remap failed.", labels=labels
        )
        for (driver, device), t in readings:
            values = [driver, device]
            if t.temperature_celsius is not None:
                temperature.add_metric(values, t.temperature_celsius)
            if t.power_watts is not None:
                power.add_metric(values, t.power_watts)
            if t.memory_used_bytes is not None:
                used.add_metric(values, t.memory_used_bytes)
            if t.memory_total_bytes is not None:
                total.add_metric(values, t.memory_total_bytes)
            for (kind, scope), count in sorted(t.ecc_errors.items()):
                ecc.add_metric([*values, kind, scope], count)
            for kind, count in sorted(t.remapped_rows.items()):
                rows.add_metric([*values, kind], count)
            if t.row_remap_pending is not None:
                pending.add_metric(values, 1 if t.row_remap_pending else 0)
            if t.row_remap_failure is not None:
                failure.add_metric(values, 1 if t.row_remap_failure else 0)
        yield from (temperature, power, used, total, ecc, rows, pending, failure)


TELEMETRY = TelemetryCollector()
REGISTRY.register(TELEMETRY)


def forget_device(*, driver: str, device: str) -> None:
    """Remove every per-device series of a device that is gone."""
    for metric in (DEVICE_INFO, DEVICE_HEALTHY, DEVICE_HEALTH_STATE, DEVICE_TAINT_INFO):
        metric.remove_by_labels({"driver": driver, "device": device})
