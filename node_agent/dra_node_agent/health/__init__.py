"""Device health, vendor-neutral: the monitor, health state and taints, kubelet health reports,
metrics and Events. The probes that read the devices live with their vendor (``nvidia.health_probe``,
``tpu.health_probe``, ``simulated.health_probe``); ``driver_health`` picks one per driver.
"""

from dra_node_agent.health.monitor import (
    HealthMonitor,
    HealthSettings,
    MonitorHealthSource,
    republish_on_change,
)
from dra_node_agent.health.state import State
from dra_node_agent.health.taint_support import server_keeps_device_taints
from dra_node_agent.health.taints import TaintEffect

__all__ = [
    "HealthMonitor",
    "HealthSettings",
    "MonitorHealthSource",
    "State",
    "TaintEffect",
    "republish_on_change",
    "server_keeps_device_taints",
]
