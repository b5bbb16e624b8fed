"""What NVIDIA's compute-domain driver brings to this node: its ``vendor_record.VendorRecord``.

The driver ``compute-domain.nvidia.com`` runs beside the GPU driver when the agent serves
ComputeDomains (``--compute-domains``) and NVML works here (or NVIDIA is forced on): its discovery
(``cd_discovery``), and its set-up of channel and daemon claims (``cd_membership``). It has no
health probe, no sharing tools and no environment of its own; the simulated record runs the same
parts over the fake NVML's fabric.
"""

from __future__ import annotations

from dra_node_agent.discovery_config import DiscoveryConfig
from dra_node_agent.nvidia import record as gpu_record
from dra_node_agent.nvidia.cd_api import DomainApi
from dra_node_agent.nvidia.cd_discovery import ComputeDomainBackend
from dra_node_agent.nvidia.cd_membership import ComputeDomainMembership, HostImex
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.vendor_record import ApiAccess, DomainOptions, VendorRecord


def backend_for(config: DiscoveryConfig) -> ComputeDomainBackend:
    return ComputeDomainBackend(
        driver_root=config.driver_root,
        host_driver_root=config.host_driver_root,
        cdi_hook_path=config.cdi_hook_path,
        proc_root=config.proc_root,
        host_managed=config.imex_host_managed,
        strict_fabric=config.strict_fabric,
    )


def backends(config: DiscoveryConfig) -> list[ComputeDomainBackend]:
    """The compute-domain driver, with ComputeDomains on, where the GPU driver runs."""
    if not config.compute_domains:
        return []
    probe = NvmlBackend(driver=config.gpu_driver, driver_root=config.driver_root)
    if not config.selects("nvidia", detected=lambda: gpu_record.nvml_usable(probe)):
        return []
    return [backend_for(config)]


def domains(
    backend: ComputeDomainBackend, access: ApiAccess, options: DomainOptions
) -> ComputeDomainMembership:
    return ComputeDomainMembership(
        backend=backend,
        api=DomainApi(
            api=access.api,
            node_name=access.node_name,
            namespace=options.namespace,
            request_timeout=access.request_timeout,
        ),
        plugins_dir=options.plugins_dir,
        host_imex=HostImex(socket=options.host_imex_socket) if options.host_imex_socket else None,
        clique_label=options.clique_label,
    )


RECORD: VendorRecord[ComputeDomainBackend] = VendorRecord(
    name=ComputeDomainBackend.vendor,
    backends=backends,
    domains=domains,
    device_status=lambda backend: False,
)
