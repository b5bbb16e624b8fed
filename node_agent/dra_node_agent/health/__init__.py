"""Device health: NVML events and polls, TPU presence; taints, kubelet health reports, metrics, Events.

Entry point: ``HealthMonitor`` (one per driver) with a probe from ``probe_for(backend)``.
"""

from dra_node_agent.health.factory import probe_for
from dra_node_agent.health.monitor import (
    HealthMonitor,
    HealthSettings,
    MonitorHealthSource,
    republish_on_change,
)
from dra_node_agent.health.nvml_probe import DEFAULT_IGNORED_XIDS, NvmlHealthProbe
from dra_node_agent.health.state import State, parse_xid_list
from dra_node_agent.health.taint_support import server_keeps_device_taints
from dra_node_agent.health.taints import TaintEffect
from dra_node_agent.health.tpu_probe import TpuHealthProbe

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "HealthMonitor",
    "HealthSettings",
    "MonitorHealthSource",
    "NvmlHealthProbe",
    "State",
    "TaintEffect",
    "TpuHealthProbe",
    "parse_xid_list",
    "probe_for",
    "republish_on_change",
    "server_keeps_device_taints",
]
