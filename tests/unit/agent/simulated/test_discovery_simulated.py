"""Simulated profiles: valid slice devices, the real backends' output, and backend selection."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pynvml
import pytest
import yaml

from dra_node_agent.devices import MAX_ATTRIBUTES_AND_CAPACITIES, check_inventory
from dra_node_agent.discovery.detect import select_backends
from dra_node_agent.discovery_config import DiscoveryConfig
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.simulated.discovery import (
    ProfileError,
    SimulatedBackend,
    available_profiles,
    load_profile,
    parse_profile,
)
from dra_node_agent.tpu.discovery import TpuBackend

FIXTURES = Path(__file__).parents[3] / "fixtures"
GOLDEN = FIXTURES / "golden"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
SHIPPED = [
    "a100-40gb-mig",
    "gb200-nvl-x4",
    "h100-80gb-x8",
    "mig-dynamic",
    "nic-sim-h100-x4",
    "tpu-v4-2x2x1",
    "tpu-v5e-2x2",
    "tpu-v5p-2x2x4",
    "tpu-v6e-2x4",
    "tpu-v6e-4x4",
]

# Profiles of MIG-enabled GPUs without instances: they publish under --dynamic-mig only.
DYNAMIC_MIG = {"mig-dynamic"}


def simulated(profile: str, tmp_path: Path) -> SimulatedBackend:
    return SimulatedBackend(
        profile=profile, node_name="node-a", state_dir=tmp_path, dynamic_mig=profile in DYNAMIC_MIG
    )


def test_shipped_profiles() -> None:
    assert available_profiles() == SHIPPED


@pytest.mark.parametrize("profile", SHIPPED)
async def test_profiles_render_valid_slice_devices(profile: str, tmp_path: Path) -> None:
    inventory = await simulated(profile, tmp_path).discover()
    assert inventory.devices
    assert inventory.errors == ()
    assert check_inventory(inventory) == []
    for device in inventory.slice_devices():
        assert DNS_LABEL.match(device["name"])
        assert len(device["attributes"]) + len(device.get("capacity", {})) <= MAX_ATTRIBUTES_AND_CAPACITIES
        for value in device["attributes"].values():
            if "string" in value:
                assert len(value["string"]) <= 64
            if "version" in value:
                assert SEMVER.match(value["version"])
    uuids = [d.uuid for d in inventory.devices if d.mig_placement is None]  # placements have none yet
    assert len(set(uuids)) == len(uuids)


@pytest.mark.parametrize("profile", SHIPPED)
async def test_profiles_match_golden_slices(profile: str, tmp_path: Path) -> None:
    """Guards the published attributes against accidental change (regenerate: DRA_UPDATE_GOLDEN=1)."""
    inventory = await simulated(profile, tmp_path).discover()
    golden = GOLDEN / f"{profile}.json"
    published: object = inventory.slice_devices()
    if inventory.counter_sets:
        published = {"sharedCounters": inventory.slice_counter_sets(), "devices": published}
    rendered = json.dumps(published, indent=1, sort_keys=True) + "\n"
    if os.environ.get("DRA_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered)
    assert rendered == golden.read_text()


async def test_without_dynamic_mig_the_mig_enabled_gpus_without_instances_publish_nothing(
    tmp_path: Path,
) -> None:
    inventory = await SimulatedBackend(
        profile="mig-dynamic", node_name="node-a", state_dir=tmp_path
    ).discover()
    assert inventory.devices == ()
    assert inventory.counter_sets == ()
    assert inventory.errors == ()


async def test_dynamic_mig_profile_publishes_each_gpus_placements_and_counter_set(tmp_path: Path) -> None:
    inventory = await simulated("mig-dynamic", tmp_path).discover()
    assert [c.name for c in inventory.counter_sets] == [f"gpu-{i}-counter-set" for i in range(3)]
    assert len(inventory.devices) == 3 * 25
    assert {d.consumes.name for d in inventory.devices if d.consumes} == {
        c.name for c in inventory.counter_sets
    }


async def test_uuids_derive_from_the_node_name(tmp_path: Path) -> None:
    a = await SimulatedBackend(
        profile="h100-80gb-x8", node_name="node-a", state_dir=tmp_path / "a"
    ).discover()
    a_again = await SimulatedBackend(
        profile="h100-80gb-x8", node_name="node-a", state_dir=tmp_path / "c"
    ).discover()
    b = await SimulatedBackend(
        profile="h100-80gb-x8", node_name="node-b", state_dir=tmp_path / "b"
    ).discover()
    assert [d.uuid for d in a.devices] == [d.uuid for d in a_again.devices]
    assert {d.uuid for d in a.devices}.isdisjoint({d.uuid for d in b.devices})
    assert [d.name for d in a.devices] == [d.name for d in b.devices]


async def test_h100_profile_devices(tmp_path: Path) -> None:
    inventory = await SimulatedBackend(
        profile="h100-80gb-x8", node_name="node-a", state_dir=tmp_path
    ).discover()
    assert [d.name for d in inventory.devices] == [f"gpu-{i}" for i in range(8)]
    gpu = inventory.devices[3].to_slice_device()
    assert gpu["capacity"] == {"memory": {"value": "81559Mi"}}
    assert gpu["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert gpu["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:61:00.0"}
    assert "pcieBusID" not in gpu["attributes"]  # removed by NVIDIA's driver, and here
    assert gpu["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:5a"}
    assert gpu["attributes"]["uuid"]["string"].startswith("GPU-")


async def test_a100_mig_profile_devices(tmp_path: Path) -> None:
    inventory = await SimulatedBackend(
        profile="a100-40gb-mig", node_name="node-a", state_dir=tmp_path
    ).discover()
    kinds = [d.kind for d in inventory.devices]
    assert kinds.count("mig") == 13
    assert kinds.count("gpu") == 5
    profiles = sorted(str(d.attributes["profile"].value) for d in inventory.devices if d.kind == "mig")
    assert profiles == ["1g.5gb"] * 9 + ["2g.10gb", "3g.20gb", "3g.20gb", "4g.20gb"]
    assert "gpu-2-mig-4g20gb-5-0" in inventory.by_name()


async def test_simulated_nvidia_is_the_nvml_backend_over_a_fake(tmp_path: Path) -> None:
    simulated = SimulatedBackend(profile="a100-40gb-mig", node_name="node-a", state_dir=tmp_path)
    inventory = await simulated.discover()
    hardware = simulated.hardware()
    assert hardware.nvml is not None
    direct = NvmlBackend(nvml=hardware.nvml, sysfs_root=tmp_path / "sys", proc_root=tmp_path / "proc")
    assert (await direct.discover()).slice_devices() == inventory.slice_devices()


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"nvidia": {}, "tpu": {}}, "exactly one of 'nvidia', 'tpu' and 'nic'"),
        ({"tpu": {"generation": "v6e", "chips": 8, "colour": 1}}, "tpu: unknown field 'colour'"),
        ({"tpu": {"generation": "v9", "chips": 8}}, "tpu.generation: unknown generation 'v9'"),
        ({"tpu": {"generation": "v6e", "chips": "8"}}, "tpu.chips: must be an integer"),
        (
            {"tpu": {"generation": "v6e", "chips": 2, "iommuGroups": [1]}},
            "tpu.iommuGroups: must have 2 entries",
        ),
        (
            {
                "nvidia": {
                    "driverVersion": "1.2.3",
                    "cudaDriverVersion": 1,
                    "gpus": [{"count": 1, "brand": "Acme"}],
                }
            },
            "nvidia.gpus[0].brand: unknown brand 'Acme'",
        ),
    ],
)
def test_bad_profiles_are_rejected_naming_the_field(document: dict[str, object], message: str) -> None:
    with pytest.raises(ProfileError, match=re.escape(message)):
        parse_profile(document, label="test")


def test_unknown_profile_name() -> None:
    with pytest.raises(ProfileError, match="not shipped"):
        load_profile("no-such-profile")


def test_profile_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("tpu: {generation: v5litepod, chips: 1}\n")
    profile = load_profile(path)
    assert profile.name == "mine"
    assert profile.driver == "tpu.google.com"


async def test_auto_detection_enables_tpu_from_sysfs_and_skips_missing_nvml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def not_found(flags: int) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInitWithFlags", not_found)
    root = FIXTURES / "sysfs" / "tpu-v6e-host"
    config = DiscoveryConfig(node_name="n", sysfs_root=str(root / "sys"), dev_root=str(root / "dev"))
    backends = await select_backends(config)
    assert [type(b) for b in backends] == [TpuBackend]
    none = await select_backends(
        DiscoveryConfig(node_name="n", sysfs_root=str(FIXTURES / "sysfs" / "no-tpu-host" / "sys"))
    )
    assert none == []


async def test_explicit_and_simulated_backend_selection(tmp_path: Path) -> None:
    explicit = await select_backends(DiscoveryConfig(node_name="n", backends=("nvidia", "tpu")))
    assert [type(b) for b in explicit] == [NvmlBackend, TpuBackend]
    simulated = await select_backends(
        DiscoveryConfig(
            node_name="n",
            simulated_profiles=("h100-80gb-x8", "tpu-v6e-2x4"),
            simulation_dir=str(tmp_path),
            gpu_driver="gpu.example.com",
        )
    )
    assert [b.driver for b in simulated] == ["gpu.example.com", "tpu.google.com"]
    inventory = await simulated[0].discover()
    assert inventory.driver == "gpu.example.com"
    with pytest.raises(ValueError, match="two profiles publish for driver"):
        await select_backends(
            DiscoveryConfig(node_name="n", simulated_profiles=("h100-80gb-x8", "a100-40gb-mig"))
        )
    with pytest.raises(ValueError, match="unknown backend 'amd'"):
        DiscoveryConfig(node_name="n", backends=("amd",))


def test_command_line_prints_the_slice_devices(capsys: pytest.CaptureFixture[str]) -> None:
    from dra_node_agent.discovery.__main__ import main

    assert main(["--profile", "tpu-v5e-2x2", "--node-name", "n1"]) == 0
    (document,) = list(yaml.safe_load_all(capsys.readouterr().out))
    assert document["driver"] == "tpu.google.com"
    # Named as Google's driver names them: by VFIO group (v5e), else accelN.
    assert [d["name"] for d in document["devices"]] == ["0", "1", "2", "3"]
    assert document["errors"] == []
