"""The vendors this agent knows: the one list a new vendor's record (``vendor_record``) joins.

``HARDWARE`` holds the records whose backends discovery looks for on a node, in the order the
drivers start; ``SIMULATED`` runs instead of them when simulated profiles are set. ``record_for``
gives the record a backend names (``DiscoveryBackend.vendor``): the wiring (``discovery.detect``,
``driver_health``, ``prepare_tools``) reads it rather than asking what type a backend is.
"""

from __future__ import annotations

from typing import Any, Final

from dra_node_agent.devices import DiscoveryBackend
from dra_node_agent.nvidia import cd_record as compute_domains
from dra_node_agent.nvidia import record as nvidia
from dra_node_agent.simulated import record as simulated
from dra_node_agent.tpu import record as tpu
from dra_node_agent.vendor_record import VendorRecord

HARDWARE: Final[tuple[VendorRecord[Any], ...]] = (nvidia.RECORD, compute_domains.RECORD, tpu.RECORD)
SIMULATED: Final[VendorRecord[Any]] = simulated.RECORD

# A backend of no known vendor (the simulated NIC driver's own, run inside a simulated backend)
# brings nothing: no health probe, no tools, no environment.
NOTHING: Final[VendorRecord[Any]] = VendorRecord(name="", backends=lambda config: [])

_BY_NAME: Final = {record.name: record for record in (*HARDWARE, SIMULATED)}
# The simulated record hands its parts to these by the fake hardware's own vendor, so every record
# is reachable by name.


def record_for(backend: DiscoveryBackend) -> VendorRecord[Any]:
    """The record of the vendor whose backend ``backend`` is."""
    return _BY_NAME.get(backend.vendor, NOTHING)
