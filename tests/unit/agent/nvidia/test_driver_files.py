"""The driver files a GPU claim's CDI spec mounts, found under driver roots laid out as real hosts
lay them out: a merged /usr whose /lib links to usr/lib, absolute links, GKE's lib64 and bin, NVIDIA's
hooks when the host has nvidia-cdi-hook, and the scan's bounds. And the spec a claim gets: no
reliance on NVIDIA_VISIBLE_DEVICES, which is void."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dra_node_agent.cdi import build_claim_spec
from dra_node_agent.nvidia import driver_files
from dra_node_agent.nvidia.container_env import NvidiaEnv
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.nvidia.driver_files import resolve_in_root, scan_driver_root
from dra_node_agent.simulated.discovery import load_profile, simulated_gpus
from dra_node_agent.simulated.fakehw import FakeNvml

VERSION = "580.95.05"
LIB = "usr/lib/x86_64-linux-gnu"
UID = "0a1b2c3d-0000-4000-8000-000000000001"


def _file(path: Path, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(path.name)
    path.chmod(mode)


def host_root(root: Path) -> Path:
    """A Debian-like host: merged /usr (lib -> usr/lib), the driver's libraries with their links,
    an unrelated library, its tools, GSP firmware and the persistence daemon's socket."""
    (root / "usr/lib").mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    for name in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"):
        _file(root / LIB / f"{name}.{VERSION}")
        (root / LIB / f"{name}.1").symlink_to(f"{name}.{VERSION}")
    (root / LIB / "libcuda.so").symlink_to("libcuda.so.1")
    # An absolute link, as some installers write: it must resolve inside the root.
    (root / LIB / "libnvidia-cfg.so.1").symlink_to(f"/{LIB}/libnvidia-cfg.so.{VERSION}")
    _file(root / LIB / f"libnvidia-cfg.so.{VERSION}")
    _file(root / LIB / "libc.so.6")
    _file(root / LIB / "libcuda.so.570.1.1")  # another driver version's leftover
    for tool in ("nvidia-smi", "nvidia-persistenced", "nvidia-cuda-mps-control"):
        _file(root / "usr/bin" / tool, 0o755)
    _file(root / "usr/bin/nvidia-debugdump", 0o644)  # not executable: not mounted
    _file(root / f"usr/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin")
    (root / "run/nvidia-persistenced").mkdir(parents=True)
    # A socket file as the daemon leaves it (mknod: no path-length limit, unlike bind).
    os.mknod(root / "run/nvidia-persistenced/socket", stat.S_IFSOCK | 0o666)
    return root


def test_a_host_install_is_found_as_nvcdi_finds_it(tmp_path: Path) -> None:
    files = scan_driver_root(host_root(tmp_path / "root"), version=VERSION)
    lib = f"/{LIB}"
    assert {f.path: f.links for f in files.libraries} == {
        f"{lib}/libcuda.so.{VERSION}": (f"{lib}/libcuda.so", f"{lib}/libcuda.so.1"),
        f"{lib}/libnvidia-cfg.so.{VERSION}": (f"{lib}/libnvidia-cfg.so.1",),
        f"{lib}/libnvidia-ml.so.{VERSION}": (f"{lib}/libnvidia-ml.so.1",),
        f"{lib}/libnvidia-ptxjitcompiler.so.{VERSION}": (f"{lib}/libnvidia-ptxjitcompiler.so.1",),
    }
    assert [f.path for f in files.binaries] == [
        "/usr/bin/nvidia-smi",
        "/usr/bin/nvidia-persistenced",
        "/usr/bin/nvidia-cuda-mps-control",
    ]
    # /lib/firmware is usr/lib/firmware on a merged /usr; the container gets it where it really is.
    assert [f.path for f in files.firmware] == [f"/usr/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"]
    assert [(f.path, f.noexec) for f in files.sockets] == [("/run/nvidia-persistenced/socket", True)]


def test_without_the_hook_the_links_are_mounts_read_only_from_the_hosts_driver_root(tmp_path: Path) -> None:
    files = scan_driver_root(host_root(tmp_path / "root"), version=VERSION)
    edits = files.container_edits(host_root="/run/nvidia/driver", hook_path=None)
    by_target = {m.container_path: m for m in edits.mounts}
    libcuda = f"/run/nvidia/driver/{LIB}/libcuda.so.{VERSION}"
    for name in (f"libcuda.so.{VERSION}", "libcuda.so.1", "libcuda.so"):
        assert by_target[f"/{LIB}/{name}"].host_path == libcuda
    assert by_target["/usr/bin/nvidia-smi"].host_path == "/run/nvidia/driver/usr/bin/nvidia-smi"
    assert all(m.read_only for m in edits.mounts)
    assert by_target["/run/nvidia-persistenced/socket"].to_cdi()["options"] == [
        "ro",
        "nosuid",
        "nodev",
        "bind",
        "noexec",
    ]
    assert not edits.hooks
    # Nothing of the host's /tmp/nvidia-mps: a claim's MPS daemon is its own.
    assert not [m for m in edits.mounts if m.container_path.startswith("/tmp")]


def test_with_the_hook_the_spec_runs_nvidias_hooks_and_mounts_the_files_only(tmp_path: Path) -> None:
    files = scan_driver_root(host_root(tmp_path / "root"), version=VERSION)
    edits = files.container_edits(host_root="/", hook_path="/usr/bin/nvidia-cdi-hook")
    assert f"/{LIB}/libcuda.so.1" not in {m.container_path for m in edits.mounts}
    assert [h.to_cdi() for h in edits.hooks] == [
        {
            "hookName": "createContainer",
            "path": "/usr/bin/nvidia-cdi-hook",
            "args": ["nvidia-cdi-hook", "create-symlinks", "--link", f"libcuda.so.1::/{LIB}/libcuda.so"],
        },
        {
            "hookName": "createContainer",
            "path": "/usr/bin/nvidia-cdi-hook",
            "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", f"/{LIB}"],
        },
    ]


def test_gkes_driver_root_mounts_at_its_own_layout(tmp_path: Path) -> None:
    root = tmp_path / "home/kubernetes/bin/nvidia"
    _file(root / f"lib64/libcuda.so.{VERSION}")
    (root / "lib64/libcuda.so.1").symlink_to(f"libcuda.so.{VERSION}")
    _file(root / "bin/nvidia-smi", 0o755)
    files = scan_driver_root(root, version=VERSION)
    edits = files.container_edits(host_root="/home/kubernetes/bin/nvidia", hook_path=None)
    assert {m.container_path: m.host_path for m in edits.mounts} == {
        f"/lib64/libcuda.so.{VERSION}": f"/home/kubernetes/bin/nvidia/lib64/libcuda.so.{VERSION}",
        "/lib64/libcuda.so.1": f"/home/kubernetes/bin/nvidia/lib64/libcuda.so.{VERSION}",
        "/bin/nvidia-smi": "/home/kubernetes/bin/nvidia/bin/nvidia-smi",
    }


def test_links_resolve_inside_the_root_and_loops_end(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    # A link that climbs above the root: built from parts, as a path in the source it would look
    # like one that leaves the repository.
    (root / "a/up").symlink_to("/".join([".."] * 4 + ["etc"]))
    (root / "a/abs").symlink_to("/a")
    (root / "loop1").symlink_to("loop2")
    (root / "loop2").symlink_to("loop1")
    assert resolve_in_root(root, "a/abs/abs/abs") == "/a"
    assert resolve_in_root(root, "a/up") is None  # /etc inside the root does not exist
    (root / "etc").mkdir()
    assert resolve_in_root(root, "a/up") == "/etc"  # ".." stops at the root
    assert resolve_in_root(root, "loop1") is None
    assert resolve_in_root(root, "missing/x") is None


def test_the_scan_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "root"
    for i in range(30):
        _file(root / LIB / f"libnvidia-extra{i:02d}.so.{VERSION}")
    monkeypatch.setattr(driver_files, "MAX_FILES", 10)
    files = scan_driver_root(root, version=VERSION)
    assert len(files.libraries) == 10
    assert "more than 10 driver files" in caplog.text
    monkeypatch.setattr(driver_files, "MAX_DIR_ENTRIES", 5)
    assert len(scan_driver_root(root, version=VERSION).libraries) == 5
    assert "has more than 5 entries" in caplog.text


def test_an_empty_driver_root_says_so_and_mounts_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = scan_driver_root(tmp_path, version=VERSION)
    assert files.container_edits(host_root="/", hook_path=None).is_empty()
    assert f"has no libcuda.so.{VERSION}" in caplog.text


def test_a_gpu_claims_spec_carries_the_driver_and_void_and_is_scanned_once_per_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = load_profile("h100-80gb-x8").nvidia
    assert profile is not None
    nvml = FakeNvml(
        gpus=simulated_gpus(profile, node_name="n1"), driver_version=VERSION, cuda_driver_version=12090
    )
    root = host_root(tmp_path / "root")
    backend = NvmlBackend(nvml=nvml, driver_root=root, host_driver_root="/")
    scans: list[str] = []
    real_scan = driver_files.scan_driver_root

    def counting(root: Path, *, version: str) -> driver_files.DriverFiles:
        scans.append(version)
        return real_scan(root, version=version)

    monkeypatch.setattr("dra_node_agent.nvidia.discovery.scan_driver_root", counting)
    inventory = backend.discover_sync()
    backend.discover_sync()
    assert scans == [VERSION]
    spec = build_claim_spec(
        claim_uid=UID, devices=[inventory.by_name()["gpu-1"]], inventory=inventory, vendor_env=NvidiaEnv()
    )
    common = spec["containerEdits"]
    # The GPU is the device node; the variable only tells an NVIDIA runtime to add nothing.
    assert common["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert spec["devices"][0]["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidia1"}]}
    assert [n["path"] for n in common["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    mounted = {m["containerPath"]: m["hostPath"] for m in common["mounts"]}
    assert mounted[f"/{LIB}/libcuda.so.1"] == f"/{LIB}/libcuda.so.{VERSION}"
    assert mounted["/usr/bin/nvidia-smi"] == "/usr/bin/nvidia-smi"
    assert all(m["options"][:4] == ["ro", "nosuid", "nodev", "bind"] for m in common["mounts"])
    assert not [e for d in spec["devices"] for e in d["containerEdits"].get("env", []) if "VISIBLE" in e]
    assert os.path.exists(root / LIB / f"libcuda.so.{VERSION}")
