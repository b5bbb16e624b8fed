"""Per-claim CDI specs: content for GPUs and TPUs, atomic writes, removal."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from dra_node_agent.cdi import CdiWriter, build_claim_spec, minimum_cdi_version
from dra_node_agent.devices import DiscoveredInventory, TpuHostInfo
from dra_node_agent.nvidia.container_env import NvidiaEnv
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.opaqueconfig import TpuConfig
from dra_node_agent.simulated.discovery import SimulatedBackend
from dra_node_agent.simulated.fakehw import FakeGpu, FakeNvml
from dra_node_agent.tpu.container_env import TpuEnv, multihost_worker, tpu_claim_env
from dra_node_agent.tpu.discovery import TpuBackend
from dra_node_agent.tpu.workers import TpuWorkers

SYSFS = Path(__file__).parents[3] / "fixtures" / "sysfs"
UID = "5f0c2e5a-8d8c-4c8e-9d55-1a2b3c4d5e6f"
KIND = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*[A-Za-z0-9]/[A-Za-z0-9][A-Za-z0-9_.-]*$")
CDI_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*[A-Za-z0-9]$")


def env_of(edits: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in edits.get("env", []))


def assert_valid_cdi(spec: dict[str, Any]) -> None:
    """The rules a CDI runtime enforces when it loads a spec."""
    assert KIND.match(spec["kind"])
    assert spec["devices"]
    for device in spec["devices"]:
        assert CDI_NAME.match(device["name"])
        assert device["containerEdits"]
    assert set(spec) <= {"cdiVersion", "kind", "devices", "containerEdits"}


def gpu_inventory() -> DiscoveredInventory:
    gpus = [
        FakeGpu(
            uuid=f"GPU-{i}",
            name="NVIDIA H100 80GB HBM3",
            minor=i,
            pci_bus_id=f"0000:{i + 16:02x}:00.0",
            memory_total=1 << 30,
        )
        for i in range(3)
    ]
    return NvmlBackend(nvml=FakeNvml(gpus=gpus)).discover_sync()


def tpu_inventory(host: str, **kwargs: Any) -> DiscoveredInventory:
    root = SYSFS / host
    return TpuBackend(
        node_name="tpu-node",
        sysfs_root=root / "sys",
        dev_root=root / "dev",
        tpu_env_path=root / "etc" / "tpu" / "tpu-env",
        **kwargs,
    ).discover_sync()


def test_gpu_claim_spec() -> None:
    inventory = gpu_inventory()
    devices = [inventory.by_name()["gpu-2"], inventory.by_name()["gpu-0"]]
    spec = build_claim_spec(claim_uid=UID, devices=devices, inventory=inventory, vendor_env=NvidiaEnv())
    assert_valid_cdi(spec)
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert spec["cdiVersion"] == "0.5.0"  # device names start with a digit (the claim UID)
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-2", f"{UID}-gpu-0"]
    assert spec["devices"][0]["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidia2"}]}
    common = spec["containerEdits"]
    assert [n["path"] for n in common["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    assert env_of(common) == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_host_dev_dir_becomes_host_path() -> None:
    gpus = [FakeGpu(uuid="GPU-0", name="x", minor=0, pci_bus_id="0000:10:00.0", memory_total=1 << 30)]
    inventory = NvmlBackend(nvml=FakeNvml(gpus=gpus), host_dev_dir="/run/nvidia/driver/dev").discover_sync()
    spec = build_claim_spec(
        claim_uid="abc", devices=inventory.devices, inventory=inventory, vendor_env=NvidiaEnv()
    )
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": "/run/nvidia/driver/dev/nvidia0"}
    ]
    assert spec["cdiVersion"] == "0.5.0"


def test_minimum_version_without_host_paths_or_digit_names() -> None:
    spec = {"kind": "k8s.x/claim", "devices": [{"name": "abc-gpu-0", "containerEdits": {"env": ["A=1"]}}]}
    assert minimum_cdi_version(spec) == "0.3.0"


def test_tpu_claim_spec_for_all_chips_of_a_v6e_host() -> None:
    inventory = tpu_inventory("tpu-v6e-host")
    spec = build_claim_spec(
        claim_uid=UID,
        devices=inventory.devices,
        inventory=inventory,
        node_name="tpu-node",
        vendor_env=TpuEnv(),
    )
    assert_valid_cdi(spec)
    assert spec["kind"] == "k8s.tpu.google.com/claim"
    first = spec["devices"][0]["containerEdits"]
    assert first["deviceNodes"] == [{"path": "/dev/vfio/0"}]
    assert env_of(first) == {"TPU_DEVICE_0_RESOURCE_CLAIM": UID}
    common = spec["containerEdits"]
    assert common["deviceNodes"] == [{"path": "/dev/vfio/vfio"}]
    env = env_of(common)
    assert {k: env[k] for k in env if k.startswith("TPU_")} == {
        "TPU_SKIP_MDS_QUERY": "true",
        "TPU_ACCELERATOR_TYPE": "v6e-8",
        "TPU_TOPOLOGY": "2x4",
        "TPU_TOPOLOGY_WRAP": "false,false,false",
        "TPU_TOPOLOGY_ALT": "false",
        "TPU_CHIPS_PER_HOST_BOUNDS": "2,4,1",
        "TPU_HOST_BOUNDS": "1,1,1",
        "TPU_VISIBLE_CHIPS": "0,1,2,3,4,5,6,7",
        "TPU_RUNTIME_METRICS_PORTS": "8431,8432,8433,8434,8435,8436,8437,8438",
        "TPU_WORKER_ID": "0",
        "TPU_WORKER_HOSTNAMES": "localhost",
    }
    assert env["KUBERNETES_NODE_NAME"] == "tpu-node"
    assert env["DRA_RESOURCE_DRIVER_NAME"] == "tpu.google.com"


def test_tpu_subset_gets_its_own_single_host_slice() -> None:
    inventory = tpu_inventory("tpu-v6e-host")
    spec = build_claim_spec(
        claim_uid=UID, devices=inventory.devices[4:], inventory=inventory, vendor_env=TpuEnv()
    )
    env = env_of(spec["containerEdits"])
    assert env["TPU_ACCELERATOR_TYPE"] == "v6e-4"
    assert env["TPU_TOPOLOGY"] == "2x2"
    assert env["TPU_CHIPS_PER_HOST_BOUNDS"] == "2,2,1"
    assert env["TPU_VISIBLE_CHIPS"] == "0,1,2,3"
    assert [d["containerEdits"]["deviceNodes"][0]["path"] for d in spec["devices"]] == [
        "/dev/vfio/4",
        "/dev/vfio/5",
        "/dev/vfio/6",
        "/dev/vfio/7",
    ]


def test_tpu_host_of_a_multi_host_slice() -> None:
    inventory = tpu_inventory("tpu-v5p-host")  # tpu-env: 2x2x4 slice, worker 1, 4 chips per host
    env = env_of(
        build_claim_spec(claim_uid=UID, devices=inventory.devices, inventory=inventory, vendor_env=TpuEnv())[
            "containerEdits"
        ]
    )
    assert env["TPU_ACCELERATOR_TYPE"] == "v5p-32"
    assert env["TPU_TOPOLOGY"] == "2x2x4"
    assert env["TPU_HOST_BOUNDS"] == "1,1,4"
    assert env["TPU_CHIPS_PER_HOST_BOUNDS"] == "2,2,1"
    assert env["TPU_TOPOLOGY_WRAP"] == "false,false,false"
    assert env["TPU_WORKER_ID"] == "1"
    assert "TPU_WORKER_HOSTNAMES" not in env  # the workload controller knows them, not the node


def test_tpu_v4_accel_nodes_and_wraparound() -> None:
    inventory = tpu_inventory("tpu-v4-host")
    spec = build_claim_spec(
        claim_uid=UID, devices=inventory.devices, inventory=inventory, vendor_env=TpuEnv()
    )
    first = spec["devices"][0]["containerEdits"]
    assert first["deviceNodes"] == [{"path": "/dev/accel0"}]
    assert env_of(first) == {"TPU_DEVICE_accel0_RESOURCE_CLAIM": UID}
    assert "containerEdits" in spec
    assert "deviceNodes" not in spec["containerEdits"]
    host = TpuHostInfo(
        "v4", "tpu-v4-podslice", 2, 4, "4x4x4", (2, 2, 1), worker_id=3, worker_hostnames=("a", "b")
    )
    env = dict(
        e.split("=", 1) for e in tpu_claim_env(host=host, chips=4, driver="tpu.google.com", node_name=None)
    )
    assert env["TPU_TOPOLOGY_WRAP"] == "true,true,true"
    assert env["TPU_ACCELERATOR_TYPE"] == "v4-128"
    assert env["TPU_HOST_BOUNDS"] == "2,2,4"
    assert env["TPU_WORKER_HOSTNAMES"] == "a,b"


def test_the_multi_host_worker_identity_takes_config_then_the_pods_job_then_the_host() -> None:
    host = TpuHostInfo(
        "v4", "tpu-v4-podslice", 2, 4, "4x4x4", (2, 2, 1), worker_id=3, worker_hostnames=("a", "b")
    )
    workers = TpuWorkers(worker_id=1, hostnames=("w-0", "w-1"))
    assert multihost_worker(host=host, chips=4, config=None, workers=None) == (3, ("a", "b"))
    assert multihost_worker(host=host, chips=4, config=None, workers=workers) == (1, ("w-0", "w-1"))
    config = TpuConfig(worker_id=0)
    assert multihost_worker(host=host, chips=4, config=config, workers=workers) == (0, ("w-0", "w-1"))
    # Fewer chips than the host has: a single-host sub-slice of its own, worker 0 of "localhost".
    assert multihost_worker(host=host, chips=2, config=config, workers=workers) is None
    single = TpuHostInfo("v6e", "tpu-v6e-slice", 1, 8, "2x4", (2, 4, 1))
    assert multihost_worker(host=single, chips=8, config=None, workers=None) is None
    unknown = dataclasses.replace(host, worker_id=None)
    assert multihost_worker(host=unknown, chips=4, config=None, workers=None) is None


def test_simulated_specs_name_the_fake_device_nodes_when_they_are_character_devices(tmp_path: Path) -> None:
    inventory = SimulatedBackend(profile="h100-80gb-x8", node_name="n", state_dir=tmp_path).discover_sync()
    nvidia0 = tmp_path / "dev" / "nvidia0"
    # As root (CI, a node's agent) the fake /dev holds character devices with the driver's numbers.
    assert inventory.simulated_nodes_on_host == stat.S_ISCHR(nvidia0.lstat().st_mode)
    if inventory.simulated_nodes_on_host:
        assert (os.major(nvidia0.lstat().st_rdev), os.minor(nvidia0.lstat().st_rdev)) == (195, 0)
    with_nodes = dataclasses.replace(inventory, simulated_nodes_on_host=True)
    spec = build_claim_spec(
        claim_uid=UID, devices=with_nodes.devices[:2], inventory=with_nodes, vendor_env=NvidiaEnv()
    )
    assert_valid_cdi(spec)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": str(nvidia0)}
    ]
    common = [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    assert common == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert env_of(spec["devices"][0]["containerEdits"]) == {
        "DRA_SIMULATED_DEVICE_GPU_0": inventory.devices[0].uuid
    }


def test_simulated_specs_carry_no_device_nodes_the_host_cannot_inject(tmp_path: Path) -> None:
    inventory = SimulatedBackend(profile="h100-80gb-x8", node_name="n", state_dir=tmp_path).discover_sync()
    plain = dataclasses.replace(inventory, simulated_nodes_on_host=False)
    spec = build_claim_spec(claim_uid=UID, devices=plain.devices[:2], inventory=plain, vendor_env=NvidiaEnv())
    assert_valid_cdi(spec)
    assert "deviceNodes" not in json.dumps(spec)
    assert env_of(spec["devices"][0]["containerEdits"]) == {
        "DRA_SIMULATED_DEVICE_GPU_0": inventory.devices[0].uuid
    }


@pytest.mark.parametrize(
    ("uid", "message"), [("Bad/UID", "not a lower-case RFC 4122 UID"), (UID, "no devices")]
)
def test_bad_input_is_rejected(uid: str, message: str) -> None:
    inventory = gpu_inventory()
    devices = inventory.devices if uid != UID else ()
    with pytest.raises(ValueError, match=message):
        build_claim_spec(claim_uid=uid, devices=devices, inventory=inventory, vendor_env=NvidiaEnv())


def test_writer_writes_atomically_and_removes(tmp_path: Path) -> None:
    inventory = gpu_inventory()
    writer = CdiWriter(driver="gpu.nvidia.com", cdi_dir=tmp_path / "cdi")
    ids = writer.write_claim_spec(claim_uid=UID, devices=inventory.devices[:2], inventory=inventory)
    assert ids == [f"k8s.gpu.nvidia.com/claim={UID}-gpu-0", f"k8s.gpu.nvidia.com/claim={UID}-gpu-1"]
    path = tmp_path / "cdi" / f"k8s.gpu.nvidia.com-claim_{UID}.json"
    assert writer.spec_path(UID) == path
    written = json.loads(path.read_text())
    assert [d["name"] for d in written["devices"]] == [f"{UID}-gpu-0", f"{UID}-gpu-1"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    # A retried prepare rewrites the same content and returns the same IDs.
    assert writer.write_claim_spec(claim_uid=UID, devices=inventory.devices[:2], inventory=inventory) == ids
    assert writer.claim_uids() == {UID}
    assert os.listdir(tmp_path / "cdi") == [path.name]
    assert writer.remove_claim_spec(UID)
    assert not path.exists()
    assert not writer.remove_claim_spec(UID)
    assert writer.claim_uids() == set()


def test_failed_write_keeps_the_old_spec_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inventory = gpu_inventory()
    writer = CdiWriter(driver="gpu.nvidia.com", cdi_dir=tmp_path)
    writer.write_claim_spec(claim_uid=UID, devices=inventory.devices[:1], inventory=inventory)
    before = writer.spec_path(UID).read_bytes()

    def disk_full(fd: int, data: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        writer.write_claim_spec(claim_uid=UID, devices=inventory.devices, inventory=inventory)
    monkeypatch.undo()
    assert writer.spec_path(UID).read_bytes() == before
    assert os.listdir(tmp_path) == [writer.spec_path(UID).name]


def test_stale_temp_files_are_cleaned(tmp_path: Path) -> None:
    writer = CdiWriter(driver="gpu.nvidia.com", cdi_dir=tmp_path)
    (tmp_path / f".k8s.gpu.nvidia.com-claim_{UID}.json.tmp-12-abcd").write_text("{")
    (tmp_path / "other-vendor.json").write_text("{}")
    assert writer.remove_stale_temp_files() == 1
    assert os.listdir(tmp_path) == ["other-vendor.json"]


def test_writer_refuses_another_drivers_inventory(tmp_path: Path) -> None:
    inventory = gpu_inventory()
    writer = CdiWriter(driver="tpu.google.com", cdi_dir=tmp_path)
    with pytest.raises(ValueError, match=r"inventory is for driver gpu\.nvidia\.com"):
        writer.write_claim_spec(claim_uid=UID, devices=inventory.devices, inventory=inventory)


def test_tpu_config_supplies_multi_host_identity_and_ici_resiliency() -> None:
    inventory = tpu_inventory("tpu-v5p-host")
    config = TpuConfig(worker_id=2, worker_hostnames=("w-0", "w-1", "w-2", "w-3"), ici_resiliency=True)
    spec = build_claim_spec(
        claim_uid=UID, devices=inventory.devices, inventory=inventory, config=config, vendor_env=TpuEnv()
    )
    env = env_of(spec["containerEdits"])
    assert env["TPU_WORKER_ID"] == "2"
    assert env["TPU_WORKER_HOSTNAMES"] == "w-0,w-1,w-2,w-3"
    assert env["ENABLE_ICI_RESILIENCY"] == "true"
    without = env_of(
        build_claim_spec(claim_uid=UID, devices=inventory.devices, inventory=inventory, vendor_env=TpuEnv())[
            "containerEdits"
        ]
    )
    assert "ENABLE_ICI_RESILIENCY" not in without  # 2x2x4 is below 4x4x4


def test_large_3d_slices_default_to_ici_resiliency() -> None:
    host = TpuHostInfo("v5p", "tpu-v5p-slice", 2, 4, "4x4x4", (2, 2, 1))
    env = dict(
        e.split("=", 1) for e in tpu_claim_env(host=host, chips=4, driver="tpu.google.com", node_name=None)
    )
    assert env["ENABLE_ICI_RESILIENCY"] == "true"
    off = TpuConfig(ici_resiliency=False)
    env = dict(
        e.split("=", 1)
        for e in tpu_claim_env(host=host, chips=4, driver="tpu.google.com", node_name=None, config=off)
    )
    assert env["ENABLE_ICI_RESILIENCY"] == "false"
