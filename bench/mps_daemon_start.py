"""What containing an MPS daemon costs: start and stop of one claim's daemon (the simulated node's
stand-in) as the agent does them, with its shm tmpfs and memory cgroup, and with the cgroup left
out (``--mps-cgroup-parent=""``), alternating, in one process. Needs root (tmpfs, cgroups).

    .venv/bin/python -m bench.mps_daemon_start [--rounds 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from dra_node_agent.device_setup import MpsOptions
from dra_node_agent.nvidia.cgroups import Hierarchy
from dra_node_agent.nvidia.mps import MpsDaemons, MpsLimits
from dra_node_agent.simulated.host_tools import install_simulated_mps_control

PARENT = f"accel-dra-bench-{os.getpid()}"
LIMITS = MpsLimits(uuids=("GPU-bench",), active_thread_percentage=50)


async def start_stop(daemons: MpsDaemons, uid: str) -> tuple[float, float]:
    began = time.perf_counter()
    await daemons.start(uid, LIMITS)
    started = time.perf_counter()
    await daemons.stop(uid)
    return started - began, time.perf_counter() - started


def describe(what: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return (
        f"{what:<34} p50 {statistics.median(ms):7.2f} ms   mean {statistics.fmean(ms):7.2f} ms   n={len(ms)}"
    )


async def bench(folder: Path, rounds: int) -> None:
    tool = folder / "driver" / "nvidia-cuda-mps-control"
    install_simulated_mps_control(tool)
    kinds = {
        "in a cgroup of its own": MpsOptions(shm_size=64 << 20, memory_limit=256 << 20, cgroup_parent=PARENT),
        "in the agent's cgroup": MpsOptions(shm_size=64 << 20, memory_limit=256 << 20, cgroup_parent=""),
    }
    daemons = {
        kind: MpsDaemons(
            root=folder / "mps",
            control=tool,
            driver_root=tool.parent,
            env={},
            socket_path_max=None,
            options=o,
        )
        for kind, o in kinds.items()
    }
    samples: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
    for round_ in range(rounds + 3):
        for kind, each in daemons.items():
            took = await start_stop(each, f"claim-{round_}")
            if round_ >= 3:  # warm-up rounds left out
                samples[kind].append(took)
    print(f"one MPS claim's daemon (simulated stand-in), start and stop, {rounds} rounds each")
    for kind, pairs in samples.items():
        print(describe(f"start, {kind}", [p[0] for p in pairs]))
        print(describe(f"stop, {kind}", [p[1] for p in pairs]))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="mpsb-", dir="/tmp"))
    try:
        asyncio.run(bench(folder, args.rounds))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        hierarchy = Hierarchy.detect(Path("/sys/fs/cgroup"))
        if hierarchy is not None and (hierarchy.root / PARENT).is_dir():
            (hierarchy.root / PARENT).rmdir()


if __name__ == "__main__":
    main()
