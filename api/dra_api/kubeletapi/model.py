"""Plain dataclasses for the kubelet plugin protocols, shared by the plugin servers and the test kubelet.

They carry the same data as the protobuf messages of DRA v1/v1beta1, plugin registration v1 and
health v1 and v1alpha1, so that code on either side never handles protobuf objects directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

# PluginInfo.type for DRA drivers (pluginregistration constants).
DRA_PLUGIN_TYPE: Final = "DRAPlugin"

# Service names as advertised in PluginInfo.supported_versions: "<proto package last segment>.<Service>".
DRA_V1_SERVICE: Final = "v1.DRAPlugin"
DRA_V1BETA1_SERVICE: Final = "v1beta1.DRAPlugin"
HEALTH_V1ALPHA1_SERVICE: Final = "v1alpha1.DRAResourceHealth"
HEALTH_V1_SERVICE: Final = "v1.DRAResourceHealth"

DRAVersion = Literal["v1", "v1beta1"]
# Which advertised service stands for which DRA version.
DRA_SERVICE_VERSIONS: Final[dict[str, DRAVersion]] = {DRA_V1_SERVICE: "v1", DRA_V1BETA1_SERVICE: "v1beta1"}

HealthVersion = Literal["v1", "v1alpha1"]
# The health services, newest first: the order a 1.37 kubelet prefers them in, whatever the order
# of the plugin's list (1.34 to 1.36 know only v1alpha1).
HEALTH_SERVICE_VERSIONS: Final[dict[str, HealthVersion]] = {
    HEALTH_V1_SERVICE: "v1",
    HEALTH_V1ALPHA1_SERVICE: "v1alpha1",
}


@dataclass(frozen=True)
class ClaimRef:
    """Identity of a ResourceClaim as kubelet sends it: nothing about its allocation."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    """One device prepared for a claim.

    ``requests`` empty means the device serves every request of the claim; ``share_id`` only travels
    over DRA v1 (v1beta1 has no such field).
    """

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass(frozen=True)
class PrepareResult:
    """Outcome of preparing one claim: its devices, or a non-empty ``error``."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class HealthStatus(StrEnum):
    """Device health, spelled as kubelet writes it into pod status."""

    UNKNOWN = "Unknown"
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class DeviceHealth:
    """Health of one device in one report of the health stream.

    ``last_updated`` is in Unix seconds; ``health_check_timeout`` (seconds) overrides kubelet's
    30 s staleness timeout for this device when set.
    """

    pool: str
    device: str
    health: HealthStatus
    last_updated: int
    health_check_timeout: int | None = None
    message: str = ""


@dataclass(frozen=True)
class PluginInfo:
    """What a plugin's registration socket answers to GetInfo."""

    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...]
