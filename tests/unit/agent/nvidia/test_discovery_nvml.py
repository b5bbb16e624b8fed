"""NVML discovery against a fake at the pynvml boundary (the module's functions are monkeypatched)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from dra_node_agent.devices import check_inventory
from dra_node_agent.nvidia.discovery import NvmlBackend, find_nvml_library
from dra_node_agent.nvidia.mig_discovery import mig_profile_name
from dra_node_agent.simulated.fakehw import FakeGpu, FakeMig, FakeMigProfile, FakeNvml, write_nvidia_nodes
from dra_node_agent.simulated.faketree import FakePciFunction, write_pci_tree

H100_MEMORY = 81559 << 20
A100_MEMORY = 40960 << 20
P_1G5 = FakeMigProfile(index=0, id=19, slices=1, memory_mib=4864, multiprocessors=14, copy_engines=1)
P_3G20 = FakeMigProfile(
    index=2, id=9, slices=3, memory_mib=19968, multiprocessors=42, copy_engines=3, decoders=2
)
P_1G5_ME = FakeMigProfile(
    index=7, id=20, slices=1, memory_mib=4864, multiprocessors=14, copy_engines=1, decoders=1, jpeg=1, ofa=1
)


def h100(
    minor: int, bus: str, *, mig_mode: int | None = None, failures: dict[str, int] | None = None
) -> FakeGpu:
    return FakeGpu(
        uuid=f"GPU-00000000-0000-0000-0000-00000000000{minor}",
        name="NVIDIA H100 80GB HBM3",
        minor=minor,
        pci_bus_id=bus,
        memory_total=H100_MEMORY,
        mig_mode=mig_mode,
        failures=failures or {},
    )


def a100_mig(minor: int, bus: str) -> FakeGpu:
    return FakeGpu(
        uuid=f"GPU-a100-{minor}",
        name="NVIDIA A100-SXM4-40GB",
        minor=minor,
        pci_bus_id=bus,
        memory_total=A100_MEMORY,
        brand=pynvml.NVML_BRAND_NVIDIA,
        architecture=pynvml.NVML_DEVICE_ARCH_AMPERE,
        compute_capability=(8, 0),
        mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
        mig_profiles=(P_1G5, P_3G20, P_1G5_ME),
        migs=(
            FakeMig(profile=P_3G20, start=4, gi_id=2, ci_id=0, uuid="MIG-aaaa"),
            FakeMig(profile=P_1G5, start=0, gi_id=7, ci_id=0, uuid="MIG-bbbb"),
            FakeMig(profile=P_1G5_ME, start=1, gi_id=8, ci_id=0, uuid="MIG-cccc"),
        ),
    )


Installer = Callable[[FakeNvml], FakeNvml]


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Installer:
    def _install(fake: FakeNvml) -> FakeNvml:
        fake.install(pynvml, monkeypatch.setattr)
        return fake

    return _install


async def test_full_gpus_are_named_by_minor_with_nvidia_attributes(
    install: Installer, tmp_path: Path
) -> None:
    # NVML index order differs from minor order: names must follow the minor (the /dev node).
    gpus = [h100(2, "0000:c3:00.0"), h100(0, "0000:1b:00.0")]
    fake = install(FakeNvml(gpus=gpus, driver_version="580.65.06", cuda_driver_version=12090))
    write_pci_tree(
        tmp_path,
        [FakePciFunction(address="0000:1b:00.0", vendor=0x10DE, device=0x2330, pcie_root="pci0000:15")],
    )
    backend = NvmlBackend(sysfs_root=tmp_path / "sys")

    inventory = await backend.discover()

    assert inventory.available
    assert [d.name for d in inventory.devices] == ["gpu-0", "gpu-2"]
    gpu0 = inventory.by_name()["gpu-0"].to_slice_device()
    assert gpu0 == {
        "name": "gpu-0",
        "attributes": {
            "architecture": {"string": "Hopper"},
            "brand": {"string": "Nvidia"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "cudaDriverVersion": {"version": "12.9.0"},
            "driverVersion": {"version": "580.65.6"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:1b:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
            "type": {"string": "gpu"},
            "uuid": {"string": "GPU-00000000-0000-0000-0000-000000000000"},
        },
        "capacity": {"memory": {"value": "81559Mi"}},
    }
    # No sysfs entry for the second GPU: pcieRoot is omitted rather than guessed.
    assert "resource.kubernetes.io/pcieRoot" not in inventory.by_name()["gpu-2"].attributes
    assert inventory.by_name()["gpu-2"].edits.device_nodes[0].path == "/dev/nvidia2"
    assert [n.path for n in inventory.common_edits.device_nodes] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    assert check_inventory(inventory) == []
    assert (fake.init_count, fake.shutdown_count) == (1, 1)


async def test_nvml_calls_run_off_the_event_loop_thread(
    install: Installer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = install(FakeNvml(gpus=[h100(0, "0000:1b:00.0")]))
    threads: list[int] = []
    original = fake.nvmlDeviceGetCount

    def counting() -> int:
        threads.append(threading.get_ident())
        return original()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", counting)
    await NvmlBackend().discover()
    assert threads
    assert threading.get_ident() not in threads


async def test_mig_enabled_gpu_publishes_its_mig_devices_instead(install: Installer, tmp_path: Path) -> None:
    gpus = [a100_mig(0, "0000:10:1c.0"), h100(1, "0000:20:1c.0", mig_mode=0)]
    install(FakeNvml(gpus=gpus))
    write_nvidia_nodes(tmp_path, gpus)
    inventory = await NvmlBackend(proc_root=tmp_path / "proc", sysfs_root=tmp_path / "sys").discover()

    names = [d.name for d in inventory.devices]
    assert names == ["gpu-0-mig-1g5gb-19-0", "gpu-0-mig-1g5gb-me-20-1", "gpu-0-mig-3g20gb-9-4", "gpu-1"]
    mig = inventory.by_name()["gpu-0-mig-3g20gb-9-4"]
    rendered = mig.to_slice_device()
    assert rendered["attributes"]["type"] == {"string": "mig"}
    assert rendered["attributes"]["profile"] == {"string": "3g.20gb"}
    assert rendered["attributes"]["parentUUID"] == {"string": "GPU-a100-0"}
    assert rendered["attributes"]["uuid"] == {"string": "MIG-aaaa"}
    assert rendered["attributes"]["productName"] == {"string": "NVIDIA A100-SXM4-40GB"}
    assert rendered["capacity"] == {
        "copyEngines": {"value": "3"},
        "decoders": {"value": "2"},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": "0"},
        "memory": {"value": "19968Mi"},
        "multiprocessors": {"value": "42"},
        "ofaEngines": {"value": "0"},
    }
    assert inventory.by_name()["gpu-0-mig-1g5gb-me-20-1"].attributes["profile"].value == "1g.5gb+me"
    assert mig.parent_uuid == "GPU-a100-0"
    # The parent node plus the GPU- and compute-instance capability nodes from /proc.
    paths = [n.path for n in mig.edits.device_nodes]
    assert paths[0] == "/dev/nvidia0"
    assert len(paths) == 3
    assert all(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in paths[1:])
    assert check_inventory(inventory) == []


async def test_nvml_missing_publishes_nothing_and_logs_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def not_found(flags: int) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInitWithFlags", not_found)
    backend = NvmlBackend()
    with caplog.at_level(logging.INFO, logger="dra_node_agent.nvidia.discovery"):
        first = await backend.discover()
        second = await backend.discover()
    assert not first.available
    assert not second.available
    assert first.devices == ()
    assert second.devices == ()
    messages = [r.getMessage() for r in caplog.records if r.name == "dra_node_agent.nvidia.discovery"]
    assert len(messages) == 1
    assert "NVML Shared Library Not Found" in messages[0]


async def test_one_failing_gpu_is_skipped_and_reported(install: Installer) -> None:
    lost = h100(1, "0000:43:00.0", failures={"nvmlDeviceGetUUID": pynvml.NVML_ERROR_GPU_IS_LOST})
    fake = install(FakeNvml(gpus=[h100(0, "0000:1b:00.0"), lost, h100(2, "0000:52:00.0")]))
    inventory = await NvmlBackend().discover()
    assert [d.name for d in inventory.devices] == ["gpu-0", "gpu-2"]
    assert len(inventory.errors) == 1
    assert "index 1" in inventory.errors[0]
    assert "GPU is lost" in inventory.errors[0]
    assert fake.shutdown_count == 1


async def test_unsupported_memory_query_omits_capacity(install: Installer) -> None:
    gpu = h100(0, "0000:1b:00.0", failures={"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_NOT_SUPPORTED})
    install(FakeNvml(gpus=[gpu]))
    inventory = await NvmlBackend().discover()
    assert "capacity" not in inventory.devices[0].to_slice_device()


async def test_failing_mig_device_is_skipped(install: Installer) -> None:
    gpu = a100_mig(0, "0000:10:1c.0")
    gpu.failures["nvmlDeviceGetAttributes"] = pynvml.NVML_ERROR_UNKNOWN
    install(FakeNvml(gpus=[gpu]))
    inventory = await NvmlBackend().discover()
    assert inventory.devices == ()
    assert len(inventory.errors) == 3
    assert all("MIG device" in e for e in inventory.errors)


async def test_system_query_failure_marks_backend_unavailable(
    install: Installer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = install(FakeNvml(gpus=[h100(0, "0000:1b:00.0")]))

    def broken() -> str:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)

    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", broken)
    inventory = await NvmlBackend().discover()
    assert not inventory.available
    assert inventory.devices == ()
    assert fake.shutdown_count == 1


def test_mig_profile_names_follow_nvidia() -> None:
    total = A100_MEMORY
    assert (
        mig_profile_name(gi_slices=1, ci_slices=1, memory_mib=4864, total_bytes=total, profile_index=0)
        == "1g.5gb"
    )
    assert (
        mig_profile_name(gi_slices=7, ci_slices=7, memory_mib=40192, total_bytes=total, profile_index=4)
        == "7g.40gb"
    )
    assert (
        mig_profile_name(gi_slices=4, ci_slices=4, memory_mib=19968, total_bytes=total, profile_index=3)
        == "4g.20gb"
    )
    assert (
        mig_profile_name(gi_slices=2, ci_slices=1, memory_mib=9856, total_bytes=total, profile_index=1)
        == "1c.2g.10gb"
    )
    assert (
        mig_profile_name(gi_slices=1, ci_slices=1, memory_mib=9856, total_bytes=H100_MEMORY, profile_index=7)
        == "1g.10gb+me"
    )


# An H200's GPU-instance profiles as NVML reported them on the device machine (2026-11-26, driver
# 580.159.04): (profile index, slices, memorySizeMB) and the name the driver gives each.
H200_MEMORY = 150754820096
H200_PROFILES = [
    (0, 1, 16384, "1g.18gb"),
    (1, 2, 33280, "2g.35gb"),
    (2, 3, 71424, "3g.71gb"),
    (3, 4, 71424, "4g.71gb"),
    (4, 7, 143360, "7g.141gb"),
    (7, 1, 16384, "1g.18gb+me"),
    (9, 1, 33280, "1g.35gb"),
]


@pytest.mark.parametrize(("index", "slices", "memory_mib", "name"), H200_PROFILES)
def test_h200_profile_names_round_halves_up_as_nvidia_does(
    index: int, slices: int, memory_mib: int, name: str
) -> None:
    # 3g and 4g are exactly half of the GPU's 141 GB: 70.5 is named 71.
    assert (
        mig_profile_name(
            gi_slices=slices,
            ci_slices=slices,
            memory_mib=memory_mib,
            total_bytes=H200_MEMORY,
            profile_index=index,
        )
        == name
    )


def test_nvml_library_is_found_under_the_driver_root(tmp_path: Path) -> None:
    assert find_nvml_library(tmp_path) is None
    library = tmp_path / "usr" / "lib" / "x86_64-linux-gnu" / "libnvidia-ml.so.1"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    assert find_nvml_library(tmp_path) == library.resolve()
