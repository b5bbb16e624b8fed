"""Fake GPUs behind ``FakeNvmlHealth``, the devices NVML discovery makes of them, and a settable clock."""

from __future__ import annotations

from pathlib import Path

import pynvml

from dra_node_agent.devices import DiscoveredDevice
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.simulated.fakehw import FakeGpu, FakeMig, FakeMigProfile
from dra_node_agent.simulated.health_probe import FakeNvmlHealth

H100_MEMORY = 81559 << 20
P_3G20 = FakeMigProfile(index=2, id=9, slices=3, memory_mib=19968, multiprocessors=42, copy_engines=3)
P_1G5 = FakeMigProfile(index=0, id=19, slices=1, memory_mib=4864, multiprocessors=14, copy_engines=1)


class Clock:
    """Unix time that moves only when told to."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def h100(minor: int) -> FakeGpu:
    return FakeGpu(
        uuid=f"GPU-00000000-0000-0000-0000-00000000000{minor}",
        name="NVIDIA H100 80GB HBM3",
        minor=minor,
        pci_bus_id=f"0000:{0x10 + minor:02x}:00.0",
        memory_total=H100_MEMORY,
    )


def a100_mig(minor: int) -> FakeGpu:
    return FakeGpu(
        uuid=f"GPU-a100-{minor}",
        name="NVIDIA A100-SXM4-40GB",
        minor=minor,
        pci_bus_id=f"0000:{0x20 + minor:02x}:00.0",
        memory_total=40960 << 20,
        architecture=pynvml.NVML_DEVICE_ARCH_AMPERE,
        compute_capability=(8, 0),
        mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
        mig_profiles=(P_1G5, P_3G20),
        migs=(
            FakeMig(profile=P_3G20, start=4, gi_id=2, ci_id=0, uuid="MIG-aaaa"),
            FakeMig(profile=P_1G5, start=0, gi_id=7, ci_id=0, uuid="MIG-bbbb"),
        ),
    )


def fake_nvml(*gpus: FakeGpu) -> FakeNvmlHealth:
    return FakeNvmlHealth(gpus=list(gpus) or [h100(0), h100(1)])


def discover(fake: FakeNvmlHealth, tmp: Path) -> tuple[DiscoveredDevice, ...]:
    """The devices the real NVML discovery finds on ``fake``."""
    inventory = NvmlBackend(nvml=fake, sysfs_root=tmp / "sys", proc_root=tmp / "proc").discover_sync()
    assert inventory.available, inventory.errors
    return inventory.devices
