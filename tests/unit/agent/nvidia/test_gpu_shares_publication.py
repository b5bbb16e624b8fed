"""--consumable-shares: whole GPUs published with allowMultipleAllocations and the request policy of
NVIDIA's driver for each mode; MIG devices and the setting off leave the publication as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_node_agent.devices import CapacityPolicy, DiscoveredDevice, DiscoveredInventory, check_inventory
from dra_node_agent.discovery_config import DiscoveryConfig
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.nvidia.shares import shared
from dra_node_agent.publisher import shares_dropped
from dra_node_agent.simulated.fakehw import FakeNvml, write_nvidia_nodes
from tests.unit.agent.nvidia.test_discovery_nvml import H100_MEMORY, Installer, a100_mig, h100, install

__all__ = ["install"]  # the fixture, shared with the discovery tests

# An H100's 81559 MiB plus a few bytes: NVIDIA rounds the memory down to whole MiB for the policy.
ODD_MEMORY = H100_MEMORY + 123


def gpu(minor: int = 0) -> Any:
    fake = h100(minor, f"0000:1{minor}:00.0")
    fake.memory_total = ODD_MEMORY
    return fake


@pytest.mark.parametrize(
    ("mode", "memory_policy", "shares"),
    [
        (
            "memory",
            {"default": "81559Mi", "validRange": {"min": "1Mi", "max": "81559Mi", "step": "1Mi"}},
            None,
        ),
        ("unlimited", {"default": "0", "validRange": {"min": "0", "max": "81559Mi", "step": "1Mi"}}, None),
        (
            "4",
            {"default": "0", "validRange": {"min": "0", "max": "81559Mi", "step": "1Mi"}},
            {
                "value": "4",
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
            },
        ),
    ],
)
async def test_each_mode_publishes_nvidias_request_policy(
    install: Installer, mode: str, memory_policy: dict[str, Any], shares: dict[str, Any] | None
) -> None:
    install(FakeNvml(gpus=[gpu()]))
    inventory = await NvmlBackend(consumable_shares=mode).discover()
    (device,) = inventory.slice_devices()
    assert device["allowMultipleAllocations"] is True
    expected: dict[str, Any] = {"memory": {"value": "81559Mi", "requestPolicy": memory_policy}}
    if shares is not None:
        expected["shares"] = shares
    assert device["capacity"] == expected
    assert check_inventory(inventory) == []


async def test_off_by_default_and_when_disabled_a_gpu_is_published_as_before(install: Installer) -> None:
    install(FakeNvml(gpus=[gpu()]))
    for backend in (NvmlBackend(), NvmlBackend(consumable_shares="disabled")):
        (device,) = (await backend.discover()).slice_devices()
        assert "allowMultipleAllocations" not in device
        assert device["capacity"] == {"memory": {"value": str(ODD_MEMORY)}}


async def test_mig_devices_stay_one_claim_each(install: Installer, tmp_path: Path) -> None:
    gpus = [a100_mig(0, "0000:10:1c.0"), h100(1, "0000:20:1c.0", mig_mode=0)]
    install(FakeNvml(gpus=gpus))
    write_nvidia_nodes(tmp_path, gpus)
    backend = NvmlBackend(
        proc_root=tmp_path / "proc", sysfs_root=tmp_path / "sys", consumable_shares="memory"
    )
    inventory = await backend.discover()
    sharing = {d.name: d.allow_multiple_allocations for d in inventory.devices}
    assert sharing.pop("gpu-1") is True
    assert sharing, "no MIG device published"
    assert not any(sharing.values()), sharing
    assert check_inventory(inventory) == []


def test_the_setting_travels_from_the_discovery_config_and_a_bad_one_is_refused() -> None:
    assert DiscoveryConfig(node_name="n", consumable_shares="8").consumable_shares == "8"
    with pytest.raises(ValueError, match="'lots' is not 'disabled', 'memory', 'unlimited'"):
        DiscoveryConfig(node_name="n", consumable_shares="lots")


def test_a_policy_the_api_would_refuse_is_reported() -> None:
    device = shared(
        DiscoveredDevice(name="gpu-0", kind="gpu", uuid="GPU-0", attributes={}, capacity={"memory": 4 << 20}),
        "memory",
    )

    assert check_inventory(DiscoveredInventory(driver="gpu.nvidia.com", devices=(device,))) == []
    broken = DiscoveredDevice(
        name="gpu-1",
        kind="gpu",
        uuid="GPU-1",
        attributes={},
        capacity={"memory": 4 << 20},
        capacity_policies={"memory": CapacityPolicy(default=3, minimum=0, maximum=4 << 20, step=2)},
    )
    problems = check_inventory(DiscoveredInventory(driver="gpu.nvidia.com", devices=(broken,)))
    assert problems == [
        "device 'gpu-1': capacity 'memory' requestPolicy: only a device with allowMultipleAllocations may "
        "have one",
        "device 'gpu-1': capacity 'memory' requestPolicy: default and max must be min plus whole steps",
    ]


def test_an_api_server_without_consumable_capacity_dropping_the_field_is_noticed() -> None:
    device = shared(
        DiscoveredDevice(name="gpu-0", kind="gpu", uuid="GPU-0", attributes={}, capacity={"memory": 4 << 20}),
        "memory",
    ).to_slice_device()
    sent = {"spec": {"devices": [device]}}
    dropped = {"spec": {"devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "4Mi"}}}]}}
    assert not shares_dropped(sent=sent, written=sent)
    assert not shares_dropped(sent=sent, written={"spec": {"devices": [device]}})
    assert shares_dropped(sent=sent, written=dropped)
