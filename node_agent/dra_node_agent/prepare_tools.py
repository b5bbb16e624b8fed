"""The prepare-time tools of a driver's devices, read from the record of the vendor that found them.

Discovery only discovers; what changes a device's state at prepare (a GPU's time slice, a claim's
MPS daemon, a dynamic MIG instance, a GPU's binding for passthrough), the environment the
devices' vendor adds to a claim's CDI spec, the data it adds to a claim's device status and its
context of a claim are built by the vendor's record (``vendor_record``; ``vendors.record_for``
finds it). Each gives None where the devices have no such part (TPUs have no set-up tools, the
simulated NIC driver has none at all). All blocking: callers use a thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_node_agent import vendors
from dra_node_agent.cdi import VendorEnv
from dra_node_agent.claim_context import ClaimContextSource
from dra_node_agent.device_setup import (
    DomainMembership,
    MigInstances,
    MpsControl,
    MpsOptions,
    Passthrough,
    TimeSlicing,
)
from dra_node_agent.device_status import VendorStatusData
from dra_node_agent.devices import DiscoveryBackend
from dra_node_agent.settings import MPS_DAEMON_MEMORY_MIN, MPS_SHM_SIZE_MIN, Settings, quantity_bytes
from dra_node_agent.vendor_record import ApiAccess, DomainOptions


def vendor_env(backend: DiscoveryBackend) -> VendorEnv[Any] | None:
    """The environment these devices' vendor adds to a claim's CDI spec (None: the simulated NIC
    driver, whose devices carry all they need in their own edits)."""
    return vendors.record_for(backend).container_env(backend)


def status_data(backend: DiscoveryBackend) -> VendorStatusData[Any] | None:
    """What these devices' vendor adds to the data of a claim's device status (None: the UUID and
    PCI bus ID every device gets are all there is, as for GPUs)."""
    return vendors.record_for(backend).status_data(backend)


def writes_device_status(backend: DiscoveryBackend) -> bool:
    """Whether this driver's claims get ``status.devices`` entries (not a compute-domain driver's)."""
    return vendors.record_for(backend).device_status(backend)


def gpu_sharing(backend: DiscoveryBackend) -> TimeSlicing | None:
    """Time-slicing on these GPUs (looks for nvidia-smi under the driver root)."""
    return vendors.record_for(backend).time_slicing(backend)


def mps_daemons(
    backend: DiscoveryBackend, root: Path, options: MpsOptions | None = None
) -> MpsControl[Any] | None:
    """Per-claim MPS daemons from the driver root's tools, kept under ``root``, run as ``options``
    say (their shm size and cgroup; the defaults without)."""
    return vendors.record_for(backend).mps_daemons(backend, root, options)


def mps_options(settings: Settings) -> MpsOptions:
    """The MPS daemons' shm size, memory limit and cgroup from the agent's settings."""
    return MpsOptions(
        shm_size=quantity_bytes("mps_shm_size", settings.mps_shm_size, least=MPS_SHM_SIZE_MIN),
        memory_limit=quantity_bytes(
            "mps_daemon_memory_limit", settings.mps_daemon_memory_limit, least=MPS_DAEMON_MEMORY_MIN
        ),
        cgroup_parent=settings.mps_cgroup_parent,
        cgroup_root=settings.cgroup_root,
    )


def mig_instances(backend: DiscoveryBackend) -> MigInstances | None:
    """Creates and destroys dynamic MIG instances on these GPUs (None: dynamic MIG is off)."""
    return vendors.record_for(backend).mig_instances(backend)


def passthrough(backend: DiscoveryBackend) -> Passthrough | None:
    """Binds these GPUs to vfio-pci for passthrough and back (None: not a GPU driver)."""
    return vendors.record_for(backend).passthrough(backend)


def claim_context(backend: DiscoveryBackend, access: ApiAccess) -> ClaimContextSource[Any] | None:
    """What the vendor works out about a claim at prepare (TPUs: a multi-host pod's worker identity)."""
    return vendors.record_for(backend).claim_context(backend, access)


def domains(backend: DiscoveryBackend, access: ApiAccess, options: DomainOptions) -> DomainMembership | None:
    """What joins the node to the domains its claims name (NVIDIA's compute-domain driver)."""
    return vendors.record_for(backend).domains(backend, access, options)


def domain_options(settings: Settings) -> DomainOptions:
    return DomainOptions(
        namespace=settings.compute_domain_namespace_name(),
        plugins_dir=settings.kubelet_plugins_dir,
        host_imex_socket=settings.imex_host_socket
        if settings.compute_domain_imex_mode == "hostManaged"
        else None,
        clique_label=settings.gpu_clique_label,
    )


@dataclass(frozen=True)
class PrepareTools:
    """Everything a driver's ``PrepareHandler`` gets from its vendor, built together."""

    gpu_sharing: TimeSlicing | None
    mps: MpsControl[Any] | None
    dynamic_mig: MigInstances | None
    passthrough: Passthrough | None
    vendor_env: VendorEnv[Any] | None
    claim_context: ClaimContextSource[Any] | None
    domains: DomainMembership | None = None


def tools_for(
    backend: DiscoveryBackend, *, settings: Settings, access: ApiAccess, mps_root: Path
) -> PrepareTools:
    """The driver's tools as the agent's settings ask for them (MPS only with ``mps_support``)."""
    return PrepareTools(
        gpu_sharing=gpu_sharing(backend),
        mps=mps_daemons(backend, mps_root, mps_options(settings)) if settings.mps_support else None,
        dynamic_mig=mig_instances(backend),
        passthrough=passthrough(backend),
        vendor_env=vendor_env(backend),
        claim_context=claim_context(backend, access),
        domains=domains(backend, access, domain_options(settings)),
    )
