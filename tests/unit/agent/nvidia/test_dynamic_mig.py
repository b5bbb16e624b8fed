"""Dynamic MIG: the published placements and counter sets, and creating and destroying instances,
against the fake NVML with the real profile tables (A100 40GB/80GB, H100 80GB, H200)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pynvml
import pytest

from dra_node_agent.devices import DiscoveredDevice, check_inventory
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.nvidia.dynamic_mig import DynamicMig, MigError
from dra_node_agent.simulated.fakehw import MIG_INSTANCES_FILE, FakeGpu, FakeMigProfile, FakeNvml
from dra_node_agent.simulated.migtables import A100_40GB, A100_80GB, H100_80GB, H200_141GB


def gpu(name: str, memory_mib: int, table: tuple[FakeMigProfile, ...], minor: int = 0) -> FakeGpu:
    return FakeGpu(
        uuid=f"GPU-{minor}-{name.replace(' ', '-')}",
        name=name,
        minor=minor,
        pci_bus_id=f"0000:{0x10 + minor:02x}:00.0",
        memory_total=memory_mib << 20,
        architecture=pynvml.NVML_DEVICE_ARCH_AMPERE,
        mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
        mig_profiles=table,
    )


def a100_40() -> FakeGpu:
    return gpu("NVIDIA A100-SXM4-40GB", 40960, A100_40GB)


def backend(*gpus: FakeGpu, state_dir: Path | None = None, node_root: Path | None = None) -> NvmlBackend:
    fake = FakeNvml(gpus=list(gpus), state_dir=state_dir, node_root=node_root)
    return NvmlBackend(nvml=fake, dynamic_mig=True, proc_root=(node_root or Path("/nonexistent")) / "proc")


def by_name(backend: NvmlBackend) -> dict[str, DiscoveredDevice]:
    return backend.discover_sync().by_name()


@pytest.mark.parametrize(
    ("name", "memory", "table", "profiles"),
    [
        (
            "NVIDIA A100-SXM4-40GB",
            40960,
            A100_40GB,
            {
                "1g.5gb": 7,
                "1g.5gb+me": 7,
                "1g.10gb": 4,
                "2g.10gb": 3,
                "3g.20gb": 2,
                "4g.20gb": 1,
                "7g.40gb": 1,
            },
        ),
        (
            "NVIDIA A100-SXM4-80GB",
            81920,
            A100_80GB,
            {
                "1g.10gb": 7,
                "1g.10gb+me": 7,
                "1g.20gb": 4,
                "2g.20gb": 3,
                "3g.40gb": 2,
                "4g.40gb": 1,
                "7g.80gb": 1,
            },
        ),
        (
            "NVIDIA H100 80GB HBM3",
            81559,
            H100_80GB,
            {
                "1g.10gb": 7,
                "1g.10gb+me": 7,
                "1g.20gb": 4,
                "2g.20gb": 3,
                "3g.40gb": 2,
                "4g.40gb": 1,
                "7g.80gb": 1,
            },
        ),
        (
            # Half the GPU is 70.5 GB: the driver names it 71.
            "NVIDIA H200",
            143771,
            H200_141GB,
            {
                "1g.18gb": 7,
                "1g.18gb+me": 7,
                "1g.35gb": 4,
                "2g.35gb": 3,
                "3g.71gb": 2,
                "4g.71gb": 1,
                "7g.141gb": 1,
            },
        ),
    ],
)
def test_every_placement_of_every_profile_is_published_with_nvidias_profile_names(
    name: str, memory: int, table: tuple[FakeMigProfile, ...], profiles: dict[str, int]
) -> None:
    inventory = backend(gpu(name, memory, table)).discover_sync()
    assert check_inventory(inventory) == []
    seen: dict[str, int] = {}
    for device in inventory.devices:
        profile = device.attributes["profile"].value
        seen[str(profile)] = seen.get(str(profile), 0) + 1
        assert device.kind == "mig"
        assert device.uuid == ""
        assert device.mig_placement is not None
        assert device.attributes["type"].value == "mig"
        assert "uuid" not in device.attributes  # there is no instance, so no UUID, until prepare
    assert seen == profiles
    [counters] = inventory.counter_sets
    assert counters.name == "gpu-0-counter-set"
    assert [f"memory-slice-{i}" for i in range(8)] == sorted(k for k in counters.counters if "slice" in k)


def test_a_placement_consumes_its_engines_memory_and_the_memory_slices_it_covers() -> None:
    devices = by_name(backend(a100_40()))
    three = devices["gpu-0-mig-3g20gb-9-4"]
    assert three.consumes is not None
    assert three.consumes.name == "gpu-0-counter-set"
    assert three.consumes.counters == {
        "multiprocessors": 42,
        "copy-engines": 3,
        "decoders": 2,
        "memory": 19968 << 20,
        "memory-slice-4": 1,
        "memory-slice-5": 1,
        "memory-slice-6": 1,
        "memory-slice-7": 1,
    }
    entry = three.to_slice_device()["consumesCounters"]
    assert entry == [
        {
            "counterSet": "gpu-0-counter-set",
            "counters": {
                "copy-engines": {"value": "3"},
                "decoders": {"value": "2"},
                "memory": {"value": "19968Mi"},
                "memory-slice-4": {"value": "1"},
                "memory-slice-5": {"value": "1"},
                "memory-slice-6": {"value": "1"},
                "memory-slice-7": {"value": "1"},
                "multiprocessors": {"value": "42"},
            },
        }
    ]
    whole = devices["gpu-0-mig-7g40gb-0-0"].consumes
    assert whole is not None
    assert {f"memory-slice-{i}" for i in range(8)} <= set(whole.counters)


def test_the_counter_set_holds_exactly_the_whole_gpu() -> None:
    [counters] = backend(a100_40()).discover_sync().counter_sets
    assert counters.counters["multiprocessors"] == 98
    assert counters.counters["copy-engines"] == 7
    assert counters.counters["decoders"] == 5
    assert counters.counters["memory"] == 40192 << 20


def test_without_dynamic_mig_a_mig_gpu_publishes_only_its_live_instances() -> None:
    static = NvmlBackend(nvml=FakeNvml(gpus=[a100_40()]))
    inventory = static.discover_sync()
    assert inventory.devices == ()
    assert inventory.counter_sets == ()


def test_create_and_destroy_a_placement(tmp_path: Path) -> None:
    b = backend(a100_40(), state_dir=tmp_path / "state", node_root=tmp_path)
    devices = by_name(b)
    mig = DynamicMig(b)
    placement = devices["gpu-0-mig-3g20gb-9-4"].mig_placement
    assert placement is not None
    instance = mig.create(placement)
    assert instance.uuid.startswith("MIG-")
    assert instance.ci_id == 0
    assert [(i.profile_id, i.start) for i in mig.live(["GPU-0-NVIDIA-A100-SXM4-40GB"])] == [(9, 4)]
    live = mig.edits(devices["gpu-0-mig-3g20gb-9-4"], instance)
    caps = [n.path for n in live.edits.device_nodes]
    assert caps[0] == "/dev/nvidia0"
    assert len(caps) == 3
    assert all("nvidia-caps" in c for c in caps[1:])
    # The simulated driver keeps the instance across agent restarts.
    assert (
        '"start": 4' in (tmp_path / "state" / "GPU-0-NVIDIA-A100-SXM4-40GB" / MIG_INSTANCES_FILE).read_text()
    )
    # A retried prepare finds and keeps it.
    assert mig.create(placement) == instance
    assert mig.destroy(placement) is True
    assert mig.live(["GPU-0-NVIDIA-A100-SXM4-40GB"]) == []
    assert mig.destroy(placement) is False


def test_an_overlapping_placement_is_refused_by_nvml_and_leaves_nothing() -> None:
    b = backend(a100_40())
    devices = by_name(b)
    mig = DynamicMig(b)
    first = devices["gpu-0-mig-3g20gb-9-4"].mig_placement
    overlapping = devices["gpu-0-mig-1g5gb-19-6"].mig_placement
    assert first is not None
    assert overlapping is not None
    mig.create(first)
    with pytest.raises(MigError, match="profile 19 at memory slice 6: creating the MIG device failed"):
        mig.create(overlapping)
    assert [(i.profile_id, i.start) for i in mig.live([first.parent_uuid])] == [(9, 4)]


def test_a_gpu_instance_without_its_compute_instance_is_redone(tmp_path: Path) -> None:
    # A crash between the two NVML calls leaves a bare GPU instance; the retry replaces it.
    b = backend(a100_40())
    devices = by_name(b)
    mig = DynamicMig(b)
    placement = devices["gpu-0-mig-2g10gb-14-2"].mig_placement
    assert placement is not None
    nvml = b.open_nvml()

    spot = pynvml.c_nvmlGpuInstancePlacement_t()
    spot.start, spot.size = 2, 2
    parent = nvml.nvmlDeviceGetHandleByUUID(placement.parent_uuid)
    nvml.nvmlDeviceCreateGpuInstanceWithPlacement(parent, 14, ctypes.byref(spot))
    nvml.nvmlShutdown()
    instance = mig.create(placement)
    assert instance.uuid.startswith("MIG-")
    assert len(mig.live([placement.parent_uuid])) == 1
