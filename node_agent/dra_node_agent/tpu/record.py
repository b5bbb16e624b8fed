"""What Google's TPUs bring to a TPU driver of this node: their ``vendor_record.VendorRecord``.

PCI/sysfs discovery (enabled when a Google TPU is on the PCI bus, or forced on), the presence
health probe, the ``TPU_*`` environment of a claim's containers, the chip index and worker identity
in its device status, and, as its context of a claim, a multi-host pod's worker identity from its
Job (``multihost.TpuWorkerResolver``). TPUs have no prepare-time device set-up. The simulated record
runs these same parts over its fake sysfs.
"""

from __future__ import annotations

from dra_node_agent.discovery_config import DiscoveryConfig
from dra_node_agent.tpu.container_env import TpuEnv
from dra_node_agent.tpu.discovery import TpuBackend, google_tpu_present
from dra_node_agent.tpu.health_probe import TpuHealthProbe
from dra_node_agent.tpu.multihost import TpuWorkerResolver
from dra_node_agent.tpu.status_data import TpuStatusData
from dra_node_agent.tpu.workload_api import KubeWorkloads, PodEvents
from dra_node_agent.vendor_record import ApiAccess, ProbeOptions, VendorRecord


def backends(config: DiscoveryConfig) -> list[TpuBackend]:
    """The TPU backend, when it is forced on or a Google TPU is on this host's PCI bus."""
    if not config.selects("tpu", detected=lambda: google_tpu_present(config.sysfs_root)):
        return []
    return [
        TpuBackend(
            node_name=config.node_name,
            driver=config.tpu_driver,
            sysfs_root=config.sysfs_root,
            dev_root=config.dev_root,
            topology=config.tpu_topology,
            tpu_env_path=config.tpu_env_path,
            host_dev_dir=config.host_dev_dir,
        )
    ]


def health_probe(backend: TpuBackend, options: ProbeOptions) -> TpuHealthProbe:
    """Chip presence in sysfs and /dev (no XIDs nor temperatures on TPUs)."""
    return TpuHealthProbe(sysfs_root=backend.sysfs_root, dev_root=backend.dev_root)


def claim_context(backend: TpuBackend, access: ApiAccess) -> TpuWorkerResolver:
    """The worker identity of a pod on a multi-host slice, read from its Job at prepare."""
    return TpuWorkerResolver(
        source=KubeWorkloads(api=access.api, api_version=access.api_version),
        events=PodEvents(api=access.api, node_name=access.node_name, component=access.driver),
        driver=access.driver,
        node_name=access.node_name,
    )


RECORD: VendorRecord[TpuBackend] = VendorRecord(
    name=TpuBackend.vendor,
    backends=backends,
    health_probe=health_probe,
    container_env=lambda backend: TpuEnv(),
    status_data=lambda backend: TpuStatusData(),
    claim_context=claim_context,
)
