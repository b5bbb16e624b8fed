"""MPS on a real GPU: the claim's control daemon as the agent starts it (its own mount namespace,
the claim's shm tmpfs as /dev/shm, a memory cgroup of its own), a CUDA client in a namespace like
the claim's containers (the pipe folder read-only at /tmp/nvidia-mps, the shm tmpfs, the limits as
environment), the pinned-memory limit enforced, the daemon outliving the event loop that started
it (an agent restart keeps it), and nothing left after stop; then a multi-user daemon (``-M``)
serving clients of two users at once. No GPU setting is changed.

Run with the other hardware tests, as root: ``pytest --confcutdir=tests/hardware tests/hardware -s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dra_node_agent import prepare_tools
from dra_node_agent.device_setup import MpsOptions
from dra_node_agent.nvidia.cgroups import Hierarchy
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.nvidia.mps import CONTAINER_PIPE_DIR, MpsDaemons, MpsLimits, find_control_tool

CLAIM = "0f3c4b1e-7a52-4d1c-9e0b-5c2d8e6f7a10"
MULTI_CLAIM = "5b1e0c2d-3f4a-4b6c-8d9e-0a1b2c3d4e5f"
GIB = 1 << 30
OPTIONS = MpsOptions(shm_size=GIB, memory_limit=2 * GIB, cgroup_parent=f"accel-dra-hwtest-{os.getpid()}")
# The client: an allocation inside the claim's limit, one beyond it.
CLIENT = """
import json, torch
seen = {"sms": torch.cuda.get_device_properties(0).multi_processor_count}
inside = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
seen["inside"] = "allocated"
try:
    beyond = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    seen["beyond"] = "allocated"
except RuntimeError as err:
    seen["beyond"] = "refused: " + str(err).splitlines()[0][:160]
print(json.dumps(seen))
"""


def driver_root() -> Path:
    for root in (Path("/"), Path("/usr/local/nvidia")):
        if find_control_tool(root) is not None:
            return root
    raise AssertionError("no nvidia-cuda-mps-control under / or /usr/local/nvidia")


def show(folder: Path) -> None:
    for path in sorted((folder / "log").glob("*")):
        print(f"--- {path.name}:\n{path.read_text(errors='replace')[-1500:]}")


# A client that holds its CUDA context: says when it is up, then ends after the seconds asked.
HOLDER = """
import os, sys, time, torch
torch.ones(1, device="cuda"); torch.cuda.synchronize()
print("up", os.getuid(), time.time(), flush=True)
time.sleep(float(sys.argv[1]))
print("end", os.getuid(), time.time(), flush=True)
"""


def container_like(folder: Path, *, user: int = 0) -> list[str]:
    """A command prefix that runs like the claim's containers: the pipe folder read-only at
    /tmp/nvidia-mps, the shm tmpfs at /dev/shm, as ``user``."""
    script = (
        "folder=$1 user=$2; shift 2; mkdir -p /tmp/nvidia-mps && "
        'mount --bind -o ro "$folder/pipe" /tmp/nvidia-mps && mount --bind "$folder/shm" /dev/shm && '
        'exec setpriv --reuid "$user" --regid "$user" --clear-groups "$@"'
    )
    namespace = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "client"]
    return [*namespace, str(folder), str(user)]


def run_client(folder: Path, limits: MpsLimits, uuid: str) -> subprocess.CompletedProcess[str]:
    env = dict(e.split("=", 1) for e in limits.container_env())
    print("container environment:", env)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == CONTAINER_PIPE_DIR
    return subprocess.run(
        [*container_like(folder), sys.executable, "-c", CLIENT],
        env={**os.environ, **env, "CUDA_VISIBLE_DEVICES": uuid},
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_claims_mps_daemon_serves_a_client_within_the_claims_limits() -> None:
    # Short: the daemon's socket paths must fit a unix socket's 107 bytes.
    state = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))
    root = driver_root()
    backend = NvmlBackend(driver_root=root)
    gpu = next(d for d in backend.discover_sync().devices if d.kind == "gpu")
    limits = MpsLimits(uuids=(gpu.uuid,), active_thread_percentage=50, pinned_memory={gpu.uuid: 2 * GIB})
    daemons = prepare_tools.mps_daemons(backend, state, OPTIONS)
    assert daemons is not None
    assert daemons.cgroups is not None
    folder = daemons.claim_dir(CLAIM)

    async def serve() -> None:
        await daemons.start(CLAIM, limits)
        up = daemons.running(CLAIM)
        show(folder)
        assert up, "the daemon is not running right after start"
        # Its cgroup is its own (outside this process's), and its /dev/shm the claim's tmpfs.
        pid = json.loads((folder / "daemon.json").read_text())["pid"]
        assert daemons.cgroups is not None
        assert pid in daemons.cgroups.members(CLAIM)
        shm = os.statvfs(folder / "shm")
        assert shm.f_blocks * shm.f_frsize == OPTIONS.shm_size
        client = await asyncio.to_thread(run_client, folder, limits, gpu.uuid)
        print("client:", client.returncode, client.stdout[-1000:], client.stderr[-2000:])
        show(folder)
        assert client.returncode == 0, client.stderr[-2000:]
        seen = json.loads(client.stdout.strip().splitlines()[-1])
        assert seen["inside"] == "allocated"
        assert seen["beyond"].startswith("refused"), seen  # the 2 GiB pinned-memory limit holds
        # In the foreground the daemon logs to its output, not to control.log: the client went
        # through the claim's MPS server.
        said = (folder / "log" / "daemon.out").read_text(errors="replace")
        assert "Server has started" in said, said[-2000:]
        assert "NEW CLIENT" in said, said[-2000:]
        print("SMs the client saw with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50:", seen["sms"])
        print("the claim's cgroup after the client, memory peak:", cgroup_memory(daemons))

    try:
        asyncio.run(serve())
        # The loop that started it has ended, as an agent's does when it restarts.
        outlived = daemons.running(CLAIM)
        pid = json.loads((folder / "daemon.json").read_text())["pid"]
        print("daemon cgroup:", Path(f"/proc/{pid}/cgroup").read_text().strip())
        print("running after its event loop ended:", outlived)
        assert outlived
    finally:
        fresh = MpsDaemons(
            root=state, control=find_control_tool(root), driver_root=root, env={}, options=OPTIONS
        )
        asyncio.run(fresh.stop(CLAIM))
    assert not fresh.running(CLAIM)
    assert not folder.exists()
    assert fresh.cgroups is not None
    assert not fresh.cgroups.path(CLAIM).exists()
    left = subprocess.run(["pgrep", "-af", "nvidia-cuda-mps"], capture_output=True, text=True).stdout
    print("MPS processes left:", left or "none")
    assert str(folder) not in left
    remove_parent()


def cgroup_memory(daemons: MpsDaemons) -> str:
    assert daemons.cgroups is not None
    folder = daemons.cgroups.path(CLAIM)
    for name in ("memory.peak", "memory.max_usage_in_bytes"):
        with contextlib.suppress(OSError):
            return (folder / name).read_text().strip()
    return "unknown"


def remove_parent() -> None:
    hierarchy = Hierarchy.detect(OPTIONS.cgroup_root)
    if hierarchy is not None:
        with contextlib.suppress(OSError):
            (hierarchy.root / OPTIONS.cgroup_parent).rmdir()


def holder(folder: Path, uuid: str, user: int, seconds: float) -> subprocess.Popen[str]:
    home = Path(f"/tmp/mps-hwtest-home-{user}")
    home.mkdir(exist_ok=True)
    os.chown(home, user, user)
    env = {
        **os.environ,
        "HOME": str(home),
        "CUDA_MPS_PIPE_DIRECTORY": CONTAINER_PIPE_DIR,
        "CUDA_VISIBLE_DEVICES": uuid,
    }
    return subprocess.Popen(
        [*container_like(folder, user=user), sys.executable, "-c", HOLDER, str(seconds)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_line(process: subprocess.Popen[str], word: str, *, within: float) -> tuple[str, list[str]]:
    """The first line of ``process`` starting with ``word``, and every line read so far; a client
    that says nothing for ``within`` seconds fails the test instead of hanging it."""
    assert process.stdout is not None
    deadline = time.monotonic() + within
    lines: list[str] = []
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not selector.select(timeout=left):
                break
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip())
            if line.startswith(word):
                return line.rstrip(), lines
    raise AssertionError(f"no {word!r} line from the client within {within:.0f} s: {lines}")


def test_a_multi_user_daemon_serves_clients_of_two_users_at_once() -> None:
    state = Path(tempfile.mkdtemp(prefix="mpsm-", dir="/tmp"))
    root = driver_root()
    backend = NvmlBackend(driver_root=root)
    gpu = next(d for d in backend.discover_sync().devices if d.kind == "gpu")
    daemons = prepare_tools.mps_daemons(backend, state, OPTIONS)
    assert daemons is not None
    folder = daemons.claim_dir(MULTI_CLAIM)
    first = second = None
    try:
        asyncio.run(daemons.start(MULTI_CLAIM, MpsLimits(uuids=(gpu.uuid,), multi_user=True)))
        # User 1000 holds its context; user 2000 is served meanwhile (without -M it would wait until
        # user 1000's server had exited).
        first = holder(folder, gpu.uuid, 1000, 20)
        wait_line(first, "up", within=120)
        second = holder(folder, gpu.uuid, 2000, 0)
        ended, _ = wait_line(second, "end", within=120)
        assert first.poll() is None, "the first user's client ended before the second one was served"
        first_end, _ = wait_line(first, "end", within=60)
        print("second user's client ended", ended, "; first user's", first_end)
        assert float(ended.split()[2]) < float(first_end.split()[2])
        show(folder)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
        fresh = MpsDaemons(
            root=state, control=find_control_tool(root), driver_root=root, env={}, options=OPTIONS
        )
        asyncio.run(fresh.stop(MULTI_CLAIM))
        shutil.rmtree(state, ignore_errors=True)
        remove_parent()
    assert not folder.exists()
