"""The NVML paths on a real NVIDIA GPU: discovery, the CDI edits it yields, the health probe's
events and polls, and what dynamic MIG reads (read-only: nothing here changes the GPU's settings).

Run on a machine with a GPU and its driver: ``pytest --confcutdir=tests/hardware tests/hardware -s``.
Without a GPU every test fails (NVML is not usable): CI has none and does not collect this folder.
Each test prints what it saw, so a run's output is the record.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_node_agent.cdi import build_claim_spec
from dra_node_agent.devices import DiscoveredInventory, check_inventory
from dra_node_agent.nvidia.container_env import NvidiaEnv
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.nvidia.health_probe import NvmlHealthProbe
from dra_node_agent.nvidia.mig_discovery import possible_placements

REPO = Path(__file__).resolve().parents[2]
QUERY = "uuid,name,memory.total,pci.bus_id,driver_version,compute_cap,mig.mode.current"


def smi_gpus() -> list[dict[str, str]]:
    """What nvidia-smi says of each GPU, in NVML index order."""
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    keys = QUERY.split(",")
    return [dict(zip(keys, (v.strip() for v in line.split(",")), strict=True)) for line in out.splitlines()]


@pytest.fixture(scope="module")
def inventory() -> DiscoveredInventory:
    started = time.perf_counter()
    found = NvmlBackend().discover_sync()
    print(f"\ndiscovery pass: {1000 * (time.perf_counter() - started):.1f} ms, {len(found.devices)} devices")
    assert found.available, found.errors
    return found


def attribute(device: Any, name: str) -> Any:
    return next(iter(device.attributes[name].to_json().values()))


def test_discovery_publishes_each_gpu_as_nvidia_smi_describes_it(inventory: DiscoveredInventory) -> None:
    gpus = smi_gpus()
    whole = [d for d in inventory.devices if d.kind == "gpu"]
    for device in inventory.devices:
        print(device.to_slice_device())
    print("errors:", inventory.errors)
    assert check_inventory(inventory) == []
    assert [d.uuid for d in whole] == [g["uuid"] for g in gpus]
    for device, gpu in zip(whole, gpus, strict=True):
        assert attribute(device, "productName") == gpu["name"]
        assert attribute(device, "uuid") == gpu["uuid"]
        # nvidia-smi prints MiB; the slice carries bytes.
        assert device.capacity["memory"] == int(gpu["memory.total"]) * 2**20
        assert attribute(device, "resource.kubernetes.io/pciBusID").lower() == gpu["pci.bus_id"][-12:].lower()
        major, minor = gpu["compute_cap"].split(".")
        assert attribute(device, "cudaComputeCapability") == f"{major}.{minor}.0"
        # 580.95.05 is published as the semantic version 580.95.5.
        assert attribute(device, "driverVersion") == ".".join(
            str(int(p)) for p in gpu["driver_version"].split(".")
        )
        assert device.pci_bus_id is not None


def test_the_device_nodes_named_for_containers_exist(inventory: DiscoveredInventory) -> None:
    whole = [d for d in inventory.devices if d.kind == "gpu"]
    spec = build_claim_spec(
        claim_uid="6c8e3a36-1a1c-4e3a-9d63-2b8d1c9f0a11",
        devices=whole[:1],
        inventory=inventory,
        vendor_env=NvidiaEnv(),
    )
    print(spec)
    nodes = [n for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]
    nodes += spec.get("containerEdits", {}).get("deviceNodes", [])
    paths = {n.get("hostPath", n["path"]) for n in nodes}
    assert f"/dev/nvidia{whole[0].local_id}" in paths, paths
    assert "/dev/nvidiactl" in paths, paths
    missing = [p for p in paths if not Path(p).exists()]
    # nvidia-uvm-tools appears only once a CUDA program has loaded the UVM module; say so, do not hide it.
    assert set(missing) <= {"/dev/nvidia-uvm-tools", "/dev/nvidia-uvm"}, missing
    print("device nodes absent on this host:", missing)
    env = {e.split("=", 1)[0]: e.split("=", 1)[1] for e in spec.get("containerEdits", {}).get("env", [])}
    env |= {
        e.split("=", 1)[0]: e.split("=", 1)[1]
        for d in spec["devices"]
        for e in d["containerEdits"].get("env", [])
    }
    print("env:", env)
    # As NVIDIA's generated specs: the GPU is the device node, the driver's files are mounted, and
    # the variable tells an NVIDIA runtime to add nothing.
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "void", env
    mounted = {m["containerPath"] for m in spec.get("containerEdits", {}).get("mounts", [])}
    print("driver files mounted:", sorted(mounted))
    assert any(p.endswith("/nvidia-smi") for p in mounted), mounted
    assert any("/libcuda.so." in p for p in mounted), mounted


def test_the_health_probe_watches_events_and_polls_the_gpus_healthy(inventory: DiscoveredInventory) -> None:
    devices = list(inventory.devices)
    emitted: list[Any] = []
    xids: list[Any] = []
    lock = threading.Lock()

    def emit(observation: Any) -> None:
        with lock:
            emitted.append(observation)

    def xid(report: Any) -> None:
        with lock:
            xids.append(report)

    probe = NvmlHealthProbe(event_timeout_ms=500)
    probe.start(devices=devices, emit=emit, xid=xid)
    try:
        time.sleep(3)  # six event waits
        started = time.perf_counter()
        result = probe.poll(devices=devices, now=time.time())
        took = time.perf_counter() - started
    finally:
        probe.stop()
    print(f"\npoll of {len(devices)} devices: {1000 * took:.1f} ms")
    print("observations:", result.observations)
    print("telemetry:", result.telemetry)
    print("events emitted:", emitted, "xids:", xids)
    assert all(o.kind is None for o in result.observations), result.observations
    assert {o.device for o in result.observations} == {d.name for d in devices}
    for device in devices:
        if device.kind == "gpu":
            telemetry = result.telemetry[device.name]
            assert telemetry.temperature_celsius is not None
            assert telemetry.temperature_celsius > 0
            assert telemetry.memory_total_bytes == device.capacity["memory"]
    assert not xids, xids
    assert probe._thread is None or not probe._thread.is_alive()


class MigOnView:
    """Real NVML, except that every GPU says MIG is on: dynamic MIG's publication then runs on the
    GPU's real profiles and placements without the GPU's mode being changed (that needs a reset)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]


Profiles = dict[int, tuple[str, list[tuple[int, int]]]]


def driver_profiles() -> dict[str, Profiles]:
    """Per GPU UUID: GPU-instance profile id -> the name the driver gives it ("MIG 1g.18gb" ->
    "1g.18gb") and the placements (start, size) NVML offers."""
    found: dict[str, Profiles] = {}
    pynvml.nvmlInit()
    try:
        for gpu in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            current, pending = pynvml.nvmlDeviceGetMigMode(handle)
            print(f"\nGPU {gpu} {uuid}: MIG mode current={current} pending={pending}")
            profiles: Profiles = found.setdefault(uuid, {})
            for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
                try:
                    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
                except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                    continue
                name = info.name.decode() if isinstance(info.name, bytes) else str(info.name)
                placements = possible_placements(pynvml, handle, int(info.id))
                print(
                    f"  index {index} id {info.id} {name!r}: slices {info.sliceCount}, "
                    f"{info.memorySizeMB} MB, instances {info.instanceCount}, "
                    f"SMs {info.multiprocessorCount}, CE {info.copyEngineCount}, dec {info.decoderCount}, "
                    f"enc {info.encoderCount}, jpeg {info.jpegCount}, ofa {info.ofaCount}, "
                    f"placements {placements}"
                )
                profiles[int(info.id)] = (name.removeprefix("MIG "), placements)
    finally:
        pynvml.nvmlShutdown()
    return found


def test_dynamic_mig_publishes_the_gpus_real_profiles_under_the_drivers_names(
    inventory: DiscoveredInventory,
) -> None:
    """Read-only: what dynamic MIG would publish for these GPUs, from the profiles NVML reports."""
    profiles = driver_profiles()
    assert all(profiles.values()), "a GPU for which NVML lists no GPU-instance profile"
    published = NvmlBackend(nvml=MigOnView(), dynamic_mig=True).discover_sync()
    for device in published.devices:
        print(device.name, attribute(device, "profile"), device.consumes)
    print("counter sets:", published.counter_sets)
    assert check_inventory(published) == []
    assert len(published.counter_sets) == len(profiles)
    for counter_set in published.counter_sets:
        slices = [k for k in counter_set.counters if k.startswith("memory-slice-")]
        assert len(slices) == 8, counter_set
    placed = set()
    for device in published.devices:
        placement = device.mig_placement
        assert placement is not None, device.name
        name = profiles[placement.parent_uuid][placement.profile_id][0]
        assert attribute(device, "profile") == name, device.name
        placed.add((placement.parent_uuid, placement.profile_id, placement.start, placement.size))
    # Every placement NVML offers is published, once.
    offered = {
        (uuid, pid, start, size)
        for uuid, by_id in profiles.items()
        for pid, (_, places) in by_id.items()
        for start, size in places
    }
    assert placed == offered
    assert len(published.devices) == len(offered)


def test_the_discovery_command_prints_the_gpus(inventory: DiscoveredInventory) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("api", "node_agent"))}
    run = subprocess.run(
        [sys.executable, "-m", "dra_node_agent.discovery", "--backends", "nvidia"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    print(run.stdout[-2000:], run.stderr[-2000:])
    assert run.returncode == 0, run.stderr
    for device in inventory.devices:
        assert device.uuid in run.stdout
