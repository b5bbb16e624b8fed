"""Whether the agent writes ``status.devices`` at all: it stops, with one log line, where it cannot.

Two reasons, each logged once:

- the API server drops the field (DRAResourceClaimDeviceStatus off, possible up to 1.36): a write
  succeeds but comes back without the entries. This holds for the whole server, so for every driver
  of the agent;
- the API server refuses the write (403): RBAC lacks ``resourceclaims/status`` ``update``, or, with
  DRAResourceClaimGranularStatusAuthorization (1.36+), ``resourceclaims/driver``
  ``associated-node:update`` for the driver's name. Permissions are per driver name, so this stops
  that driver only.

Neither is retried: a changed RBAC or feature gate takes an agent restart.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class StatusSupport:
    """Shared by the agent's drivers; everything runs on the event loop."""

    def __init__(self) -> None:
        self.field_dropped = False
        self.forbidden: dict[str, str] = {}

    def enabled(self, driver: str) -> bool:
        return not self.field_dropped and driver not in self.forbidden

    def dropped(self) -> None:
        if self.field_dropped:
            return
        self.field_dropped = True
        logger.warning(
            "the API server drops ResourceClaim status.devices (feature gate DRAResourceClaimDeviceStatus "
            "is off): the agent no longer writes device status; prepared devices work as before"
        )

    def refused(self, driver: str, why: str) -> None:
        if driver in self.forbidden:
            return
        self.forbidden[driver] = why
        logger.warning(
            "the API server refuses status.devices of driver %s (%s): it needs update on "
            "resourceclaims/status and associated-node:update on resourceclaims/driver for resourceNames "
            "[%s]; the agent no longer writes device status for this driver",
            driver,
            why,
            driver,
        )
