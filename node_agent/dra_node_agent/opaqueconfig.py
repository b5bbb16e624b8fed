"""Strict validation of this driver's opaque device configuration.

A claim or DeviceClass may carry `config[].opaque {driver, parameters}`; parameters for our drivers
are Kubernetes-style objects (`apiVersion` + `kind`) checked here field by field. Unknown fields,
wrong types, unknown kinds and values out of range are rejected with a message naming the field.
Configuration for other drivers is ignored (a claim may mix drivers).

NVIDIA (schema compatible with NVIDIA's DRA driver, group `resource.nvidia.com/v1beta1`; the
alias `gpu.nvidia.com/v1beta1` is accepted too):

    kind: GpuConfig
    sharing:
      strategy: TimeSlicing | MPS
      timeSlicingConfig: {interval: Default | Short | Medium | Long}   # TimeSlicing only
      mpsConfig:                                                      # MPS only
        defaultActiveThreadPercentage: 1..100
        defaultPinnedDeviceMemoryLimit: <quantity>
        defaultPerDevicePinnedMemoryLimit: {<uuid or index>: <quantity>}

    kind: MigDeviceConfig        # for MIG devices: sharing.strategy TimeSlicing | MPS, mpsConfig

TPU (`tpu.google.com/v1alpha1`):

    kind: TpuConfig
    workerId: <int >= 0>                 # TPU_WORKER_ID for a host of a multi-host slice
    workerHostnames: [<host>, ...]       # TPU_WORKER_HOSTNAMES, ordered by worker id
    iciResiliency: <bool>                # ENABLE_ICI_RESILIENCY (v4/v5p slices of 4x4x4 and up)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dra_api.names import GPU_DRIVER, TPU_DRIVER

GPU_API_VERSIONS = ("resource.nvidia.com/v1beta1", "gpu.nvidia.com/v1beta1")
TPU_API_VERSIONS = ("tpu.google.com/v1alpha1",)
SHARING_STRATEGIES = ("TimeSlicing", "MPS")
TIME_SLICE_INTERVALS = ("Default", "Short", "Medium", "Long")

_QUANTITY = re.compile(r"^(\d+(\.\d+)?|\.\d+)([eE]\d+|[KMGTPE]i|[kMGTPE])?$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:\d+)?$")


class OpaqueConfigError(ValueError):
    """Opaque parameters for this driver that do not follow its schema."""


@dataclass(frozen=True)
class MpsConfig:
    default_active_thread_percentage: int | None = None
    default_pinned_device_memory_limit: str | None = None
    default_per_device_pinned_memory_limit: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Sharing:
    strategy: Literal["TimeSlicing", "MPS"]
    time_slice_interval: str | None = None
    mps: MpsConfig | None = None


@dataclass(frozen=True)
class GpuConfig:
    sharing: Sharing | None = None
    applies_to: str = "gpu"


@dataclass(frozen=True)
class MigDeviceConfig:
    sharing: Sharing | None = None
    applies_to: str = "mig"


@dataclass(frozen=True)
class TpuConfig:
    worker_id: int | None = None
    worker_hostnames: tuple[str, ...] = ()
    ici_resiliency: bool | None = None
    applies_to: str = "tpu"


DriverConfig = GpuConfig | MigDeviceConfig | TpuConfig


@dataclass(frozen=True)
class RequestConfig:
    """One validated config entry of an allocation: where it came from and which requests it covers."""

    source: str  # "FromClass" or "FromClaim"
    requests: tuple[str, ...]  # empty: every request
    config: DriverConfig

    def covers(self, request: str) -> bool:
        """True if this entry applies to `request` ("req" also matches subrequest "req/sub")."""
        if not self.requests:
            return True
        top = request.split("/", 1)[0]
        return request in self.requests or top in self.requests


class _Fields:
    """Reads one object strictly, recording which fields were consumed."""

    def __init__(self, raw: Any, where: str) -> None:
        if not isinstance(raw, Mapping):
            raise OpaqueConfigError(f"{where}: must be an object, not {_type_name(raw)}")
        self.raw = raw
        self.where = where
        self.seen: set[str] = set()

    def path(self, name: str) -> str:
        return f"{self.where}.{name}"

    def get(self, name: str) -> Any:
        self.seen.add(name)
        return self.raw.get(name)

    def string(
        self, name: str, *, choices: Sequence[str] | None = None, required: bool = False
    ) -> str | None:
        value = self.get(name)
        if value is None:
            if required:
                raise OpaqueConfigError(f"{self.path(name)}: required")
            return None
        if not isinstance(value, str):
            raise OpaqueConfigError(f"{self.path(name)}: must be a string, not {_type_name(value)}")
        if choices is not None and value not in choices:
            raise OpaqueConfigError(f"{self.path(name)}: {value!r} is not one of {', '.join(choices)}")
        return value

    def integer(self, name: str, *, minimum: int, maximum: int | None = None) -> int | None:
        value = self.get(name)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise OpaqueConfigError(f"{self.path(name)}: must be an integer, not {_type_name(value)}")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
            raise OpaqueConfigError(f"{self.path(name)}: {value} is out of range ({bound})")
        return value

    def boolean(self, name: str) -> bool | None:
        value = self.get(name)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise OpaqueConfigError(f"{self.path(name)}: must be a boolean, not {_type_name(value)}")
        return value

    def done(self) -> None:
        unknown = sorted(str(k) for k in self.raw if k not in self.seen)
        if unknown:
            raise OpaqueConfigError(f"{self.path(unknown[0])}: unknown field")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def _quantity(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _QUANTITY.match(value):
        raise OpaqueConfigError(f"{where}: {value!r} is not a non-negative quantity such as '10Gi'")
    return value


def _parse_sharing(raw: Any, where: str, *, mig: bool) -> Sharing:
    f = _Fields(raw, where)
    strategy = f.string("strategy", choices=SHARING_STRATEGIES, required=True)
    interval = None
    ts_raw = f.get("timeSlicingConfig")
    if ts_raw is not None:
        if mig:
            raise OpaqueConfigError(
                f"{f.path('timeSlicingConfig')}: unknown field (time-slicing does not apply to MIG)"
            )
        if strategy != "TimeSlicing":
            raise OpaqueConfigError(f"{f.path('timeSlicingConfig')}: only allowed with strategy TimeSlicing")
        ts = _Fields(ts_raw, f.path("timeSlicingConfig"))
        interval = ts.string("interval", choices=TIME_SLICE_INTERVALS)
        ts.done()
    mps = None
    mps_raw = f.get("mpsConfig")
    if mps_raw is not None:
        if strategy != "MPS":
            raise OpaqueConfigError(f"{f.path('mpsConfig')}: only allowed with strategy MPS")
        mps = _parse_mps(mps_raw, f.path("mpsConfig"))
    f.done()
    chosen: Literal["TimeSlicing", "MPS"] = "MPS" if strategy == "MPS" else "TimeSlicing"
    return Sharing(strategy=chosen, time_slice_interval=interval, mps=mps)


def _parse_mps(raw: Any, where: str) -> MpsConfig:
    f = _Fields(raw, where)
    percentage = f.integer("defaultActiveThreadPercentage", minimum=1, maximum=100)
    limit_raw = f.get("defaultPinnedDeviceMemoryLimit")
    limit = _quantity(limit_raw, f.path("defaultPinnedDeviceMemoryLimit")) if limit_raw is not None else None
    per_device_raw = f.get("defaultPerDevicePinnedMemoryLimit")
    per_device = None
    if per_device_raw is not None:
        path = f.path("defaultPerDevicePinnedMemoryLimit")
        if not isinstance(per_device_raw, Mapping):
            raise OpaqueConfigError(f"{path}: must be an object, not {_type_name(per_device_raw)}")
        per_device = {str(k): _quantity(v, f"{path}.{k}") for k, v in per_device_raw.items()}
    f.done()
    return MpsConfig(
        default_active_thread_percentage=percentage,
        default_pinned_device_memory_limit=limit,
        default_per_device_pinned_memory_limit=per_device,
    )


def _parse_gpu(f: _Fields, kind: str) -> DriverConfig:
    sharing_raw = f.get("sharing")
    if kind == "GpuConfig":
        sharing = (
            _parse_sharing(sharing_raw, f.path("sharing"), mig=False) if sharing_raw is not None else None
        )
        f.done()
        return GpuConfig(sharing=sharing)
    sharing = _parse_sharing(sharing_raw, f.path("sharing"), mig=True) if sharing_raw is not None else None
    f.done()
    return MigDeviceConfig(sharing=sharing)


def _parse_tpu(f: _Fields) -> TpuConfig:
    worker_id = f.integer("workerId", minimum=0)
    hostnames_raw = f.get("workerHostnames")
    hostnames: tuple[str, ...] = ()
    if hostnames_raw is not None:
        path = f.path("workerHostnames")
        if not isinstance(hostnames_raw, list):
            raise OpaqueConfigError(f"{path}: must be a list, not {_type_name(hostnames_raw)}")
        for i, host in enumerate(hostnames_raw):
            if not isinstance(host, str) or not _HOSTNAME.match(host):
                raise OpaqueConfigError(f"{path}[{i}]: {host!r} is not a hostname or IP address")
        hostnames = tuple(hostnames_raw)
        if worker_id is not None and worker_id >= len(hostnames):
            raise OpaqueConfigError(f"{f.path('workerId')}: {worker_id} has no entry in workerHostnames")
    ici = f.boolean("iciResiliency")
    f.done()
    return TpuConfig(worker_id=worker_id, worker_hostnames=hostnames, ici_resiliency=ici)


class OpaqueConfigParser:
    """Validates opaque parameters for the GPU and TPU drivers (names configurable)."""

    def __init__(self, *, gpu_driver: str = GPU_DRIVER, tpu_driver: str = TPU_DRIVER) -> None:
        self.gpu_driver = gpu_driver
        self.tpu_driver = tpu_driver

    def parse(self, *, driver: str, parameters: Any, where: str = "parameters") -> DriverConfig:
        """Validate one opaque `parameters` object (a mapping, or JSON text/bytes) for `driver`."""
        if driver not in (self.gpu_driver, self.tpu_driver):
            raise OpaqueConfigError(f"{where}: driver {driver!r} is not handled by this agent")
        if isinstance(parameters, bytes | str):
            try:
                parameters = json.loads(parameters)
            except ValueError as err:
                raise OpaqueConfigError(f"{where}: not valid JSON ({err})") from err
        f = _Fields(parameters, where)
        gpu = driver == self.gpu_driver
        versions = GPU_API_VERSIONS if gpu else TPU_API_VERSIONS
        kinds = ("GpuConfig", "MigDeviceConfig") if gpu else ("TpuConfig",)
        api_version = f.string("apiVersion", required=True)
        if api_version not in versions:
            raise OpaqueConfigError(
                f"{f.path('apiVersion')}: {api_version!r} is not one of {', '.join(versions)}"
            )
        kind = f.string("kind", required=True) or ""
        if kind not in kinds:
            raise OpaqueConfigError(f"{f.path('kind')}: unknown kind {kind!r} (expected {', '.join(kinds)})")
        f.seen.add("metadata")  # tolerated like Kubernetes objects, but carries nothing
        if "metadata" in f.raw and not isinstance(f.raw["metadata"], Mapping):
            raise OpaqueConfigError(f"{f.path('metadata')}: must be an object")
        return _parse_gpu(f, kind) if gpu else _parse_tpu(f)

    def for_driver(
        self, *, driver: str, configs: Sequence[Mapping[str, Any]], where: str
    ) -> list[RequestConfig]:
        """Validate the entries of `status.allocation.devices.config` that belong to `driver`.

        Entries for other drivers are skipped. The result is ordered class config first, then claim
        config, each in listed order, so later entries override earlier ones (see `effective`).
        """
        found: list[tuple[int, int, RequestConfig]] = []
        for index, entry in enumerate(configs):
            entry_where = f"{where}.config[{index}]"
            if not isinstance(entry, Mapping):
                raise OpaqueConfigError(f"{entry_where}: must be an object")
            opaque = entry.get("opaque")
            if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
                continue
            source = str(entry.get("source", "FromClaim"))
            requests = entry.get("requests") or []
            if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
                raise OpaqueConfigError(f"{entry_where}.requests: must be a list of request names")
            config = self.parse(
                driver=driver, parameters=opaque.get("parameters"), where=f"{entry_where}.opaque.parameters"
            )
            order = 0 if source == "FromClass" else 1
            found.append(
                (order, index, RequestConfig(source=source, requests=tuple(requests), config=config))
            )
        return [rc for _, _, rc in sorted(found, key=lambda t: (t[0], t[1]))]


def effective(configs: Sequence[RequestConfig], *, request: str, device_kind: str) -> DriverConfig | None:
    """The config that applies to one allocated device: the last matching entry for its kind wins."""
    chosen: DriverConfig | None = None
    for rc in configs:
        if rc.covers(request) and rc.config.applies_to == device_kind:
            chosen = rc.config
    return chosen
