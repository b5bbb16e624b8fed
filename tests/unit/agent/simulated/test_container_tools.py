"""The simulated driver root: its nvidia-smi run with the host's POSIX sh, as busybox runs it in a
container whose device nodes came from the CDI spec (the nodes are temporary files here), and the
driver files a GPU claim's spec mounts from it, found by the scan that reads a real driver root."""

from __future__ import annotations

import subprocess
from pathlib import Path

from dra_node_agent.cdi import build_claim_spec
from dra_node_agent.nvidia.container_env import NvidiaEnv
from dra_node_agent.simulated import container_tools
from dra_node_agent.simulated.discovery import GPU_STATE_DIR, SIMULATED_DRIVER_ROOT, SimulatedBackend

UID = "0a1b2c3d-0000-4000-8000-000000000001"


def _run(tmp_path: Path, script: str, present: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the stand-in with its table's device-node paths moved under ``tmp_path``."""
    dev = tmp_path / "dev"
    for node in present:
        path = dev / node.removeprefix("/dev/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    tool = tmp_path / "nvidia-smi"
    tool.write_text(script.replace("/dev/", f"{dev}/"))
    return subprocess.run(["sh", str(tool), *args], capture_output=True, text=True, check=False)


def test_a_container_sees_the_gpus_and_mig_devices_whose_nodes_it_was_given(tmp_path: Path) -> None:
    inventory = SimulatedBackend(
        profile="a100-40gb-mig", node_name="n1", state_dir=tmp_path / "sim"
    ).discover_sync()
    devices = inventory.by_name()
    script = (tmp_path / "sim" / SIMULATED_DRIVER_ROOT / container_tools.NVIDIA_SMI).read_text()
    assert script == container_tools.nvidia_smi_script(
        state_dir=tmp_path / "sim" / GPU_STATE_DIR, devices=inventory.devices
    )
    full = devices["gpu-3"]
    mig = next(d for d in inventory.devices if d.kind == "mig" and d.parent_uuid != full.uuid)
    given = [n.path for n in full.edits.device_nodes] + [n.path for n in mig.edits.device_nodes]
    result = _run(tmp_path, script, given, "-L")
    assert result.returncode == 0, result.stderr
    # GPUs in MIG mode are 0-2, so the MIG device's parent is listed first, as nvidia-smi orders by index.
    assert result.stdout.splitlines() == [
        f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {mig.parent_uuid})",
        f"  MIG {mig.attributes['profile'].value} Device 0: (UUID: {mig.uuid})",
        f"GPU 1: NVIDIA A100-SXM4-40GB (UUID: {full.uuid})",
    ]


def test_no_devices_and_other_options_fail_as_the_real_tool_would(tmp_path: Path) -> None:
    inventory = SimulatedBackend(
        profile="h100-80gb-x8", node_name="n1", state_dir=tmp_path / "sim"
    ).discover_sync()
    script = container_tools.nvidia_smi_script(state_dir=tmp_path / "state", devices=inventory.devices)
    nothing = _run(tmp_path, script, [], "-L")
    assert (nothing.returncode, nothing.stdout) == (6, "No devices were found\n")
    other = _run(tmp_path, script, ["/dev/nvidia0"], "-q")
    assert other.returncode == 2
    assert "only -L, and compute-policy" in other.stderr
    # The host's side: a time slice for a GPU the state folder does not know.
    unknown = _run(tmp_path, script, [], "compute-policy", "-i", "GPU-x", "--set-timeslice", "1")
    assert (unknown.returncode, unknown.stderr.strip()) == (6, "No GPU with UUID GPU-x was found")


def test_a_gpu_claims_spec_mounts_the_simulated_driver_root_as_a_real_one(tmp_path: Path) -> None:
    backend = SimulatedBackend(profile="h100-80gb-x8", node_name="n1", state_dir=tmp_path / "sim")
    inventory = backend.discover_sync()
    driver_root = tmp_path / "sim" / SIMULATED_DRIVER_ROOT
    version = "580.95.05"
    lib = "/usr/lib/x86_64-linux-gnu"
    gsp = f"/lib/firmware/nvidia/{version}/gsp_ga10x.bin"
    mounts = {m.container_path: m.host_path for m in inventory.common_edits.mounts}
    assert mounts == {
        f"{lib}/libcuda.so.{version}": f"{driver_root}{lib}/libcuda.so.{version}",
        # No nvidia-cdi-hook: the links are mounts of the file they lead to.
        f"{lib}/libcuda.so.1": f"{driver_root}{lib}/libcuda.so.{version}",
        f"{lib}/libcuda.so": f"{driver_root}{lib}/libcuda.so.{version}",
        f"{lib}/libnvidia-ml.so.{version}": f"{driver_root}{lib}/libnvidia-ml.so.{version}",
        f"{lib}/libnvidia-ml.so.1": f"{driver_root}{lib}/libnvidia-ml.so.{version}",
        "/usr/bin/nvidia-smi": f"{driver_root}/usr/bin/nvidia-smi",
        "/usr/bin/nvidia-cuda-mps-control": f"{driver_root}/usr/bin/nvidia-cuda-mps-control",
        # The IMEX tools, as a driver with IMEX support ships them (a ComputeDomain daemon runs them).
        "/usr/bin/nvidia-imex": f"{driver_root}/usr/bin/nvidia-imex",
        "/usr/bin/nvidia-imex-ctl": f"{driver_root}/usr/bin/nvidia-imex-ctl",
        gsp: f"{driver_root}{gsp}",
        **(
            {container_tools.CONTAINER_MPS_CLIENT: f"{driver_root}/{container_tools.MPS_CLIENT_PATH}"}
            if backend.hardware().char_devices
            else {}
        ),
    }
    assert all(m.read_only for m in inventory.common_edits.mounts)
    spec = build_claim_spec(
        claim_uid=UID, devices=[inventory.by_name()["gpu-0"]], inventory=inventory, vendor_env=NvidiaEnv()
    )
    edits = spec["containerEdits"]
    if not backend.hardware().char_devices:
        # Without mknod the fake /dev cannot be injected, and neither is anything else of it.
        assert "mounts" not in edits
        return
    assert {m["containerPath"] for m in edits["mounts"]} == set(mounts)
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert "hooks" not in edits
    # And the client of the claim's simulated MPS daemon, for containers on a real node.
    assert (driver_root / container_tools.MPS_CLIENT_PATH).read_text() == container_tools.MPS_CLIENT
