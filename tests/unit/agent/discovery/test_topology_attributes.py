"""The standard topology attributes (pcieRoot, numaNode) that a claim matches across drivers, and the
simulated NIC driver that publishes them beside simulated GPUs."""

from __future__ import annotations

import re
from pathlib import Path

import pynvml
import pytest

from dra_node_agent import prepare_tools
from dra_node_agent.cdi import build_claim_spec
from dra_node_agent.devices import check_inventory
from dra_node_agent.discovery.detect import select_backends
from dra_node_agent.discovery_config import DiscoveryConfig
from dra_node_agent.driver_health import probe_for
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.simulated.discovery import ProfileError, SimulatedBackend, load_profile, parse_profile
from dra_node_agent.simulated.fakehw import FakeGpu, FakeNvml
from dra_node_agent.simulated.faketree import FakePciFunction, write_pci_tree
from dra_node_agent.simulated.nic import NIC_DRIVER

ROOT = "resource.kubernetes.io/pcieRoot"
NUMA = "resource.kubernetes.io/numaNode"
CLAIM_UID = "0b1e3f4c-1111-4222-8333-444455556666"


def _values(devices: list[dict[str, object]], name: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for device in devices:
        attributes = device["attributes"]
        assert isinstance(attributes, dict)
        value = attributes.get(name)
        out[str(device["name"])] = None if value is None else next(iter(value.values()))
    return out


async def test_gpus_publish_the_numa_node_sysfs_gives_and_leave_out_an_unknown_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gpus = [
        FakeGpu(uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3", minor=i, pci_bus_id=bus, memory_total=1 << 30)
        for i, bus in enumerate(["0000:1b:00.0", "0000:43:00.0", "0000:9d:00.0"])
    ]
    FakeNvml(gpus=gpus).install(pynvml, monkeypatch.setattr)
    write_pci_tree(
        tmp_path,
        [
            FakePciFunction(address="0000:1b:00.0", vendor=0x10DE, device=0x2330, numa_node=1),
            # -1: the kernel knows no NUMA affinity; NVIDIA's driver publishes nothing then.
            FakePciFunction(address="0000:43:00.0", vendor=0x10DE, device=0x2330, numa_node=-1),
        ],
    )
    inventory = await NvmlBackend(sysfs_root=tmp_path / "sys").discover()
    assert _values(inventory.slice_devices(), NUMA) == {"gpu-0": 1, "gpu-1": None, "gpu-2": None}
    assert check_inventory(inventory) == []


async def test_simulated_h100s_and_tpus_publish_the_standard_numa_node(tmp_path: Path) -> None:
    h100 = await SimulatedBackend(profile="h100-80gb-x8", node_name="n", state_dir=tmp_path / "g").discover()
    assert list(_values(h100.slice_devices(), NUMA).values()) == [0, 0, 0, 0, 1, 1, 1, 1]
    # MIG devices carry their parent's, within the 32 attributes and capacities a device may have.
    a100 = await SimulatedBackend(profile="a100-40gb-mig", node_name="n", state_dir=tmp_path / "a").discover()
    assert all(d.attributes.get(NUMA) is not None for d in a100.devices)
    assert check_inventory(a100) == []
    tpu = await SimulatedBackend(profile="tpu-v6e-2x4", node_name="n", state_dir=tmp_path / "t").discover()
    for device in tpu.slice_devices():
        attributes = device["attributes"]
        # Google's own name stays beside the standard one.
        assert attributes[NUMA] == attributes["numaNode"]
    assert list(_values(tpu.slice_devices(), NUMA).values()) == [0, 0, 0, 0, 1, 1, 1, 1]


async def test_the_nic_profile_puts_nics_under_the_roots_of_every_other_h100(tmp_path: Path) -> None:
    nics = await SimulatedBackend(
        profile="nic-sim-h100-x4", node_name="n", state_dir=tmp_path / "n"
    ).discover()
    gpus = await SimulatedBackend(profile="h100-80gb-x8", node_name="n", state_dir=tmp_path / "g").discover()
    assert nics.driver == NIC_DRIVER
    assert check_inventory(nics) == []
    assert [d.name for d in nics.devices] == ["nic-0", "nic-1", "nic-2", "nic-3"]
    assert all(d.kind == "nic" for d in nics.devices)
    nic_roots = _values(nics.slice_devices(), ROOT)
    gpu_roots = _values(gpus.slice_devices(), ROOT)
    # Read back from the fake sysfs tree, as the GPUs' are: equal strings for GPUs 0, 2, 4 and 6.
    with_nic = sorted(g for g, root in gpu_roots.items() if root in nic_roots.values())
    assert with_nic == ["gpu-0", "gpu-2", "gpu-4", "gpu-6"]
    gpu_numa = _values(gpus.slice_devices(), NUMA)
    nic_numa = _values(nics.slice_devices(), NUMA)
    for nic, root in nic_roots.items():
        (gpu,) = [g for g, r in gpu_roots.items() if r == root]
        assert nic_numa[nic] == gpu_numa[gpu]
    first = nics.slice_devices()[0]["attributes"]
    assert first["ifName"] == {"string": "ens1f0np0"}
    assert first["rdma"] == {"bool": True}
    assert first["resource.kubernetes.io/pciBusID"] == {"string": "0000:1c:00.0"}


async def test_an_agent_runs_the_nic_driver_beside_the_gpus(tmp_path: Path) -> None:
    backends = await select_backends(
        DiscoveryConfig(
            node_name="n",
            simulated_profiles=("h100-80gb-x8", "nic-sim-h100-x4"),
            simulation_dir=str(tmp_path),
        )
    )
    assert [b.driver for b in backends] == ["gpu.nvidia.com", NIC_DRIVER]
    # A test stand-in: no health probe, so no taints or health reports for its NICs.
    assert probe_for(backends[1]) is None
    assert probe_for(backends[0]) is not None
    with pytest.raises(ValueError, match=re.escape(f"two profiles publish for driver {NIC_DRIVER!r}")):
        await select_backends(
            DiscoveryConfig(node_name="n", simulated_profiles=("nic-sim-h100-x4", "nic-sim-h100-x4"))
        )


async def test_a_prepared_nic_gives_the_container_its_interface_and_root_only(tmp_path: Path) -> None:
    backend = SimulatedBackend(profile="nic-sim-h100-x4", node_name="n", state_dir=tmp_path)
    inventory = await backend.discover()
    device = inventory.by_name()["nic-2"]
    # The environment its vendor adds as the agent's wiring picks it for this driver.
    vendor_env = prepare_tools.vendor_env(backend)
    spec = build_claim_spec(claim_uid=CLAIM_UID, devices=[device], inventory=inventory, vendor_env=vendor_env)
    assert spec["kind"] == f"k8s.{NIC_DRIVER}/claim"
    (cdi_device,) = spec["devices"]
    edits = cdi_device["containerEdits"]
    assert "deviceNodes" not in edits
    assert "DRA_SIM_NIC_2_IFNAME=ens3f0np0" in edits["env"]
    assert "DRA_SIM_NIC_2_PCIE_ROOT=pci0000:97" in edits["env"]
    assert "DRA_SIM_NIC_2_NUMA_NODE=1" in edits["env"]
    # The NVIDIA runtime's variable belongs to the GPU driver's spec; an empty one here would hide GPUs.
    every_env = [*edits["env"], *spec.get("containerEdits", {}).get("env", [])]
    assert not [e for e in every_env if e.startswith("NVIDIA_VISIBLE_DEVICES")]


def test_a_nic_profile_names_its_driver_or_gets_the_default(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("nic: {nics: [{ifName: eth1, pciBusId: '0000:05:00.0'}]}\n")
    profile = load_profile(path)
    assert profile.driver == NIC_DRIVER
    assert profile.nic is not None
    assert profile.nic.nics[0].rdma  # NICs of a simulated GPU host are RDMA-capable unless told
    other = parse_profile(
        {"nic": {"driver": "nic.example.com", "nics": [{"ifName": "a", "pciBusId": "0000:05:00.0"}]}},
        label="x",
    )
    assert other.driver == "nic.example.com"


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"nics": []}, "nic.nics: must list at least one NIC"),
        (
            {"nics": [{"ifName": "this-name-is-too-long", "pciBusId": "0000:05:00.0"}]},
            "is not a Linux interface",
        ),
        (
            {"nics": [{"ifName": "eth0", "pciBusId": "0000:05:00.0", "rdma": "yes"}]},
            "rdma: must be true or false",
        ),
        ({"nics": [{"ifName": "eth0", "pciBusId": "0000:05:00.0", "mtu": 9000}]}, "unknown field 'mtu'"),
        ({"nics": [{"ifName": "eth0", "pciBusId": "0000:05:00.0"}], "gpus": 1}, "unknown field 'gpus'"),
    ],
)
def test_bad_nic_profiles_are_rejected_naming_the_field(section: dict[str, object], message: str) -> None:
    with pytest.raises(ProfileError, match=re.escape(message)):
        parse_profile({"nic": section}, label="test")
