"""What a simulated node brings to its drivers: the simulated ``vendor_record.VendorRecord``.

One backend per simulated profile runs instead of the hardware's. Everything else is the real
vendor's: the record of the vendor whose code runs over the fake hardware (``SimulatedHardware.vendor``:
NVIDIA's over the fake NVML, the TPU's over the fake sysfs) builds the tools, the container
environment, the device status data and the claim context from that code's backend. Only the
health probe of simulated GPUs is the simulation's own: it also reads the faults a test or a demo
drops into the node's fault folder. The simulated NIC driver, a test stand-in, brings nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dra_node_agent.discovery_config import DiscoveryConfig
from dra_node_agent.health.probe import HealthProbe
from dra_node_agent.simulated.cd_backend import SimulatedComputeDomainBackend
from dra_node_agent.simulated.discovery import Profile, SimulatedBackend, load_profile
from dra_node_agent.simulated.health_probe import (
    FAULTS_FOLDER,
    FakeNvmlHealth,
    FaultDirectory,
    SimulatedNvmlProbe,
)
from dra_node_agent.vendor_record import ProbeOptions, VendorRecord

T = TypeVar("T")


def simulated_profiles(config: DiscoveryConfig) -> list[tuple[Profile, str]]:
    """Each simulated profile with the driver it publishes for (blocking: reads the files).
    ``ValueError`` (a ``ProfileError`` for one profile) when one cannot be loaded or two publish
    for one driver; the command line calls it to refuse such settings before it starts anything."""
    chosen: list[tuple[Profile, str]] = []
    for ref in config.simulated_profiles:
        profile = load_profile(ref)
        if profile.nvidia is not None:
            driver = config.gpu_driver
        elif profile.tpu is not None:
            driver = config.tpu_driver
        else:
            driver = profile.driver  # the simulated NIC driver's name is the profile's
        if any(driver == taken for _, taken in chosen):
            raise ValueError(f"simulated profiles: two profiles publish for driver {driver!r}; use one")
        chosen.append((profile, driver))
    return chosen


def backends(config: DiscoveryConfig) -> list[SimulatedBackend | SimulatedComputeDomainBackend]:
    """One backend per simulated profile (none without profiles), and with ComputeDomains on, the
    compute-domain driver over a GPU profile's fake NVML."""
    found: list[SimulatedBackend | SimulatedComputeDomainBackend] = []
    for index, (profile, driver) in enumerate(simulated_profiles(config)):
        state_dir = Path(config.simulation_dir) / f"{index}-{profile.name}" if config.simulation_dir else None
        found.append(
            SimulatedBackend(
                profile=profile,
                node_name=config.node_name,
                state_dir=state_dir,
                driver=driver,
                tpu_env_path=config.tpu_env_path if profile.tpu is not None else None,
                dynamic_mig=config.dynamic_mig,
                passthrough=config.passthrough,
                consumable_shares=config.consumable_shares,
                cdi_hook_path=config.cdi_hook_path,
            )
        )
    gpus = next(
        (b for b in found if isinstance(b, SimulatedBackend) and b.profile().nvidia is not None), None
    )
    if config.compute_domains and gpus is not None:
        found.append(
            SimulatedComputeDomainBackend(
                gpus, host_managed=config.imex_host_managed, strict_fabric=config.strict_fabric
            )
        )
    return found


Simulated = SimulatedBackend | SimulatedComputeDomainBackend


def _vendors(backend: Simulated, part: Callable[[VendorRecord[Any], Any], T | None]) -> T | None:
    """``part`` of the record of the vendor whose code runs over the fake hardware, applied to that
    code's backend; None for the simulated NIC driver."""
    hardware = backend.hardware()
    if hardware.vendor is None:
        return None
    return part(hardware.vendor, hardware.backend)


def health_probe(backend: Simulated, options: ProbeOptions) -> HealthProbe | None:
    """Simulated GPUs: NVML's probe over the fake NVML, which also reads the fault folder. Other
    profiles: their vendor's probe over the fake trees (none for the NIC driver)."""
    hardware = backend.hardware()
    if hardware.nvml is None:
        return _vendors(backend, lambda vendor, inner: vendor.health_probe(inner, options))
    nvml = FakeNvmlHealth.wrapping(hardware.nvml)
    return SimulatedNvmlProbe(
        faults=FaultDirectory(path=hardware.root / FAULTS_FOLDER, nvml=nvml),
        nvml=nvml,
        ignored_xids=options.ignored_xids,
        temperature_limit=options.temperature_limit,
    )


RECORD: VendorRecord[Simulated] = VendorRecord(
    name=SimulatedBackend.vendor,
    backends=backends,
    health_probe=health_probe,
    time_slicing=lambda backend: _vendors(backend, lambda vendor, inner: vendor.time_slicing(inner)),
    mps_daemons=lambda backend, root, options: _vendors(
        backend, lambda vendor, inner: vendor.mps_daemons(inner, root, options)
    ),
    mig_instances=lambda backend: _vendors(backend, lambda vendor, inner: vendor.mig_instances(inner)),
    passthrough=lambda backend: _vendors(backend, lambda vendor, inner: vendor.passthrough(inner)),
    container_env=lambda backend: _vendors(backend, lambda vendor, inner: vendor.container_env(inner)),
    status_data=lambda backend: _vendors(backend, lambda vendor, inner: vendor.status_data(inner)),
    claim_context=lambda backend, access: _vendors(
        backend, lambda vendor, inner: vendor.claim_context(inner, access)
    ),
    domains=lambda backend, access, options: _vendors(
        backend, lambda vendor, inner: vendor.domains(inner, access, options)
    ),
    device_status=lambda backend: (
        _vendors(backend, lambda vendor, inner: vendor.device_status(inner)) is not False
    ),
)
