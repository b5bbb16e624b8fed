"""KEP-4817 device status: the ``status.devices`` entries of the claims this agent prepared.

- ``writer``: ``DeviceStatusWriter``, one per driver: told of prepare, unprepare and health changes,
  it writes in the background, retried, and drained at stop;
- ``entries``: the entry key, and this driver's entries set or removed among everyone else's;
- ``conditions``: the ``Ready`` condition from the health monitor's view of a device;
- ``data``: the entry's data, and ``VendorStatusData``, what a vendor adds to it;
- ``claim_api``: GET the claim, PUT its ``/status``;
- ``support``: where the server drops the field or RBAC refuses it, stop with one log line.
"""

from dra_node_agent.device_status.claim_api import ClaimStatusApi, KubeClaimStatusApi
from dra_node_agent.device_status.data import VendorStatusData
from dra_node_agent.device_status.support import StatusSupport
from dra_node_agent.device_status.writer import DeviceStatusWriter, HealthView

__all__ = [
    "ClaimStatusApi",
    "DeviceStatusWriter",
    "HealthView",
    "KubeClaimStatusApi",
    "StatusSupport",
    "VendorStatusData",
]
