"""MPS on a real GPU: the claim's control daemon as the agent starts it (its own mount namespace,
the claim's shm folder as /dev/shm), a CUDA client in a namespace like the claim's containers
(the same pipe and shm folders, the limits as environment), the pinned-memory limit enforced, the
daemon outliving the event loop that started it (an agent restart keeps it), and nothing left
after stop. No GPU setting is changed.

Run with the other hardware tests: ``pytest --confcutdir=tests/hardware tests/hardware -s``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dra_node_agent import prepare_tools
from dra_node_agent.nvidia.discovery import NvmlBackend
from dra_node_agent.nvidia.mps import CONTAINER_PIPE_DIR, MpsDaemons, MpsLimits, find_control_tool

CLAIM = "0f3c4b1e-7a52-4d1c-9e0b-5c2d8e6f7a10"
GIB = 1 << 30
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


def run_client(folder: Path, limits: MpsLimits, uuid: str) -> subprocess.CompletedProcess[str]:
    env = dict(e.split("=", 1) for e in limits.container_env())
    print("container environment:", env)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == CONTAINER_PIPE_DIR
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(folder / "pipe")  # where the container's mount comes from
    # As in the claim's containers: the claim's shm folder is /dev/shm.
    script = 'mount --bind "$0" /dev/shm && exec "$@"'
    namespace = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    return subprocess.run(
        [*namespace, str(folder / "shm"), sys.executable, "-c", CLIENT],
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
    daemons = prepare_tools.mps_daemons(backend, state)
    folder = daemons.claim_dir(CLAIM)

    async def serve() -> None:
        await daemons.start(CLAIM, limits)
        up = daemons.running(CLAIM)
        show(folder)
        assert up, "the daemon is not running right after start"
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

    try:
        asyncio.run(serve())
        # The loop that started it has ended, as an agent's does when it restarts.
        outlived = daemons.running(CLAIM)
        print("running after its event loop ended:", outlived)
        assert outlived
    finally:
        fresh = MpsDaemons(root=state, control=find_control_tool(root), driver_root=root, env={})
        asyncio.run(fresh.stop(CLAIM))
    assert not fresh.running(CLAIM)
    assert not folder.exists()
    left = subprocess.run(["pgrep", "-af", "nvidia-cuda-mps"], capture_output=True, text=True).stdout
    print("MPS processes left:", left or "none")
    assert str(folder) not in left
