"""The simulated nvidia-smi: run with the host's POSIX sh against a table whose device nodes are
temporary files, as busybox runs it in a container whose device nodes came from the CDI spec."""

from __future__ import annotations

import subprocess
from pathlib import Path

from dra_node_agent.simulated import container_tools
from dra_node_agent.simulated.discovery import SimulatedBackend


def _run(tmp_path: Path, table: str, present: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the stand-in with its table and device-node paths moved under ``tmp_path``."""
    dev = tmp_path / "dev"
    rows = table.replace("/dev/", f"{dev}/")
    (tmp_path / "table").write_text(rows)
    for node in present:
        path = dev / node.removeprefix("/dev/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    script = tmp_path / "nvidia-smi"
    script.write_text(
        container_tools.SCRIPT.replace(container_tools.CONTAINER_TABLE, str(tmp_path / "table"))
    )
    return subprocess.run(["sh", str(script), *args], capture_output=True, text=True, check=False)


def test_a_container_sees_the_gpus_and_mig_devices_whose_nodes_it_was_given(tmp_path: Path) -> None:
    inventory = SimulatedBackend(
        profile="a100-40gb-mig", node_name="n1", state_dir=tmp_path / "sim"
    ).discover_sync()
    devices = inventory.by_name()
    table = container_tools.table(inventory.devices)
    full = devices["gpu-3"]
    mig = next(d for d in inventory.devices if d.kind == "mig" and d.parent_uuid != full.uuid)
    given = [n.path for n in full.edits.device_nodes] + [n.path for n in mig.edits.device_nodes]
    result = _run(tmp_path, table, given, "-L")
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
    table = container_tools.table(inventory.devices)
    nothing = _run(tmp_path, table, [], "-L")
    assert (nothing.returncode, nothing.stdout) == (6, "No devices were found\n")
    other = _run(tmp_path, table, ["/dev/nvidia0"], "-q")
    assert other.returncode == 2
    assert "only -L is implemented" in other.stderr


def test_the_cdi_spec_of_a_simulated_gpu_claim_mounts_the_tools_and_the_table(tmp_path: Path) -> None:
    backend = SimulatedBackend(profile="h100-80gb-x8", node_name="n1", state_dir=tmp_path / "sim")
    inventory = backend.discover_sync()
    if not backend.hardware().char_devices:
        # Without mknod the fake /dev cannot be injected, and neither is anything else of it.
        assert not inventory.common_edits.mounts
        return
    mounts = {m.container_path: Path(m.host_path) for m in inventory.common_edits.mounts}
    assert set(mounts) == {
        container_tools.CONTAINER_TOOL,
        container_tools.CONTAINER_TABLE,
        container_tools.CONTAINER_MPS_CLIENT,
    }
    assert mounts[container_tools.CONTAINER_TOOL].read_text() == container_tools.SCRIPT
    assert mounts[container_tools.CONTAINER_MPS_CLIENT].read_text() == container_tools.MPS_CLIENT
    assert mounts[container_tools.CONTAINER_TABLE].read_text() == container_tools.table(inventory.devices)
