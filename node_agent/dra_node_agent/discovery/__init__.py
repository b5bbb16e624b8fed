"""Device discovery: NVML (NVIDIA), PCI sysfs (Google TPU) and simulated profiles, behind one interface."""

from .base import (
    Attribute,
    ContainerEdits,
    DeviceNode,
    DiscoveredDevice,
    DiscoveredInventory,
    DiscoveryBackend,
    TpuHostInfo,
    check_inventory,
    validate_slice_device,
)
from .nvml import NvmlBackend
from .simulated import SimulatedBackend, available_profiles, load_profile
from .tpu import TpuBackend, google_tpu_present

__all__ = [
    "Attribute",
    "ContainerEdits",
    "DeviceNode",
    "DiscoveredDevice",
    "DiscoveredInventory",
    "DiscoveryBackend",
    "NvmlBackend",
    "SimulatedBackend",
    "TpuBackend",
    "TpuHostInfo",
    "available_profiles",
    "check_inventory",
    "google_tpu_present",
    "load_profile",
    "validate_slice_device",
]
