"""GPUs for passthrough over the simulated hardware: the fake sysfs acts on driver_override, bind
and unbind as the kernel does (and refuses what it refuses), the fake NVML loses a GPU the NVIDIA
driver no longer holds, and discovery publishes each free GPU as ``gpu-vfio-<index>`` with NVIDIA's
attributes, through a binding and an agent restart."""

from __future__ import annotations

import errno
import stat
import uuid
from pathlib import Path

import pytest
import yaml

from dra_node_agent.devices import check_inventory
from dra_node_agent.pci import bound_driver, iommu_group_members
from dra_node_agent.pci_binding import BindingError, PciDriverBinding
from dra_node_agent.simulated.discovery import SimulatedBackend, SimulatedHardware

PROFILES = Path(__file__).parents[4] / "node_agent" / "dra_node_agent" / "profiles"
GPU0 = "0000:1b:00.0"  # the H100 profile's first GPU, IOMMU group 40


def backend(
    tmp_path: Path, *, profile: str | Path = "h100-80gb-x8", passthrough: bool = True
) -> SimulatedBackend:
    return SimulatedBackend(
        profile=profile, node_name="n1", state_dir=tmp_path / "hw", passthrough=passthrough
    )


def binding(hardware: SimulatedHardware) -> PciDriverBinding:
    return PciDriverBinding(hardware.root / "sys", written=hardware.kernel)


def nvml_count(hardware: SimulatedHardware) -> int:
    nvml = hardware.nvml
    assert nvml is not None
    nvml.nvmlInitWithFlags(0)
    try:
        return nvml.nvmlDeviceGetCount()
    finally:
        nvml.nvmlShutdown()


def to_vfio(pci: PciDriverBinding, address: str) -> None:
    pci.set_override(address, "vfio-pci")
    pci.unbind(address)
    pci.bind(address, "vfio-pci")


def test_each_gpu_is_published_for_passthrough_with_nvidias_attributes(tmp_path: Path) -> None:
    inventory = backend(tmp_path).discover_sync()
    assert check_inventory(inventory) == []
    vfio = [d for d in inventory.devices if d.kind == "vfio"]
    assert [d.name for d in vfio] == [f"gpu-vfio-{i}" for i in range(8)]
    first = inventory.by_name()["gpu-vfio-0"].to_slice_device()
    assert first["attributes"] == {
        "deviceID": {"string": "0x2330"},
        "iommuFDEnabled": {"bool": False},
        "iommuGroup": {"int": 40},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "resource.kubernetes.io/numaNode": {"int": 0},
        "resource.kubernetes.io/pciBusID": {"string": GPU0},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
        "type": {"string": "vfio"},
        "uuid": {"string": str(uuid.uuid5(uuid.NAMESPACE_DNS, GPU0))},
        "vendorID": {"string": "0x10de"},
    }
    # The 64-bit BARs (the 128 GiB aperture and 32 MiB of registers), rounded up as go-nvlib does.
    assert first["capacity"] == {"addressableMemory": {"value": "256Gi"}}
    assert [n.path for n in inventory.by_name()["gpu-vfio-0"].edits.device_nodes] == ["/dev/vfio/40"]
    # The GPUs are still CUDA devices too, until one is claimed for passthrough.
    assert len([d for d in inventory.devices if d.kind == "gpu"]) == 8


def test_a_gpus_cuda_and_passthrough_devices_consume_one_counter_so_no_two_claims_get_both(
    tmp_path: Path,
) -> None:
    inventory = backend(tmp_path).discover_sync()
    sets = {c["name"]: c for c in inventory.slice_counter_sets()}
    assert sorted(sets) == sorted(f"gpu-vfio-{i}-counter-set" for i in range(8))
    assert sets["gpu-vfio-0-counter-set"]["counters"] == {"whole-gpu": {"value": "1"}}
    assert sorted(inventory.guard_counter_sets()) == sorted(sets)
    by_name = inventory.by_name()
    # gpu-vfio-0 is GPU0 (bus order); its CUDA twin is the GPU NVML finds at that address.
    (twin,) = [d for d in inventory.devices if d.kind == "gpu" and d.pci_bus_id == GPU0]
    for name in (twin.name, "gpu-vfio-0"):
        assert by_name[name].to_slice_device()["consumesCounters"] == [
            {"counterSet": "gpu-vfio-0-counter-set", "counters": {"whole-gpu": {"value": "1"}}}
        ]
    assert check_inventory(inventory) == []


def test_without_passthrough_no_counters_are_published(tmp_path: Path) -> None:
    inventory = backend(tmp_path, passthrough=False).discover_sync()
    assert inventory.counter_sets == ()
    assert not [d for d in inventory.devices if d.consumes is not None]


def test_off_by_default(tmp_path: Path) -> None:
    inventory = backend(tmp_path, passthrough=False).discover_sync()
    assert not [d for d in inventory.devices if d.kind == "vfio"]


def test_binding_to_vfio_pci_hides_the_gpu_from_nvml_and_makes_the_group_node(tmp_path: Path) -> None:
    sim = backend(tmp_path)
    hardware = sim.hardware()
    sysfs, dev = hardware.root / "sys", hardware.root / "dev"
    pci = binding(hardware)
    assert "gpu-0" in sim.discover_sync().by_name()  # NVML's name of it is known from here on
    assert pci.driver(GPU0) == "nvidia"
    assert pci.override(GPU0) is None
    assert not (dev / "vfio" / "40").exists()
    assert (dev / "vfio" / "vfio").exists()  # vfio's container node: the module is loaded

    pci.set_override(GPU0, "vfio-pci")
    pci.unbind(GPU0)
    assert pci.driver(GPU0) is None
    assert nvml_count(hardware) == 7
    pci.bind(GPU0, "vfio-pci")
    assert bound_driver(sysfs, GPU0) == "vfio-pci"
    node = dev / "vfio" / "40"
    assert node.exists()
    if hardware.char_devices:
        assert stat.S_ISCHR(node.lstat().st_mode)

    inventory = sim.discover_sync()
    names = set(inventory.by_name())
    assert "gpu-0" not in names  # NVML no longer sees it
    assert {f"gpu-{i}" for i in range(1, 8)} <= names
    assert "gpu-vfio-0" in names  # ... its passthrough device stays, with the name NVML gave it
    assert inventory.by_name()["gpu-vfio-0"].attributes["productName"].value == "NVIDIA H100 80GB HBM3"

    # Back: the group node goes once vfio-pci holds nothing of the group, NVML sees the GPU again.
    pci.set_override(GPU0, "nvidia")
    pci.unbind(GPU0)
    pci.bind(GPU0, "nvidia")
    pci.set_override(GPU0, None)
    assert not node.exists()
    assert pci.override(GPU0) is None
    assert "gpu-0" in sim.discover_sync().by_name()
    assert [w[0] for w in hardware.kernel.writes] == [  # type: ignore[union-attr]
        f"bus/pci/devices/{GPU0}/driver_override",
        "bus/pci/drivers/nvidia/unbind",
        "bus/pci/drivers/vfio-pci/bind",
        f"bus/pci/devices/{GPU0}/driver_override",
        "bus/pci/drivers/vfio-pci/unbind",
        "bus/pci/drivers/nvidia/bind",
        f"bus/pci/devices/{GPU0}/driver_override",
    ]


def test_the_fake_kernel_refuses_what_linux_refuses(tmp_path: Path) -> None:
    pci = binding(backend(tmp_path).hardware())

    def refused(step: object, code: int) -> None:
        with pytest.raises(BindingError) as caught:
            step()  # type: ignore[operator]
        assert caught.value.errno == code, caught.value

    refused(lambda: pci.bind(GPU0, "nvidia"), errno.EBUSY)  # it has a driver
    refused(lambda: pci.bind(GPU0, "vfio-pci"), errno.EBUSY)
    pci.unbind(GPU0)
    refused(lambda: pci.bind(GPU0, "vfio-pci"), errno.ENODEV)  # vfio-pci matches nothing unasked
    pci.set_override(GPU0, "vfio-pci")
    refused(lambda: pci.bind(GPU0, "nvidia"), errno.ENODEV)  # the override names another driver
    pci.bind(GPU0, "vfio-pci")
    with pytest.raises(BindingError):
        pci.bind("/".join(("..", "..", "etc")), "vfio-pci")  # not an address: nothing is written
    with pytest.raises(BindingError):
        pci.set_override(GPU0, "vfio-pci\nnvidia")  # not a driver name


def test_unbinding_from_a_driver_that_does_not_hold_it_is_refused(tmp_path: Path) -> None:
    hardware = backend(tmp_path).hardware()
    unbind = hardware.root / "sys/bus/pci/drivers/vfio-pci/unbind"
    assert hardware.kernel is not None
    with pytest.raises(OSError, match="vfio-pci does not hold") as caught:
        hardware.kernel(unbind, GPU0)
    assert caught.value.errno == errno.ENODEV
    assert bound_driver(hardware.root / "sys", GPU0) == "nvidia"


def test_a_binding_outlives_the_agent(tmp_path: Path) -> None:
    to_vfio(binding(backend(tmp_path).hardware()), GPU0)
    again = backend(tmp_path)  # a restarted agent lays the tree out again over the same folder
    names = set(again.discover_sync().by_name())
    assert "gpu-0" not in names
    assert "gpu-vfio-0" in names
    assert bound_driver(again.hardware().root / "sys", GPU0) == "vfio-pci"
    # NVML never saw it in this process: go-nvlib's name for an unknown device.
    assert again.discover_sync().by_name()["gpu-vfio-0"].attributes["productName"].value == "UNKNOWN_DEVICE"


def _profile(tmp_path: Path, **nvidia: object) -> Path:
    profile = yaml.safe_load((PROFILES / "h100-80gb-x8.yaml").read_text())
    profile["nvidia"].update(nvidia)
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def test_with_iommufd_vfio_pci_gives_each_gpu_a_cdev(tmp_path: Path) -> None:
    sim = backend(tmp_path, profile=_profile(tmp_path, iommufd=True))
    hardware = sim.hardware()
    assert sim.discover_sync().by_name()["gpu-vfio-0"].attributes["iommuFDEnabled"].value is True
    assert (hardware.root / "dev" / "iommu").exists()
    pci = binding(hardware)
    to_vfio(pci, GPU0)
    to_vfio(pci, "0000:43:00.0")
    assert sorted(p.name for p in (hardware.root / "dev/vfio/devices").iterdir()) == ["vfio0", "vfio1"]
    assert [p.name for p in (hardware.root / f"sys/bus/pci/devices/{GPU0}/vfio-dev").iterdir()] == ["vfio0"]
    pci.unbind(GPU0)
    assert [p.name for p in (hardware.root / "dev/vfio/devices").iterdir()] == ["vfio1"]


def test_gpus_of_a_profile_may_share_an_iommu_group(tmp_path: Path) -> None:
    profile = yaml.safe_load(_profile(tmp_path).read_text())
    profile["nvidia"]["gpus"][0]["iommuGroups"] = [7, 7, 8, 9, 10, 11, 12, 13]
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(profile))
    sim = backend(tmp_path, profile=path)
    assert iommu_group_members(sim.hardware().root / "sys", 7) == [GPU0, "0000:43:00.0"]
    groups = [d.attributes["iommuGroup"].value for d in sim.discover_sync().devices if d.kind == "vfio"]
    assert groups == [7, 7, 8, 9, 10, 11, 12, 13]  # published; prepare refuses a group it cannot give whole


def test_a_gpu_with_mig_devices_is_not_published_for_passthrough(tmp_path: Path) -> None:
    inventory = backend(tmp_path, profile="a100-40gb-mig").discover_sync()
    vfio = {d.pci_bus_id for d in inventory.devices if d.kind == "vfio"}
    migs = {d.pci_bus_id for d in inventory.devices if d.kind == "mig"}
    assert len(migs) == 3
    assert not vfio & migs
    assert len(vfio) == 5


def test_without_iommu_groups_nothing_is_published_for_passthrough(tmp_path: Path) -> None:
    sim = backend(tmp_path)
    hardware = sim.hardware()
    for link in (hardware.root / "sys/kernel/iommu_groups").iterdir():
        for entry in (link / "devices").iterdir():
            entry.unlink()
        (link / "devices").rmdir()
        link.rmdir()
    inventory = sim.discover_sync()
    assert not [d for d in inventory.devices if d.kind == "vfio"]
    assert any("no IOMMU groups" in e for e in inventory.errors)
