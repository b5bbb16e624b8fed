"""What a vendor learns about one claim at prepare beyond its devices and configs.

Some vendors need more than that to give a claim's containers the right environment: a host of a
multi-host TPU slice needs the pod's worker identity, which only the pod's Job tells
(``tpu.multihost``). A ``ClaimContextSource`` works it out at prepare, after planning and before
any device is touched; prepare hands the result, as it is, to the same vendor's container
environment (``cdi.VendorEnv``) and device status data (``device_status.VendorStatusData``). The
core never looks inside it, so it names no vendor's data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from dra_node_agent.claim_reader import ClaimAllocation
from dra_node_agent.devices import DiscoveredDevice, DiscoveredInventory
from dra_node_agent.opaqueconfig import DriverConfig

# A vendor's context of one claim; prepare only passes it along.
Context = TypeVar("Context", covariant=True)


class ClaimContextSource(Protocol[Context]):
    """Works out a vendor's context of the claims it prepares, and stops its background work."""

    async def resolve(
        self,
        *,
        allocation: ClaimAllocation,
        inventory: DiscoveredInventory,
        devices: Sequence[DiscoveredDevice],
        config: DriverConfig | None,
    ) -> Context | None:
        """The context of a claim with ``devices`` of ``inventory`` (its claim-wide ``config``, if
        any); None where the vendor needs none. Raises ``ClaimError`` when it cannot be told right:
        the prepare fails and the kubelet retries."""
        ...

    async def aclose(self) -> None:
        """Stop what it started in the background (the agent is stopping)."""
        ...
