"""What to prepare for one claim, worked out from its allocation results and opaque configs.

``Planner.plan`` touches nothing: it maps each of this driver's results to a device this node
publishes, validates the driver's opaque config (class entries, then claim entries, per request)
and says what set-up each device needs. A config this driver cannot carry out fails here, before
any device is touched.

A GPU for passthrough (``type=vfio``) goes to a virtual machine whole: a claim with one has only
such devices of this driver, no admin access to them, and one ``VfioDeviceConfig`` (NVIDIA's
default, LegacyOnly without the API device, when it gives none), since its API device goes to every
container of the claim.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dra_node_agent import checkpoint as cp
from dra_node_agent.claim_reader import AllocatedDevice, ClaimAllocation, describe
from dra_node_agent.device_setup import DeviceSetupError
from dra_node_agent.devices import ContainerEdits, DiscoveredDevice, format_quantity
from dra_node_agent.opaqueconfig import (
    ComputeDomainChannelConfig,
    ComputeDomainDaemonConfig,
    DriverConfig,
    GoogleTpuConfig,
    GpuConfig,
    IommuConfig,
    MigDeviceConfig,
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
from dra_node_agent.prepare.driver_node import DriverNode
from dra_node_agent.prepare.errors import PrepareError

logger = logging.getLogger(__name__)

_ENV_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True)
class PreparePlan:
    """What to prepare for one claim of this driver."""

    # The checkpoint records, one per allocation result of this driver: what set-up each asks for.
    results: tuple[cp.CheckpointedDevice, ...]
    # The distinct devices the results use, with the container edits their configs add.
    devices: tuple[DiscoveredDevice, ...]
    # The claim's claim-wide config, if any (a `tpu.google.com` TpuConfig): the vendor's container
    # environment and device status read it, with the vendor's context of the claim.
    claim_config: DriverConfig | None
    # The settings of the claim's MPS daemon (as the MPS tool computed them), if it asks for one.
    mps_limits: object | None
    # The IOMMU settings of the claim's GPUs for passthrough (None: it has none).
    iommu: IommuConfig | None = None
    # The config kind that asked for the daemon (GpuConfig, or MigDeviceConfig for MIG devices).
    mps_kind: str = "GpuConfig"
    # Devices that join the claim to a domain (compute-domain channels and daemons): device name ->
    # whether it asks for every channel (allocationMode All).
    domain_devices: tuple[tuple[str, bool], ...] = ()

    @property
    def touches_devices(self) -> bool:
        """Whether set-up changes device state (then the results are recorded before it runs, so a
        crash in between leaves an entry that says what to undo)."""
        return any(
            p.time_slice is not None
            or p.mps
            or p.dynamic_mig
            or p.vfio is not None
            or p.compute_domain is not None
            for p in self.results
        )

    def observes_only(self, device: str) -> bool:
        """Whether every result on ``device`` has admin access: set-up looks at it, never changes it."""
        return all(p.admin_access for p in self.results if p.device == device)


def _record(
    result: AllocatedDevice,
    device: DiscoveredDevice,
    sharing: Sharing | None,
    *,
    where: str,
    domain: str | None = None,
) -> cp.CheckpointedDevice:
    """The checkpoint record of one result: what set-up it asks of its device. A result with admin
    access observes a device other claims may hold: it asks for none, and sharing is refused."""
    if result.admin_access and sharing is not None:
        raise PrepareError(
            f"{where}: request {result.request}: admin access observes device {device.name} and "
            f"never reconfigures it (other claims may hold it), so {config_kind(device)} sharing.strategy "
            f"{sharing.strategy} cannot apply; leave sharing out of admin-access requests"
        )
    return cp.CheckpointedDevice(
        request=result.request,
        pool=result.pool,
        device=result.device,
        admin_access=result.admin_access,
        shared=result.shared,
        share_id=result.share_id,
        consumed=result.consumed,
        time_slice=sharing.time_slice_interval if sharing is not None else None,
        mps=sharing is not None and sharing.mps is not None,
        # A placement's instance is made by the claims that hold it, never by one that observes it.
        dynamic_mig=device.mig_placement is not None and not result.admin_access,
        vfio=cp.PassthroughRecord(pci_bus_id=device.pci_bus_id, iommu_group=int(device.local_id))
        if device.kind == "vfio" and device.pci_bus_id is not None
        else None,
        compute_domain=domain,
    )


def config_kind(device: DiscoveredDevice) -> str:
    """The NVIDIA config kind that applies to ``device`` (``opaqueconfig.effective_entry`` picks
    entries by it), for messages."""
    return "MigDeviceConfig" if device.kind == "mig" else "GpuConfig"


def shares_of(planned: Sequence[cp.CheckpointedDevice]) -> dict[str, dict[str, int]]:
    """What the claim's shares consume of each device it holds shares of, summed over its results
    (one claim may hold two shares of one device), by device name."""
    out: dict[str, dict[str, int]] = {}
    for result in planned:
        if not result.shared or result.admin_access:
            continue
        consumed = out.setdefault(result.device, {})
        for name, amount in result.consumed:
            consumed[name] = consumed.get(name, 0) + amount
    return out


def share_env(device: str, *, share_ids: Sequence[str], consumed: Mapping[str, int]) -> tuple[str, ...]:
    """What a container learns of its share of ``device``: the share IDs (``DRA_SHARE_<DEVICE>_ID``)
    and what they consume of each capacity (``DRA_SHARE_<DEVICE>_MEMORY=10Gi``)."""
    key = _ENV_UNSAFE.sub("_", device).upper()
    env = [f"DRA_SHARE_{key}_ID={','.join(share_ids)}"]
    env.extend(
        f"DRA_SHARE_{key}_{_ENV_UNSAFE.sub('_', name).upper()}={format_quantity(amount)}"
        for name, amount in sorted(consumed.items())
    )
    return tuple(env)


def _add_share_env(planned: Sequence[cp.CheckpointedDevice], devices: dict[str, DiscoveredDevice]) -> None:
    """Each shared device's edits get ``share_env`` (``devices`` is updated)."""
    for name, consumed in shares_of(planned).items():
        ids = [r.share_id for r in planned if r.device == name and r.shared and r.share_id is not None]
        device = devices[name]
        env = share_env(name, share_ids=ids, consumed=consumed)
        devices[name] = dataclasses.replace(device, edits=device.edits.merged(ContainerEdits(env=env)))


DomainConfig = ComputeDomainChannelConfig | ComputeDomainDaemonConfig


def _domain_config(
    configs: Sequence[RequestConfig], *, result: AllocatedDevice, device: DiscoveredDevice, where: str
) -> DomainConfig:
    """The ComputeDomain config a channel or daemon device needs (its domain is nowhere else)."""
    try:
        entry = effective_entry(
            configs, request=result.request, device_kind=device.kind, device_name=device.name
        )
    except OpaqueConfigError as exc:
        raise PrepareError(str(exc)) from exc
    config = entry.config if entry is not None else None
    if not isinstance(config, ComputeDomainChannelConfig | ComputeDomainDaemonConfig):
        kind = "ComputeDomainChannelConfig" if device.kind == "channel" else "ComputeDomainDaemonConfig"
        raise PrepareError(
            f"{where}: request {result.request}: device {device.name} joins a ComputeDomain, and no "
            f"{kind} says which: domainID cannot be empty (use the claim template the ComputeDomain "
            "names, which carries it)"
        )
    if result.admin_access:
        raise PrepareError(
            f"{where}: request {result.request}: admin access cannot join a ComputeDomain "
            f"(device {device.name})"
        )
    return config


class Planner:
    """Plans one driver's claims on this node."""

    def __init__(self, node: DriverNode, parser: OpaqueConfigParser) -> None:
        self._node = node
        self._parser = parser

    def plan(self, allocation: ClaimAllocation) -> PreparePlan:
        """Raises ``PrepareError`` for a device this node does not publish, an invalid config, or a
        valid config whose effect this driver does not implement yet."""
        node = self._node
        where = describe(allocation.ref)
        try:
            configs = self._parser.for_driver(
                driver=node.driver,
                configs=allocation.config_entries,
                where=f"{where}: status.allocation.devices",
            )
        except OpaqueConfigError as exc:
            raise PrepareError(f"invalid opaque config: {exc}") from exc
        planned: list[cp.CheckpointedDevice] = []
        devices: dict[str, DiscoveredDevice] = {}
        claim_env: dict[str, str] = {}
        claim_configs: dict[DriverConfig, str] = {}
        mps_configs: list[tuple[MpsConfig, list[str]]] = []
        mps_devices: dict[str, DiscoveredDevice] = {}
        iommu: dict[IommuConfig, list[str]] = {}
        domain_devices: dict[str, bool] = {}
        for result in allocation.devices:
            device = node.devices.get(result.device)
            if result.pool != node.node_name or device is None:
                raise PrepareError(
                    f"{where}: allocated device {result.pool}/{result.device} of driver {node.driver} "
                    f"is not published by node {node.node_name}"
                )
            if device.mig_placement is not None and node.dynamic_mig is None:
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
                claim_configs=claim_configs,
            )
            if device.kind == "vfio":
                self._passthrough(configs, result=result, device=device, where=where, iommu=iommu)
            if sharing is not None and sharing.mps is not None:
                same = next((pair for pair in mps_configs if pair[0] == sharing.mps), None)
                if same is None:
                    mps_configs.append((sharing.mps, [result.request]))
                else:
                    same[1].append(result.request)
                mps_devices.setdefault(device.name, device)
            domain = self._domain(configs, result=result, device=device, where=where, wanted=domain_devices)
            planned.append(_record(result, device, sharing, where=where, domain=domain))
            devices.setdefault(device.name, device)
        if len(claim_configs) > 1:
            # Its settings become container-wide environment: two values would leave the outcome to
            # the order in which the runtime applies CDI devices.
            raise PrepareError(
                f"{where}: conflicting TPU configs within the claim: the {TpuConfig.GROUP} TpuConfig "
                f"entries {', '.join(sorted(claim_configs.values()))} differ, but they apply to the whole "
                "container"
            )
        _add_share_env(planned, devices)
        mps_gpus = list(mps_devices.values())
        mps_limits = self._mps_limits(allocation, mps_configs, mps_gpus, devices, planned)
        return PreparePlan(
            results=tuple(planned),
            devices=tuple(devices.values()),
            claim_config=next(iter(claim_configs), None),
            mps_limits=mps_limits,
            iommu=_one_iommu_config(iommu, devices.values(), where=where),
            mps_kind=config_kind(mps_gpus[0]) if mps_gpus else "GpuConfig",
            domain_devices=tuple(sorted(domain_devices.items())),
        )

    def _passthrough(
        self,
        configs: Sequence[RequestConfig],
        *,
        result: AllocatedDevice,
        device: DiscoveredDevice,
        where: str,
        iommu: dict[IommuConfig, list[str]],
    ) -> None:
        """Check one result on a GPU for passthrough; note the IOMMU settings it asks for."""
        what = f"{where}: request {result.request}: device {device.name} is a GPU for passthrough"
        if self._node.passthrough is None:
            raise PrepareError(f"{what}, and driver {self._node.driver} cannot pass GPUs through here")
        if result.admin_access:
            raise PrepareError(
                f"{what}: admin access observes a device other claims hold, but a GPU for passthrough is "
                "handed to one virtual machine whole; leave adminAccess out"
            )
        try:
            entry = effective_entry(
                configs, request=result.request, device_kind="vfio", device_name=device.name
            )
        except OpaqueConfigError as exc:
            raise PrepareError(str(exc)) from exc
        config = entry.config if entry is not None else VfioDeviceConfig()
        assert isinstance(config, VfioDeviceConfig)
        iommu.setdefault(config.iommu, []).append(result.request)

    def _domain(
        self,
        configs: Sequence[RequestConfig],
        *,
        result: AllocatedDevice,
        device: DiscoveredDevice,
        where: str,
        wanted: dict[str, bool],
    ) -> str | None:
        """The domain a channel or daemon device joins (None for any other device); records in
        ``wanted`` whether it asks for every channel."""
        if device.kind not in ("channel", "daemon"):
            return None
        node = self._node
        if node.domains is None:
            raise PrepareError(
                f"{where}: device {device.name} of driver {node.driver} joins a ComputeDomain, and "
                "this agent does not serve ComputeDomains (--compute-domains=false)"
            )
        config = _domain_config(configs, result=result, device=device, where=where)
        every = isinstance(config, ComputeDomainChannelConfig) and config.allocation_mode == "All"
        wanted[device.name] = every
        return config.domain_id

    def _mps_limits(
        self,
        allocation: ClaimAllocation,
        configs: Sequence[tuple[MpsConfig, list[str]]],
        gpus: Sequence[DiscoveredDevice],
        devices: dict[str, DiscoveredDevice],
        planned: Sequence[cp.CheckpointedDevice],
    ) -> object | None:
        """One daemon serves the claim, over its whole GPUs or over its MIG devices: its settings,
        and its folders and limits added to the container edits of the claim's first MPS device
        (``devices`` is updated). On a GPU the claim holds a share of, the share bounds the limits
        (``shares_of``)."""
        if not configs:
            return None
        where = describe(allocation.ref)
        requests = sorted({r for _, rs in configs for r in rs})
        kinds = sorted({config_kind(d) for d in gpus})
        if len(kinds) > 1:
            # CUDA refuses a server that would see MIG devices and whole GPUs together.
            raise PrepareError(
                f"{where}: requests {', '.join(requests)}: GpuConfig and MigDeviceConfig both ask for MPS, "
                "but one MPS control daemon serves the whole claim, over either whole GPUs or MIG devices; "
                "ask for MPS on one kind of device per claim"
            )
        (kind,) = kinds
        if len(configs) > 1:
            raise PrepareError(
                f"{where}: requests {', '.join(requests)}: their {kind} sharing.mpsConfig entries differ, "
                "but one MPS control daemon serves the whole claim; give them the same mpsConfig"
            )
        mps = self._node.mps
        assert mps is not None  # _apply_config refused MPS without it
        ((config, _),) = configs
        try:
            limits: object = mps.limits(
                config,
                gpus,
                where=f"request {', '.join(requests)}: {kind} sharing.mpsConfig",
                shares=shares_of(planned),
            )
        except DeviceSetupError as exc:
            raise PrepareError(f"{where}: {exc}") from exc
        first = min(gpus, key=lambda d: (d.pci_bus_id or d.name, d.name)).name
        device = devices[first]
        devices[first] = dataclasses.replace(
            device, edits=device.edits.merged(mps.edits(allocation.ref.uid, limits))
        )
        return limits

    def _apply_config(
        self,
        configs: Sequence[RequestConfig],
        *,
        request: str,
        device: DiscoveredDevice,
        where: str,
        claim_env: dict[str, str],
        claim_configs: dict[DriverConfig, str],
    ) -> tuple[DiscoveredDevice, Sharing | None]:
        """Carry out the config that applies to one device: the device, with the edits it adds, and
        the sharing a GpuConfig asks for on it (set up later, by ``set_up.DeviceSetUp``).

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
                claim_configs.setdefault(config, entry.where)
            elif isinstance(config, GpuConfig | MigDeviceConfig) and config.sharing is not None:
                sharing = config.sharing
                if sharing.mps is not None and device.mig_placement is not None:
                    # NVIDIA's driver refuses MPS with DynamicMIG too.
                    raise PrepareError(
                        f"{entry.where}: MigDeviceConfig sharing.strategy MPS: MPS on a dynamic MIG "
                        "placement is not implemented (its instance is made at prepare); use MPS on static "
                        f"MIG devices (request {request}, device {device.name})"
                    )
                if sharing.time_slice_interval is not None and self._node.gpu_sharing is None:
                    raise PrepareError(
                        f"{entry.where}: GpuConfig sharing.strategy TimeSlicing: this driver's GPUs cannot "
                        f"be time-sliced here (no NVML) (request {request}, device {device.name})"
                    )
                if sharing.mps is not None and self._node.mps is None:
                    raise PrepareError(
                        f"{entry.where}: {config.KIND} sharing.strategy MPS: MPS is off on this node "
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


def _one_iommu_config(
    iommu: dict[IommuConfig, list[str]], devices: Iterable[DiscoveredDevice], *, where: str
) -> IommuConfig | None:
    """The claim's one VFIO config (None without GPUs for passthrough), as NVIDIA's driver allows
    one per claim; a claim that mixes such GPUs with other devices of the driver is refused."""
    if not iommu:
        return None
    others = sorted(d.name for d in devices if d.kind != "vfio")
    if others:
        raise PrepareError(
            f"{where}: GPUs for passthrough go to a virtual machine, and the claim also holds "
            f"{', '.join(others)} for containers; ask for them in claims of their own"
        )
    if len(iommu) > 1:
        requests = sorted(r for rs in iommu.values() for r in rs)
        raise PrepareError(
            f"{where}: requests {', '.join(requests)}: their VfioDeviceConfig iommu settings differ, but "
            "one applies to the whole claim (its API device goes to every container); give them the same"
        )
    return next(iter(iommu))
