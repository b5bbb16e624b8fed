"""Strict validation of this driver's opaque device configuration.

A claim or DeviceClass may carry `config[].opaque {driver, parameters}`; parameters for our drivers
are Kubernetes-style objects (`apiVersion` + `kind`) checked here field by field, with the field
names, defaults and error wording of the vendors' own drivers. Unknown fields are rejected, as both
vendors' strict decoders do; so are wrong types, unknown kinds and values out of range, with a
message naming the field. Configuration for other drivers is ignored (a claim may mix drivers).

Accepting a config is not applying it: `not_implemented` says which valid settings this driver does
not carry out yet, and prepare refuses those with that message instead of ignoring them.

NVIDIA (`resource.nvidia.com/v1beta1`, as NVIDIA's DRA driver `dra-driver-nvidia-gpu`; the
alias `gpu.nvidia.com/v1beta1` is this product's and is accepted too):

    kind: GpuConfig
    sharing:                                       # unset: no sharing (NVIDIA's default, gates off)
      strategy: TimeSlicing | MPS
      timeSlicingConfig: {interval: Default | Short | Medium | Long}   # TimeSlicing; default Default
      mpsConfig:                                                      # MPS; default {}
        defaultActiveThreadPercentage: 0..100
        defaultPinnedDeviceMemoryLimit: <quantity>
        defaultPerDevicePinnedMemoryLimit: {<uuid or index>: <quantity>}
        multiUser: <bool>                                             # default false

    kind: MigDeviceConfig        # for MIG devices: sharing.strategy TimeSlicing | MPS, mpsConfig
    kind: VfioDeviceConfig       # passthrough: iommu {backendPolicy: LegacyOnly (default) |
                                 #   PreferIommuFD, enableAPIDevice: <bool> (default false)}

NVIDIA's compute-domain driver (`compute-domain.nvidia.com`, the same group and version):

    kind: ComputeDomainChannelConfig   # a channel claim of a ComputeDomain (the controller writes it)
    domainID: <the ComputeDomain's UID>                # required
    allocationMode: Single | All                       # default Single: channel 0; All: every channel

    kind: ComputeDomainDaemonConfig    # an IMEX daemon's claim
    domainID: <the ComputeDomain's UID>                # required

Given to the GPU driver they are refused, with a message naming the driver they configure.

TPU, Google's TPU DRA driver (`tpu.resource.google.com/v1alpha1`):

    kind: TpuConfig
    logging:                     # libtpu logging; unset: libtpu's defaults
      level: 0..3                # TPU_MIN_LOG_LEVEL (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL)
      stderrLevel: 0..3          # TPU_STDERR_LOG_LEVEL; defaults to level

TPU, this product's own group (`tpu.google.com/v1alpha1`):

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
from typing import Any, ClassVar, Literal

from dra_api import computedomains as cd
from dra_api.names import GPU_DRIVER, TPU_DRIVER
from dra_node_agent.tenant_text import quoted, shown

NVIDIA_GROUP = "resource.nvidia.com"
NVIDIA_API_VERSION = "resource.nvidia.com/v1beta1"
GPU_API_VERSIONS = (NVIDIA_API_VERSION, "gpu.nvidia.com/v1beta1")
GOOGLE_TPU_GROUP = "tpu.resource.google.com"
GOOGLE_TPU_API_VERSION = "tpu.resource.google.com/v1alpha1"
OWN_TPU_GROUP = "tpu.google.com"
OWN_TPU_API_VERSION = "tpu.google.com/v1alpha1"
TPU_API_VERSIONS = (GOOGLE_TPU_API_VERSION, OWN_TPU_API_VERSION)
GPU_KINDS = ("GpuConfig", "MigDeviceConfig", "VfioDeviceConfig")
COMPUTE_DOMAIN_KINDS = (cd.CHANNEL_CONFIG_KIND, cd.DAEMON_CONFIG_KIND)
COMPUTE_DOMAIN_DRIVER = cd.DRIVER
SHARING_STRATEGIES = ("TimeSlicing", "MPS")
TIME_SLICE_INTERVALS = ("Default", "Short", "Medium", "Long")
IOMMU_BACKEND_POLICIES = ("PreferIommuFD", "LegacyOnly")
TPU_LOG_LEVEL_MIN, TPU_LOG_LEVEL_MAX = 0, 3  # libtpu: 0 INFO, 1 WARNING, 2 ERROR, 3 FATAL
# Bounds of what one claim brings for this driver. The API server allows 64 config entries of 10 KiB
# each in an allocation; the agent holds one claim to 64 entries and 64 KiB in all for its driver
# (each of the vendors' kinds needs a few hundred bytes), nested at most 16 deep.
MAX_CONFIGS_PER_CLAIM = 64
MAX_PARAMETERS_BYTES = 10 * 1024
MAX_CONFIG_BYTES_PER_CLAIM = 64 * 1024
MAX_NESTING = 16

_QUANTITY = re.compile(r"^(\d+(\.\d+)?|\.\d+)([eE]\d+|[KMGTPE]i|[kMGTPE])?$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:\d+)?$")


class OpaqueConfigError(ValueError):
    """Opaque parameters for this driver that do not follow its schema."""


@dataclass(frozen=True)
class MpsConfig:
    default_active_thread_percentage: int | None = None
    default_pinned_device_memory_limit: str | None = None
    default_per_device_pinned_memory_limit: Mapping[str, str] | None = None
    multi_user: bool = False


@dataclass(frozen=True)
class Sharing:
    strategy: Literal["TimeSlicing", "MPS"]
    time_slice_interval: str | None = None  # "Default" once normalized, for TimeSlicing on a GPU
    mps: MpsConfig | None = None  # MpsConfig() once normalized, for MPS


@dataclass(frozen=True)
class GpuConfig:
    KIND: ClassVar[str] = "GpuConfig"
    GROUP: ClassVar[str] = NVIDIA_GROUP
    sharing: Sharing | None = None
    applies_to: str = "gpu"


@dataclass(frozen=True)
class MigDeviceConfig:
    KIND: ClassVar[str] = "MigDeviceConfig"
    GROUP: ClassVar[str] = NVIDIA_GROUP
    sharing: Sharing | None = None
    applies_to: str = "mig"


@dataclass(frozen=True)
class IommuConfig:
    backend_policy: str = "LegacyOnly"
    enable_api_device: bool = False


@dataclass(frozen=True)
class VfioDeviceConfig:
    KIND: ClassVar[str] = "VfioDeviceConfig"
    GROUP: ClassVar[str] = NVIDIA_GROUP
    iommu: IommuConfig = IommuConfig()
    applies_to: str = "vfio"


@dataclass(frozen=True)
class TpuLogging:
    level: int | None = None
    stderr_level: int | None = None  # defaults to level


@dataclass(frozen=True)
class GoogleTpuConfig:
    """Google's `tpu.resource.google.com/v1alpha1` TpuConfig."""

    KIND: ClassVar[str] = "TpuConfig"
    GROUP: ClassVar[str] = GOOGLE_TPU_GROUP
    logging: TpuLogging | None = None
    applies_to: str = "tpu"

    def env(self) -> tuple[str, ...]:
        """The libtpu environment this config asks for (container-wide, as Google's driver sets it)."""
        if self.logging is None:
            return ()
        env = []
        if self.logging.level is not None:
            env.append(f"TPU_MIN_LOG_LEVEL={self.logging.level}")
        if self.logging.stderr_level is not None:
            env.append(f"TPU_STDERR_LOG_LEVEL={self.logging.stderr_level}")
        return tuple(env)


@dataclass(frozen=True)
class TpuConfig:
    """This product's `tpu.google.com/v1alpha1` TpuConfig (multi-host worker identity, ICI)."""

    KIND: ClassVar[str] = "TpuConfig"
    GROUP: ClassVar[str] = OWN_TPU_GROUP
    worker_id: int | None = None
    worker_hostnames: tuple[str, ...] = ()
    ici_resiliency: bool | None = None
    applies_to: str = "tpu"


@dataclass(frozen=True)
class ComputeDomainChannelConfig:
    """NVIDIA's ComputeDomainChannelConfig: which domain a channel claim joins, and whether its
    containers get channel 0 (Single) or every IMEX channel of the node (All)."""

    KIND: ClassVar[str] = cd.CHANNEL_CONFIG_KIND
    GROUP: ClassVar[str] = NVIDIA_GROUP
    domain_id: str
    allocation_mode: str = cd.SINGLE
    applies_to: str = "channel"


@dataclass(frozen=True)
class ComputeDomainDaemonConfig:
    """NVIDIA's ComputeDomainDaemonConfig: the domain an IMEX daemon's claim serves."""

    KIND: ClassVar[str] = cd.DAEMON_CONFIG_KIND
    GROUP: ClassVar[str] = NVIDIA_GROUP
    domain_id: str
    applies_to: str = "daemon"


DriverConfig = (
    GpuConfig
    | MigDeviceConfig
    | VfioDeviceConfig
    | GoogleTpuConfig
    | TpuConfig
    | ComputeDomainChannelConfig
    | ComputeDomainDaemonConfig
)


@dataclass(frozen=True)
class RequestConfig:
    """One validated config entry of an allocation: where it came from and which requests it covers."""

    source: str  # "FromClass" or "FromClaim"
    requests: tuple[str, ...]  # empty: every request
    config: DriverConfig
    where: str = ""  # the entry's path, for messages

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

    def string(self, name: str, *, required: bool = False) -> str | None:
        value = self.get(name)
        if value is None:
            if required:
                raise OpaqueConfigError(f"{self.path(name)}: required")
            return None
        if not isinstance(value, str):
            raise OpaqueConfigError(f"{self.path(name)}: must be a string, not {_type_name(value)}")
        return value

    def integer(self, name: str) -> int | None:
        value = self.get(name)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise OpaqueConfigError(f"{self.path(name)}: must be an integer, not {_type_name(value)}")
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
            # Both vendors decode strictly; their decoder's words are `unknown field "<name>"`. The
            # name is the tenant's: escaped, so that a newline in it cannot forge a log line.
            name = unknown[0]
            raise OpaqueConfigError(f"{self.path(shown(name))}: unknown field {quoted(name)}")


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
    if not isinstance(value, str) or not _QUANTITY.fullmatch(value):
        raise OpaqueConfigError(f"{where}: {quoted(value)} is not a non-negative quantity such as '10Gi'")
    return value


def _parse_sharing(raw: Any, where: str, *, mig: bool) -> Sharing:
    f = _Fields(raw, where)
    strategy = f.string("strategy", required=True)
    if strategy not in SHARING_STRATEGIES:
        # NVIDIA says "GPU" for MIG devices too.
        raise OpaqueConfigError(f"{f.path('strategy')}: unknown GPU sharing strategy: {shown(strategy)}")
    interval = None
    ts_raw = f.get("timeSlicingConfig")
    if ts_raw is not None:
        if mig:  # MigDeviceSharing has no such field: NVIDIA's strict decoder rejects it
            raise OpaqueConfigError(
                f'{f.path("timeSlicingConfig")}: unknown field "timeSlicingConfig" '
                "(time-slicing does not apply to MIG)"
            )
        if strategy != "TimeSlicing":
            raise OpaqueConfigError(
                f"{f.path('timeSlicingConfig')}: cannot use TimeSlicingConfig with the '{strategy}' strategy"
            )
        ts = _Fields(ts_raw, f.path("timeSlicingConfig"))
        interval = ts.string("interval")
        if interval is not None and interval not in TIME_SLICE_INTERVALS:
            raise OpaqueConfigError(f"{ts.path('interval')}: unknown time-slice interval: {shown(interval)}")
        ts.done()
    mps = None
    mps_raw = f.get("mpsConfig")
    if mps_raw is not None:
        if strategy != "MPS":
            raise OpaqueConfigError(
                f"{f.path('mpsConfig')}: cannot use MpsConfig with the '{strategy}' strategy"
            )
        mps = _parse_mps(mps_raw, f.path("mpsConfig"))
    f.done()
    # NVIDIA's Normalize: TimeSlicing without an interval means Default, MPS without settings {}.
    if strategy == "TimeSlicing":
        return Sharing(strategy="TimeSlicing", time_slice_interval=None if mig else (interval or "Default"))
    return Sharing(strategy="MPS", mps=mps or MpsConfig())


def _parse_mps(raw: Any, where: str) -> MpsConfig:
    f = _Fields(raw, where)
    percentage = f.integer("defaultActiveThreadPercentage")
    if percentage is not None and percentage < 0:
        raise OpaqueConfigError(
            f"{f.path('defaultActiveThreadPercentage')}: active thread percentage must not be negative"
        )
    if percentage is not None and percentage > 100:
        raise OpaqueConfigError(
            f"{f.path('defaultActiveThreadPercentage')}: "
            "active thread percentage must not be greater than 100"
        )
    limit_raw = f.get("defaultPinnedDeviceMemoryLimit")
    limit = _quantity(limit_raw, f.path("defaultPinnedDeviceMemoryLimit")) if limit_raw is not None else None
    per_device_raw = f.get("defaultPerDevicePinnedMemoryLimit")
    per_device = None
    if per_device_raw is not None:
        path = f.path("defaultPerDevicePinnedMemoryLimit")
        if not isinstance(per_device_raw, Mapping):
            raise OpaqueConfigError(f"{path}: must be an object, not {_type_name(per_device_raw)}")
        per_device = {str(k): _quantity(v, f"{path}.{shown(str(k))}") for k, v in per_device_raw.items()}
    multi_user = f.boolean("multiUser")
    f.done()
    return MpsConfig(
        default_active_thread_percentage=percentage,
        default_pinned_device_memory_limit=limit,
        default_per_device_pinned_memory_limit=per_device,
        multi_user=bool(multi_user),
    )


def _parse_vfio(f: _Fields) -> VfioDeviceConfig:
    iommu_raw = f.get("iommu")
    f.done()
    if iommu_raw is None:
        return VfioDeviceConfig()
    iommu = _Fields(iommu_raw, f.path("iommu"))
    policy = iommu.string("backendPolicy")
    if policy is not None and policy != "" and policy not in IOMMU_BACKEND_POLICIES:
        raise OpaqueConfigError(
            f"{iommu.path('backendPolicy')}: unknown IOMMU backend policy: {quoted(policy)}"
        )
    api_device = iommu.boolean("enableAPIDevice")
    iommu.done()
    # NVIDIA's Normalize: an empty policy means LegacyOnly, an unset API device false.
    return VfioDeviceConfig(
        iommu=IommuConfig(backend_policy=policy or "LegacyOnly", enable_api_device=bool(api_device))
    )


def _parse_gpu(f: _Fields, kind: str) -> DriverConfig:
    if kind == "VfioDeviceConfig":
        return _parse_vfio(f)
    sharing_raw = f.get("sharing")
    mig = kind == "MigDeviceConfig"
    sharing = _parse_sharing(sharing_raw, f.path("sharing"), mig=mig) if sharing_raw is not None else None
    f.done()
    return MigDeviceConfig(sharing=sharing) if mig else GpuConfig(sharing=sharing)


def _parse_compute_domain(f: _Fields, kind: str) -> DriverConfig:
    domain_id = f.string("domainID") or ""
    if not domain_id:
        raise OpaqueConfigError(f"{f.path('domainID')}: domainID cannot be empty")
    if not cd.is_uid(domain_id):
        raise OpaqueConfigError(f"{f.path('domainID')}: {quoted(domain_id)} is not a ComputeDomain's UID")
    if kind == cd.DAEMON_CONFIG_KIND:
        f.done()
        return ComputeDomainDaemonConfig(domain_id=domain_id)
    mode = f.string("allocationMode") or cd.SINGLE
    if mode not in cd.ALLOCATION_MODES:
        raise OpaqueConfigError(
            f"{f.path('allocationMode')}: unknown allocation mode {quoted(mode)} (Single or All)"
        )
    f.done()
    return ComputeDomainChannelConfig(domain_id=domain_id, allocation_mode=mode)


def _parse_google_tpu(f: _Fields) -> GoogleTpuConfig:
    logging_raw = f.get("logging")
    f.done()
    if logging_raw is None:
        return GoogleTpuConfig()
    lf = _Fields(logging_raw, f.path("logging"))
    levels: dict[str, int | None] = {}
    for name in ("level", "stderrLevel"):
        value = lf.integer(name)
        if value is not None and not TPU_LOG_LEVEL_MIN <= value <= TPU_LOG_LEVEL_MAX:
            raise OpaqueConfigError(
                f"{lf.path(name)}: invalid {name}: {value}, must be between "
                f"{TPU_LOG_LEVEL_MIN} (INFO) and {TPU_LOG_LEVEL_MAX} (FATAL)"
            )
        levels[name] = value
    lf.done()
    level, stderr_level = levels["level"], levels["stderrLevel"]
    # Google's Normalize: stderrLevel defaults to level.
    return GoogleTpuConfig(
        logging=TpuLogging(level=level, stderr_level=stderr_level if stderr_level is not None else level)
    )


def _parse_own_tpu(f: _Fields) -> TpuConfig:
    worker_id = f.integer("workerId")
    if worker_id is not None and worker_id < 0:
        raise OpaqueConfigError(f"{f.path('workerId')}: {worker_id} is out of range (>= 0)")
    hostnames_raw = f.get("workerHostnames")
    hostnames: tuple[str, ...] = ()
    if hostnames_raw is not None:
        path = f.path("workerHostnames")
        if not isinstance(hostnames_raw, list):
            raise OpaqueConfigError(f"{path}: must be a list, not {_type_name(hostnames_raw)}")
        for i, host in enumerate(hostnames_raw):
            if not isinstance(host, str) or not _HOSTNAME.fullmatch(host):
                raise OpaqueConfigError(f"{path}[{i}]: {quoted(host)} is not a hostname or IP address")
        hostnames = tuple(hostnames_raw)
        if worker_id is not None and worker_id >= len(hostnames):
            raise OpaqueConfigError(f"{f.path('workerId')}: {worker_id} has no entry in workerHostnames")
    ici = f.boolean("iciResiliency")
    f.done()
    return TpuConfig(worker_id=worker_id, worker_hostnames=hostnames, ici_resiliency=ici)


class OpaqueConfigParser:
    """Validates opaque parameters for the GPU and TPU drivers (names configurable)."""

    def __init__(
        self,
        *,
        gpu_driver: str = GPU_DRIVER,
        tpu_driver: str = TPU_DRIVER,
        compute_domain_driver: str = COMPUTE_DOMAIN_DRIVER,
    ) -> None:
        self.gpu_driver = gpu_driver
        self.tpu_driver = tpu_driver
        self.compute_domain_driver = compute_domain_driver

    def parse(self, *, driver: str, parameters: Any, where: str = "parameters") -> DriverConfig:
        """Validate one opaque `parameters` object (a mapping, or JSON text/bytes) for `driver`."""
        if driver not in (self.gpu_driver, self.tpu_driver, self.compute_domain_driver):
            raise OpaqueConfigError(f"{where}: driver {quoted(driver)} is not handled by this agent")
        if isinstance(parameters, bytes | str):
            if len(parameters) > MAX_PARAMETERS_BYTES:
                raise OpaqueConfigError(
                    f"{where}: {len(parameters)} bytes, more than the {MAX_PARAMETERS_BYTES} of a config"
                )
            try:
                parameters = json.loads(parameters)
            except (ValueError, RecursionError) as err:
                raise OpaqueConfigError(f"{where}: not valid JSON ({shown(str(err))})") from err
        config_size(parameters, where=where, budget=MAX_PARAMETERS_BYTES)
        f = _Fields(parameters, where)
        gpu = driver == self.gpu_driver
        domains = driver == self.compute_domain_driver
        versions = GPU_API_VERSIONS if gpu else (NVIDIA_API_VERSION,) if domains else TPU_API_VERSIONS
        api_version = f.string("apiVersion", required=True)
        if api_version not in versions:
            raise OpaqueConfigError(
                f"{f.path('apiVersion')}: {quoted(api_version)} is not one of {', '.join(versions)}"
            )
        kind = f.string("kind", required=True) or ""
        if gpu and kind in COMPUTE_DOMAIN_KINDS:
            raise OpaqueConfigError(
                f"{f.path('kind')}: {kind} configures NVIDIA's compute-domain driver "
                f"({self.compute_domain_driver}), not {driver} devices; give it to that driver "
                "(opaque.driver), or let the ComputeDomain's claim template carry it"
            )
        kinds = GPU_KINDS if gpu else COMPUTE_DOMAIN_KINDS if domains else ("TpuConfig",)
        if kind not in kinds:
            raise OpaqueConfigError(
                f'{f.path("kind")}: no kind {quoted(kind)} is registered for version "{api_version}" '
                f"(expected {', '.join(kinds)})"
            )
        f.seen.add("metadata")  # tolerated like Kubernetes objects, but carries nothing
        if "metadata" in f.raw and not isinstance(f.raw["metadata"], Mapping):
            raise OpaqueConfigError(f"{f.path('metadata')}: must be an object")
        if gpu:
            return _parse_gpu(f, kind)
        if domains:
            return _parse_compute_domain(f, kind)
        return _parse_google_tpu(f) if api_version == GOOGLE_TPU_API_VERSION else _parse_own_tpu(f)

    def for_driver(
        self, *, driver: str, configs: Sequence[Mapping[str, Any]], where: str
    ) -> list[RequestConfig]:
        """Validate the entries of `status.allocation.devices.config` that belong to `driver`.

        Entries for other drivers are skipped. The result is ordered class config first, then claim
        config, each in listed order, so later entries override earlier ones (see `effective`).
        """
        found: list[tuple[int, int, RequestConfig]] = []
        _check_bounds(driver=driver, configs=configs, where=where)
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
                (
                    order,
                    index,
                    RequestConfig(source=source, requests=tuple(requests), config=config, where=entry_where),
                )
            )
        return [rc for _, _, rc in sorted(found, key=lambda t: (t[0], t[1]))]


def config_size(value: Any, *, where: str, budget: int) -> int:
    """About how many bytes ``value`` takes as JSON, counted without recursion; refuses a value over
    ``budget`` bytes or nested deeper than ``MAX_NESTING``, stopping as soon as it is."""
    size = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_NESTING:
            raise OpaqueConfigError(f"{where}: nested more than {MAX_NESTING} deep")
        if isinstance(item, Mapping):
            size += 2
            for key, child in item.items():
                size += len(str(key).encode()) + 4
                stack.append((child, depth + 1))
        elif isinstance(item, list | tuple):
            size += 2 + len(item)
            stack.extend((child, depth + 1) for child in item)
        else:
            size += len(str(item).encode()) + 2
        if size > budget:
            raise OpaqueConfigError(f"{where}: more than {budget} bytes of configuration")
    return size


def _check_bounds(*, driver: str, configs: Sequence[Any], where: str) -> None:
    """This driver's entries: at most ``MAX_CONFIGS_PER_CLAIM``, ``MAX_CONFIG_BYTES_PER_CLAIM`` in all."""
    ours: list[Mapping[str, Any]] = [
        e["opaque"]
        for e in configs
        if isinstance(e, Mapping)
        and isinstance(e.get("opaque"), Mapping)
        and e["opaque"].get("driver") == driver
    ]
    if len(ours) > MAX_CONFIGS_PER_CLAIM:
        raise OpaqueConfigError(
            f"{where}: {len(ours)} opaque configs for {driver}, more than the "
            f"{MAX_CONFIGS_PER_CLAIM} a claim may bring"
        )
    left = MAX_CONFIG_BYTES_PER_CLAIM
    for opaque in ours:
        try:
            left -= config_size(opaque.get("parameters"), where=where, budget=left)
        except OpaqueConfigError:
            raise OpaqueConfigError(
                f"{where}: the opaque configs for {driver} are more than the "
                f"{MAX_CONFIG_BYTES_PER_CLAIM} bytes (or {MAX_NESTING} levels) a claim may bring"
            ) from None


def effective_entry(
    configs: Sequence[RequestConfig],
    *,
    request: str,
    device_kind: str,
    device_name: str = "",
    group: str | None = None,
) -> RequestConfig | None:
    """The entry that applies to one allocated device, by NVIDIA's and Google's rule.

    Entries are searched from the highest precedence down (claim before class, later before
    earlier). An entry for every request is skipped when made for another kind of device; an entry
    naming this request but made for another kind of device is an error, as in NVIDIA's driver.
    `group` restricts the search to one API group's kinds (the two TPU groups are independent).
    """
    for rc in reversed(configs):
        if group is not None and group != rc.config.GROUP:
            continue
        if not rc.covers(request):
            continue
        if rc.config.applies_to == device_kind:
            return rc
        if rc.requests:
            raise OpaqueConfigError(
                f"{rc.where}: cannot apply {rc.config.KIND} to device {device_name!r} of type "
                f"{device_kind!r} (request: {request})"
            )
    return None


def effective(configs: Sequence[RequestConfig], *, request: str, device_kind: str) -> DriverConfig | None:
    """The config that applies to one allocated device (see `effective_entry`)."""
    entry = effective_entry(configs, request=request, device_kind=device_kind)
    return entry.config if entry is not None else None


def not_implemented(config: DriverConfig) -> str | None:
    """Why this valid config cannot be carried out by this driver yet; None when it can.

    Prepare refuses such a config with this text rather than run the workload without it.
    """
    if (
        isinstance(config, MigDeviceConfig)
        and config.sharing is not None
        and config.sharing.strategy == "TimeSlicing"
    ):
        return (
            "MigDeviceConfig sharing.strategy TimeSlicing: time-slicing does not apply to MIG devices "
            "(the GPU's time slice is shared by all its MIG devices, so one claim cannot set it); leave "
            "sharing out for a MIG device"
        )
    # Sharing on GPUs and MIG devices is applied at prepare (gpu_sharing, mps; multiUser, and MPS on
    # MIG devices, too); so is VfioDeviceConfig (prepare refuses a GPU for passthrough where none can be).
    return None
