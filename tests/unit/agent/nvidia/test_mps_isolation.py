"""A claim's MPS daemon kept to what the claim holds: its folders owned and moded so its containers
write only their shm, that shm a tmpfs of a fixed size (a write past it fails, the node's disk is
never used), the daemon in a memory cgroup of its own (past its limit it is killed alone), links
planted in the shm never written through, multi-user mode as the claim asks.

The daemon is the simulated node's stand-in (``simulated.host_tools``), which serves clients as
the real one does in what matters here; clients are this test speaking its protocol on the FIFO.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_node_agent.device_setup import MpsOptions
from dra_node_agent.devices import Attribute, DiscoveredDevice
from dra_node_agent.nvidia.mps import MpsDaemons, MpsError, MpsLimits, resolve_limits
from dra_node_agent.opaqueconfig import MpsConfig
from dra_node_agent.simulated.host_tools import install_simulated_mps_control
from tests import mps_cgroup

MIB = 1 << 20


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "state" / "mps"
    yield folder
    mps_cgroup.clean_up(folder)


def daemons(root: Path, options: MpsOptions | None = None) -> MpsDaemons:
    tool = root.parent.parent / "driver" / "nvidia-cuda-mps-control"
    install_simulated_mps_control(tool)
    return MpsDaemons(
        root=root,
        control=tool,
        driver_root=tool.parent,
        env={},
        socket_path_max=None,
        options=options or mps_cgroup.options(),
    )


def pid_of(mps: MpsDaemons, uid: str) -> int:
    return int(json.loads((mps.claim_dir(uid) / "daemon.json").read_text())["pid"])


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def ask(mps: MpsDaemons, uid: str, line: str, answer: str, *, timeout: float = 10) -> str | None:
    """Send one client line to the claim's daemon; its answer (None: none came, e.g. it is dead)."""
    pipe = mps.claim_dir(uid) / "pipe"
    deadline = time.monotonic() + timeout
    while True:
        try:  # not blocking: ENXIO while nothing reads the FIFO (a daemon between two reads, or dead)
            fd = os.open(pipe / "control", os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                return None
            time.sleep(0.02)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return (pipe / "answers" / answer).read_text().strip()
        except FileNotFoundError:
            time.sleep(0.05)
    return None


def mounted(path: Path) -> bool:
    return f" {path} " in Path("/proc/self/mountinfo").read_text()


def fill(path: Path, *, up_to: int) -> tuple[int, int | None]:
    """Write MiB by MiB up to ``up_to`` bytes: how many were written, and the errno that stopped it."""
    written = 0
    try:
        with path.open("wb") as out:
            while written < up_to:
                out.write(b"x" * MIB)
                out.flush()
                written += MIB
    except OSError as exc:
        return written, exc.errno
    return written, None


def wait_dead(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


def connect(mps: MpsDaemons, uid: str, user: int) -> str | None:
    nonce = str(uuid.uuid4())
    return ask(mps, uid, f"connect {user} {nonce}", f"{nonce}.connect")


async def test_the_claims_folders_let_its_containers_write_only_their_shm_a_tmpfs_of_its_size(
    root: Path,
) -> None:
    mps = daemons(root, mps_cgroup.options(shm_size=4 * MIB))
    await mps.start("c1", MpsLimits(uuids=("GPU-a",)))
    folder = mps.claim_dir("c1")

    def mode(path: Path) -> tuple[int, int]:
        info = path.lstat()
        return stat.S_IMODE(info.st_mode), info.st_uid

    # Parents: traversable, not listable, by other users of the node (a non-root server must reach
    # its pipe); the pipe and log: the root daemon's alone; the shm: everyone's, as /dev/shm is.
    assert mode(root) == (0o711, 0)
    assert mode(folder) == (0o711, 0)
    assert mode(folder / "pipe") == (0o755, 0)
    assert mode(folder / "log") == (0o755, 0)
    assert mode(folder / "shm") == (0o1777, 0)
    shm = os.statvfs(folder / "shm")
    assert shm.f_blocks * shm.f_frsize == 4 * MIB
    flags = os.statvfs(folder / "shm").f_flag
    assert flags & os.ST_NOSUID
    assert flags & os.ST_NODEV
    assert flags & os.ST_NOEXEC
    assert "accel-dra-mps-server" not in " ".join(os.listdir(folder / "shm"))  # nothing written at start

    # A writer past the size gets ENOSPC; the bytes it wrote live on the tmpfs, not the node's disk.
    written, error = await asyncio.to_thread(fill, folder / "shm" / "fill", up_to=8 * MIB)
    assert error == errno.ENOSPC
    assert written <= 4 * MIB
    assert (folder / "shm" / "fill").stat().st_dev != folder.stat().st_dev

    await mps.stop("c1")
    assert not folder.exists()
    assert not await asyncio.to_thread(mounted, folder / "shm")


async def test_a_daemon_past_its_memory_limit_is_killed_alone_and_its_claim_still_unprepares(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mps = daemons(root, mps_cgroup.options(memory_limit=32 * MIB))
    assert mps.cgroups is not None

    await mps.start("greedy", MpsLimits(uuids=("GPU-a",)))
    await mps.start("other", MpsLimits(uuids=("GPU-b",)))
    greedy, other = pid_of(mps, "greedy"), pid_of(mps, "other")
    assert (mps.cgroups.path("greedy") / "cgroup.procs").read_text().split() == [str(greedy)]
    assert "served" in (await asyncio.to_thread(connect, mps, "greedy", 0) or "")

    # A client's work makes the server hold host memory: far past the limit. No answer comes: the
    # daemon is killed on the way (were it not, wait_dead would say so).
    nonce = str(uuid.uuid4())
    await asyncio.to_thread(ask, mps, "greedy", f"host-memory {nonce} 256", f"{nonce}.memory", timeout=1)
    assert await asyncio.to_thread(wait_dead, greedy, 20)
    assert mps.cgroups.oom_kills("greedy") >= 1
    assert mps.cgroups.oom_kills("other") == 0
    # The other claim's daemon serves on; this process (the agent) lives, of course.
    assert alive(other)
    assert "served" in (await asyncio.to_thread(connect, mps, "other", 0) or "")

    with caplog.at_level("WARNING"):
        await mps.stop("greedy")
    assert "had ended before its stop: its cgroup's memory limit (33554432 bytes" in caplog.text
    assert not mps.cgroups.path("greedy").exists()
    assert alive(other)
    await mps.stop("other")


async def test_a_link_planted_in_the_shm_before_a_daemon_restart_is_never_written_through(
    root: Path, tmp_path: Path
) -> None:
    mps = daemons(root)
    await mps.start("c1", MpsLimits(uuids=("GPU-a",)))
    victim = tmp_path / "victim"
    victim.write_text("the node's file\n")
    # A container running as root plants links where the server writes its segment, and kills
    # nothing: the daemon dies (as at a restart of the agent's container) and is started again.
    shm = mps.claim_dir("c1") / "shm"
    for user in (0, 1000):
        (shm / f"accel-dra-mps-server-{user}").symlink_to(victim)
    old = pid_of(mps, "c1")
    os.killpg(old, signal.SIGKILL)
    assert await asyncio.to_thread(wait_dead, old, 10)
    await mps.start("c1", MpsLimits(uuids=("GPU-a",)))
    assert pid_of(mps, "c1") != old

    answer = await asyncio.to_thread(connect, mps, "c1", 0)
    assert answer is not None
    assert answer.startswith("served"), answer
    assert victim.read_text() == "the node's file\n"
    segment = shm / "accel-dra-mps-server-0"
    assert not segment.is_symlink()
    assert segment.read_text().strip() == "GPU-a"
    await mps.stop("c1")
    assert victim.read_text() == "the node's file\n"


async def test_multi_user_starts_the_daemon_with_minus_m_and_a_restart_keeps_it(root: Path) -> None:
    mps = daemons(root)
    single = MpsLimits(uuids=("GPU-a",))
    multi = MpsLimits(uuids=("GPU-b",), multi_user=True)

    await mps.start("single", single)
    await mps.start("multi", multi)
    pipe = {uid: mps.claim_dir(uid) / "pipe" for uid in ("single", "multi")}
    assert (pipe["single"] / "mode").read_text().strip() == "multi-user no"
    assert (pipe["multi"] / "mode").read_text().strip() == "multi-user yes"
    # Without -M a second user is turned away while the first one's server has clients (the real
    # daemon queues it); with -M both are served.
    assert "served" in (await asyncio.to_thread(connect, mps, "single", 1000) or "")
    assert (await asyncio.to_thread(connect, mps, "single", 2000) or "").startswith("refused")
    assert "served" in (await asyncio.to_thread(connect, mps, "multi", 1000) or "")
    assert "served" in (await asyncio.to_thread(connect, mps, "multi", 2000) or "")

    # What a restart starts again from: the recorded settings, multi-user included.
    recorded = mps.recorded_limits("multi")
    assert recorded == multi
    old = pid_of(mps, "multi")
    os.killpg(old, signal.SIGKILL)
    assert await asyncio.to_thread(wait_dead, old, 10)
    assert recorded is not None
    await mps.start("multi", recorded)
    assert (pipe["multi"] / "mode").read_text().strip() == "multi-user yes"
    for uid in pipe:
        await mps.stop(uid)


async def test_without_a_cgroup_hierarchy_the_start_fails_naming_the_flag_and_leaves_nothing(
    root: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "no-cgroups"
    empty.mkdir()
    options = MpsOptions(
        shm_size=MIB, memory_limit=64 * MIB, cgroup_parent=mps_cgroup.PARENT, cgroup_root=empty
    )
    mps = daemons(root, options)
    with pytest.raises(MpsError, match=r"no cgroup memory controller under .*no-cgroups.*--cgroup-root"):
        await mps.start("c1", MpsLimits(uuids=("GPU-a",)))
    assert not mps.claim_dir("c1").exists()
    assert not await asyncio.to_thread(mounted, mps.claim_dir("c1") / "shm")


async def test_an_empty_cgroup_parent_keeps_the_daemon_in_the_agents_cgroup(root: Path) -> None:
    options = MpsOptions(
        shm_size=MIB, memory_limit=64 * MIB, cgroup_parent="", cgroup_root=Path("/sys/fs/cgroup")
    )
    mps = daemons(root, options)
    assert mps.cgroups is None
    await mps.start("c1", MpsLimits(uuids=("GPU-a",)))
    mine = await asyncio.to_thread(Path("/proc/self/cgroup").read_text)
    assert await asyncio.to_thread(Path(f"/proc/{pid_of(mps, 'c1')}/cgroup").read_text) == mine
    await mps.stop("c1")
    assert not mps.claim_dir("c1").exists()


def gpu(index: int, capability: str) -> DiscoveredDevice:
    return DiscoveredDevice(
        name=f"gpu-{index}",
        kind="gpu",
        uuid=f"GPU-{index}",
        attributes={"cudaComputeCapability": Attribute("version", capability)},
        local_id=str(index),
        pci_bus_id=f"0000:0{index}:00.0",
    )


def test_multi_user_on_a_gpu_older_than_volta_is_refused_as_nvidias_driver_does() -> None:
    config = MpsConfig(multi_user=True)
    assert resolve_limits(config, [gpu(0, "7.0.0"), gpu(1, "9.0.0")], where="w").multi_user
    with pytest.raises(MpsError) as caught:
        resolve_limits(config, [gpu(0, "9.0.0"), gpu(1, "6.1.0")], where="request r: mpsConfig")
    assert str(caught.value) == (
        "request r: mpsConfig.multiUser: multiuser mode was requested but is not supported by GPU 1 "
        "(GPU-1, compute capability 6.1.0; Volta (7.0) or newer is needed)"
    )
    assert not resolve_limits(MpsConfig(), [gpu(1, "6.1.0")], where="w").multi_user


async def test_a_claim_an_older_agent_prepared_keeps_its_shm_folder_when_its_daemon_starts_again(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An agent before the tmpfs made shm/ a plain folder (mode 1777), which the claim's running
    # containers have as their /dev/shm: a tmpfs over it would part them from the daemon.
    folder = root / "c1"
    (folder / "shm").mkdir(parents=True)
    (folder / "shm").chmod(0o1777)
    (folder / "shm" / "in-use").write_text("x")
    (folder / "pipe").mkdir()
    (folder / "pipe").chmod(0o1777)
    mps = daemons(root)
    with caplog.at_level("WARNING"):
        await mps.start("c1", MpsLimits(uuids=("GPU-a",)))
    assert "MPS claim c1 keeps the shm folder an older agent made" in caplog.text
    assert not await asyncio.to_thread(mounted, folder / "shm")
    assert (folder / "shm" / "in-use").read_text() == "x"
    pid = pid_of(mps, "c1")
    assert os.stat(f"/proc/{pid}/root/dev/shm").st_ino == os.stat(folder / "shm").st_ino
    assert stat.S_IMODE((folder / "pipe").stat().st_mode) == 0o755  # tightened all the same
    assert mps.cgroups is not None
    assert mps.cgroups.members("c1") == [pid]
    await mps.stop("c1")
    assert not folder.exists()
