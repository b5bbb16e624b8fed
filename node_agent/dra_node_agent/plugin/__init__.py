"""The node agent's kubelet plugin: registration, DRA v1/v1beta1 and health v1/v1alpha1 over unix sockets.

``serve_plugin(driver=..., handler=..., health=...)`` starts one driver's servers and returns a
``RunningPlugin``; the driver logic plugs in through the ``DRAHandler`` and ``HealthSource`` protocols,
which work on the plain dataclasses re-exported here.
"""

from dra_api.kubeletapi.model import ClaimRef, DeviceHealth, HealthStatus, PreparedDevice, PrepareResult
from dra_api.kubeletapi.socketpaths import PluginPaths, plugin_paths
from dra_node_agent.plugin.handler import DRAHandler, HealthSource
from dra_node_agent.plugin.server import DEFAULT_GRACE_PERIOD, RunningPlugin, serve_plugin, supported_versions
from dra_node_agent.plugin.sockets import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "DEFAULT_PLUGINS_DIR",
    "DEFAULT_REGISTRY_DIR",
    "ClaimRef",
    "DRAHandler",
    "DeviceHealth",
    "HealthSource",
    "HealthStatus",
    "PluginPaths",
    "PrepareResult",
    "PreparedDevice",
    "RunningPlugin",
    "plugin_paths",
    "serve_plugin",
    "supported_versions",
]
