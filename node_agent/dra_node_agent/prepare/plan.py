"""What to prepare for one claim, worked out from its allocation results and opaque configs.

``Planner.plan`` touches nothing: it maps each of this driver's results to a device this node
publishes, validates the driver's opaque config (class entries, then claim entries, per request)
and says what set-up each device needs. A config this driver cannot carry out fails here, before
any device is touched.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from dra_node_agent import checkpoint as cp
from dra_node_agent.claim_reader import AllocatedDevice, ClaimAllocation, describe
from dra_node_agent.device_setup import DeviceSetupError
from dra_node_agent.devices import ContainerEdits, DiscoveredDevice
from dra_node_agent.opaqueconfig import (
    ComputeDomainChannelConfig,
    ComputeDomainDaemonConfig,
    DriverConfig,
    GoogleTpuConfig,
    GpuConfig,
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
    # Devices that join the claim to a domain (compute-domain channels and daemons): device name ->
    # whether it asks for every channel (allocationMode All).
    domain_devices: tuple[tuple[str, bool], ...] = ()

    @property
    def touches_devices(self) -> bool:
        """Whether set-up changes device state (then the results are recorded before it runs, so a
        crash in between leaves an entry that says what to undo)."""
        return any(
            p.time_slice is not None or p.mps or p.dynamic_mig or p.compute_domain for p in self.results
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
            f"never reconfigures it (other claims may hold it), so GpuConfig sharing.strategy "
            f"{sharing.strategy} cannot apply; leave sharing out of admin-access requests"
        )
    return cp.CheckpointedDevice(
        request=result.request,
        pool=result.pool,
        device=result.device,
        admin_access=result.admin_access,
        shared=result.shared,
        share_id=result.share_id,
        time_slice=sharing.time_slice_interval if sharing is not None else None,
        mps=sharing is not None and sharing.mps is not None,
        # A placement's instance is made by the claims that hold it, never by one that observes it.
        dynamic_mig=device.mig_placement is not None and not result.admin_access,
        compute_domain=domain,
    )


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
        for rc in configs:
            # No VFIO device is ever published here, so such a config can never take effect: asking
            # for passthrough must fail rather than hand out a device bound to its usual driver.
            if isinstance(rc.config, VfioDeviceConfig):
                raise PrepareError(f"{rc.where}: {not_implemented(rc.config)}")
        planned: list[cp.CheckpointedDevice] = []
        devices: dict[str, DiscoveredDevice] = {}
        claim_env: dict[str, str] = {}
        claim_configs: dict[DriverConfig, str] = {}
        mps_configs: list[tuple[MpsConfig, list[str]]] = []
        mps_devices: dict[str, DiscoveredDevice] = {}
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
        mps_limits = self._mps_limits(allocation, mps_configs, list(mps_devices.values()), devices)
        return PreparePlan(
            results=tuple(planned),
            devices=tuple(devices.values()),
            claim_config=next(iter(claim_configs), None),
            mps_limits=mps_limits,
            domain_devices=tuple(sorted(domain_devices.items())),
        )

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
    ) -> object | None:
        """One daemon serves the claim: its settings, and its folders and limits added to the
        container edits of the claim's first MPS GPU (``devices`` is updated)."""
        if not configs:
            return None
        where = describe(allocation.ref)
        requests = sorted({r for _, rs in configs for r in rs})
        if len(configs) > 1:
            raise PrepareError(
                f"{where}: requests {', '.join(requests)}: their GpuConfig sharing.mpsConfig entries differ, "
                "but one MPS control daemon serves the whole claim; give them the same mpsConfig"
            )
        mps = self._node.mps
        assert mps is not None  # _apply_config refused MPS without it
        ((config, _),) = configs
        try:
            limits: object = mps.limits(
                config, gpus, where=f"request {', '.join(requests)}: GpuConfig sharing.mpsConfig"
            )
        except DeviceSetupError as exc:
            raise PrepareError(f"{where}: {exc}") from exc
        first = min(gpus, key=lambda d: d.pci_bus_id or d.name).name
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
            elif isinstance(config, GpuConfig) and config.sharing is not None:
                sharing = config.sharing
                if sharing.time_slice_interval is not None and self._node.gpu_sharing is None:
                    raise PrepareError(
                        f"{entry.where}: GpuConfig sharing.strategy TimeSlicing: this driver's GPUs cannot "
                        f"be time-sliced here (no NVML) (request {request}, device {device.name})"
                    )
                if sharing.mps is not None and self._node.mps is None:
                    raise PrepareError(
                        f"{entry.where}: GpuConfig sharing.strategy MPS: MPS is off on this node "
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
