"""MPS: one control daemon per claim, started before prepare returns and stopped at unprepare.

How the daemon runs, and why. NVIDIA's driver renders a Deployment per claim and waits for its pod.
This driver starts ``nvidia-cuda-mps-control -f`` (``-f -M`` for ``multiUser``) from the driver
root as a process of its own session, in a mount namespace of its own whose ``/dev/shm`` is the
claim's shm tmpfs, and in a memory cgroup of its own (``cgroups``): no pod to schedule, no image to
pull and no extra RBAC in the prepare path (the kubelet allows it 45 s), and the claim's containers
get the same pipe and shm folders through the CDI spec. The cgroup, outside the agent's, holds the
daemon and the servers it starts to a memory limit of their own (``--mps-daemon-memory-limit``): a
daemon that outgrows it is OOM-killed alone, never the agent or another claim's daemon. A restart
of the agent's container still ends the daemons it started (they are its processes); the agent then
starts them again from what it recorded, and the CUDA processes that were connected must reconnect
(restart). A restart of the agent process alone (and its upgrade, where the old and the new pod
overlap) keeps them: the new agent finds each daemon by its recorded PID and command line.

Per claim, under ``<state dir>/mps/<claim UID>/`` (``mps_folders`` has the owners and modes):
``pipe/`` (CUDA_MPS_PIPE_DIRECTORY; its ``control`` socket means the daemon is up; read-only in the
containers), ``log/``, ``shm/`` (a tmpfs of ``--mps-shm-size``) and ``daemon.json`` (PID, GPUs,
limits). The limits reach the daemon as NVIDIA's template sends them, as control commands
(``set_default_active_thread_percentage``, ``set_default_device_pinned_mem_limit <uuid> <MiB>M``),
and the containers as environment (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
with the claim's GPUs numbered in PCI bus order, as CUDA numbers a container's GPUs).

Multi-user (``multiUser: true``, NVIDIA's v0.5.0): without it the daemon serves one user at a time,
and a client of another user waits until the first user's server has exited; with it (``-M``)
processes of every user share the daemon. The folders are the same either way: any user may reach
the pipe's socket and write the shm. As NVIDIA's driver, it asks for a Volta or newer GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dra_api.kubeletapi.socketpaths import MAX_SOCKET_PATH_BYTES
from dra_api.quantity import Quantity
from dra_node_agent.device_setup import MpsOptions
from dra_node_agent.devices import ContainerEdits, DiscoveredDevice, Mount, format_quantity
from dra_node_agent.nvidia import mps_folders
from dra_node_agent.nvidia.cgroups import CgroupError, MemoryCgroups
from dra_node_agent.nvidia.discovery import MPS_CONTROL_PATHS
from dra_node_agent.nvidia.gpu_sharing import SharingError, run_tool
from dra_node_agent.nvidia.shares import MEMORY as MEMORY_CAPACITY
from dra_node_agent.nvidia.shares import SHARES as SHARES_CAPACITY
from dra_node_agent.opaqueconfig import MpsConfig

logger = logging.getLogger(__name__)

CONTAINER_PIPE_DIR: Final = "/tmp/nvidia-mps"  # NVIDIA's CDI edits use this path
START_TIMEOUT_SECONDS: Final = 15.0
STOP_TIMEOUT_SECONDS: Final = 10.0
COMMAND_TIMEOUT_SECONDS: Final = 10.0
MIB: Final = 1 << 20
GIB: Final = 1 << 30
MULTI_USER_MIN_COMPUTE_CAPABILITY: Final = 7  # Volta, as NVIDIA's driver asks
# The daemon's launcher: into its cgroup (when it has one), the claim's shm as its /dev/shm, then
# the tool. Paths go as arguments, never into the script.
_LAUNCH: Final = (
    'procs=$1 shm=$2; shift 2; if [ -n "$procs" ]; then echo $$ > "$procs" || exit 125; fi; '
    'mount --bind "$shm" /dev/shm && exec "$@"'
)


class MpsError(SharingError):
    """An MPS daemon that could not be started, configured or stopped; the message says why."""


@dataclass(frozen=True)
class MpsLimits:
    """The daemon-wide settings of one claim: its GPUs (UUIDs, PCI bus order), their limits, and
    whether processes of several users share the daemon."""

    uuids: tuple[str, ...]
    active_thread_percentage: int | None = None
    pinned_memory: Mapping[str, int] = field(default_factory=dict)  # UUID -> bytes
    multi_user: bool = False

    def daemon_args(self) -> list[str]:
        return ["-f", "-M"] if self.multi_user else ["-f"]

    def daemon_commands(self) -> list[str]:
        commands = []
        if self.active_thread_percentage is not None:
            commands.append(f"set_default_active_thread_percentage {self.active_thread_percentage}")
        for uuid in self.uuids:
            if uuid in self.pinned_memory:
                commands.append(
                    f"set_default_device_pinned_mem_limit {uuid} {_mib(self.pinned_memory[uuid])}M"
                )
        return commands

    def container_env(self) -> list[str]:
        env = [f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}"]
        if self.active_thread_percentage is not None:
            env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={self.active_thread_percentage}")
        limits = [
            f"{ordinal}={_mib(self.pinned_memory[uuid])}M"
            for ordinal, uuid in enumerate(self.uuids)
            if uuid in self.pinned_memory
        ]
        if limits:
            env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={','.join(limits)}")
        return env

    def to_json(self) -> dict[str, Any]:
        return {
            "uuids": list(self.uuids),
            "activeThreadPercentage": self.active_thread_percentage,
            "pinnedMemory": dict(self.pinned_memory),
            "multiUser": self.multi_user,
        }

    @staticmethod
    def from_json(raw: Mapping[str, Any]) -> MpsLimits:
        percentage = raw.get("activeThreadPercentage")
        return MpsLimits(
            uuids=tuple(str(u) for u in raw["uuids"]),
            active_thread_percentage=None if percentage is None else int(percentage),
            pinned_memory={str(k): int(v) for k, v in (raw.get("pinnedMemory") or {}).items()},
            multi_user=bool(raw.get("multiUser", False)),
        )


def _mib(value: int) -> int:
    return max(1, -(-value // MIB))  # rounded up: a limit below 1 MiB would mean "no limit"


def _bytes(text: str, where: str) -> int:
    value = Quantity.parse(text).as_int()
    if value is None or value <= 0:
        raise MpsError(f"{where}: {text!r} is not a memory limit of at least one byte")
    return value


def cuda_order(device: DiscoveredDevice) -> tuple[str, tuple[int, ...]]:
    """The order in which CUDA numbers a container's devices: by PCI bus ID, and a GPU's MIG
    devices by GPU and compute instance (``local_id`` is ``<minor>:<gi>:<ci>`` for them)."""
    parts = tuple(int(p) for p in device.local_id.split(":") if p.isdigit())
    return device.pci_bus_id or device.name, parts


def resolve_limits(
    config: MpsConfig,
    gpus: Sequence[DiscoveredDevice],
    *,
    where: str,
    shares: Mapping[str, Mapping[str, int]] | None = None,
) -> MpsLimits:
    """The claim's MPS limits per GPU: per-device entries (by UUID or by the GPU's index on the
    node, as NVIDIA's driver accepts) over the default. A key naming no GPU of the claim is an error.

    On a GPU the claim holds a share of (``shares``: consumed capacity by device name), the share is
    the ceiling: its memory bounds the pinned-memory limit and its part of the GPU's ``shares`` the
    active thread percentage, each the limit when the config sets none; a config asking for more
    than the share is refused."""
    ordered = sorted(gpus, key=cuda_order)
    pinned: dict[str, int] = {}
    fields: dict[str, str] = {}
    if config.default_pinned_device_memory_limit is not None:
        path = f"{where}.defaultPinnedDeviceMemoryLimit"
        default = _bytes(config.default_pinned_device_memory_limit, path)
        pinned = dict.fromkeys((d.uuid for d in ordered), default)
        fields = dict.fromkeys(pinned, path)
    by_key = {d.uuid: d.uuid for d in ordered} | {d.local_id: d.uuid for d in ordered if d.local_id}
    for key, text in (config.default_per_device_pinned_memory_limit or {}).items():
        path = f"{where}.defaultPerDevicePinnedMemoryLimit.{key}"
        uuid = by_key.get(key)
        if uuid is None:
            known = ", ".join(f"{d.local_id} ({d.uuid})" for d in ordered)
            raise MpsError(f"{path}: names no GPU of this claim; its GPUs are {known}")
        pinned[uuid] = _bytes(text, path)
        fields[uuid] = path
    percentage = config.default_active_thread_percentage
    if shares:
        percentage = _within_shares(
            ordered, shares, pinned=pinned, fields=fields, percentage=percentage, where=where
        )
    if config.multi_user:
        _check_multi_user(ordered, where=f"{where}.multiUser")
    return MpsLimits(
        uuids=tuple(d.uuid for d in ordered),
        active_thread_percentage=percentage,
        pinned_memory=pinned,
        multi_user=config.multi_user,
    )


def _within_shares(
    gpus: Sequence[DiscoveredDevice],
    shares: Mapping[str, Mapping[str, int]],
    *,
    pinned: dict[str, int],
    fields: Mapping[str, str],
    percentage: int | None,
    where: str,
) -> int | None:
    """Bound the limits by the claim's shares (``pinned`` is updated); returns the percentage."""
    bound: int | None = None
    for gpu in gpus:
        share = shares.get(gpu.name)
        if share is None:
            continue
        memory = share.get(MEMORY_CAPACITY, 0)
        if memory > 0:  # a share that consumes no memory (unlimited mode) bounds none
            asked = pinned.get(gpu.uuid)
            if asked is not None and asked > memory:
                raise MpsError(
                    f"{fields[gpu.uuid]}: {format_quantity(asked)} on GPU {gpu.local_id} is more than the "
                    f"claim's share of its memory ({format_quantity(memory)}); ask for at most the share"
                )
            pinned.setdefault(gpu.uuid, memory)
        total = gpu.capacity.get(SHARES_CAPACITY, 0)
        taken = share.get(SHARES_CAPACITY, 0)
        if total > 0 and taken > 0:
            part = max(1, min(100, taken * 100 // total))
            bound = part if bound is None else min(bound, part)
    if bound is None or percentage is None:
        return bound if percentage is None else percentage
    if percentage > bound:
        raise MpsError(
            f"{where}.defaultActiveThreadPercentage: {percentage} is more than the claim's share of its "
            f"GPUs' threads ({bound}%, its part of their shares); ask for at most the share"
        )
    return percentage


def _check_multi_user(gpus: Sequence[DiscoveredDevice], *, where: str) -> None:
    """Multi-user MPS needs Volta or newer (NVIDIA's driver refuses it on older GPUs alike)."""
    for gpu in gpus:
        attribute = gpu.attributes.get("cudaComputeCapability")
        major = str(attribute.value).split(".")[0] if attribute is not None else ""
        if major.isdigit() and int(major) < MULTI_USER_MIN_COMPUTE_CAPABILITY:
            raise MpsError(
                f"{where}: multiuser mode was requested but is not supported by GPU {gpu.local_id} "
                f"({gpu.uuid}, compute capability {attribute.value if attribute else '?'}; "
                "Volta (7.0) or newer is needed)"
            )


class MpsDaemons:
    """Starts, finds and stops the per-claim daemons of one driver on this node."""

    def __init__(
        self,
        *,
        root: Path,
        control: Path | None,
        driver_root: Path,
        env: Mapping[str, str],
        socket_path_max: int | None = MAX_SOCKET_PATH_BYTES,
        options: MpsOptions | None = None,
    ) -> None:
        """``socket_path_max`` None: the tool makes no unix sockets (the simulated stand-in)."""
        self.root = root
        self.options = options or MpsOptions()
        self._socket_path_max = socket_path_max
        self._control = control
        self._driver_root = driver_root
        self._env = dict(env)
        self._children: dict[str, asyncio.subprocess.Process] = {}
        self.cgroups = (
            MemoryCgroups(
                cgroup_root=self.options.cgroup_root,
                parent=self.options.cgroup_parent,
                memory_limit=self.options.memory_limit,
            )
            if self.options.cgroup_parent
            else None
        )

    def limits(
        self,
        config: MpsConfig,
        gpus: Sequence[DiscoveredDevice],
        *,
        where: str,
        shares: Mapping[str, Mapping[str, int]],
    ) -> MpsLimits:
        """The claim's limits (``resolve_limits``), for prepare, which knows MPS only as a protocol."""
        return resolve_limits(config, gpus, where=where, shares=shares)

    def claim_dir(self, uid: str) -> Path:
        return self.root / uid

    def edits(self, uid: str, limits: MpsLimits) -> ContainerEdits:
        """What the claim's containers get: the daemon's pipe folder (read-only: they connect to its
        socket, and write nothing where the root daemon writes) and shm tmpfs, and the limits."""
        folder = self.claim_dir(uid)
        return ContainerEdits(
            env=tuple(limits.container_env()),
            mounts=(
                Mount(host_path=str(folder / "pipe"), container_path=CONTAINER_PIPE_DIR, noexec=True),
                Mount(host_path=str(folder / "shm"), container_path="/dev/shm", read_only=False, noexec=True),
            ),
        )

    # --- start -------------------------------------------------------------------------------

    async def start(self, uid: str, limits: MpsLimits) -> None:
        """Start the claim's daemon and send it the limits; on failure nothing of it is left."""
        if self._control is None:
            raise MpsError(
                f"MPS needs nvidia-cuda-mps-control, and the driver root {self._driver_root} has none "
                "(set --driver-root to where the NVIDIA driver is installed)"
            )
        if await asyncio.to_thread(self.running, uid):
            return  # a retried prepare: the daemon of the first attempt is up
        try:
            await self._start(uid, limits)
            await self._send(uid, limits.daemon_commands())
        except BaseException:
            await self.stop(uid)
            raise
        logger.info("MPS control daemon of claim %s started on %s", uid, ", ".join(limits.uuids))

    async def _start(self, uid: str, limits: MpsLimits) -> None:
        assert self._control is not None
        folder = self.claim_dir(uid)
        # The daemon's sockets live in the pipe folder; one path too long for a unix socket and it
        # exits with status 1, saying nothing.
        longest = folder / "pipe" / "control_privileged"
        length = len(os.fsencode(longest))
        if self._socket_path_max is not None and length > self._socket_path_max:
            raise MpsError(
                f"the MPS pipe folder {folder / 'pipe'} is too long a path for the daemon's sockets "
                f"({length} bytes for {longest.name}, at most {self._socket_path_max}): "
                "choose a shorter --state-dir"
            )
        procs = await asyncio.to_thread(self._host_set_up, uid)
        log = folder / "log" / "daemon.out"
        env = {
            **os.environ,
            **self._env,
            "CUDA_VISIBLE_DEVICES": ",".join(limits.uuids),
            "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(folder / "log"),
        }
        # A mount namespace of its own, whose /dev/shm is the claim's tmpfs (the one its containers
        # get): the agent's and the host's /dev/shm stay as they are.
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _LAUNCH, "mps-launch"]
        with log.open("ab") as out:
            process = await asyncio.create_subprocess_exec(
                *command,
                str(procs or ""),
                str(folder / "shm"),
                str(self._control),
                *limits.daemon_args(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,  # outlives the agent process; signalled as a group
            )
        self._children[uid] = process
        record = {"pid": process.pid, "tool": str(self._control), **limits.to_json()}
        await asyncio.to_thread(_write_json, folder / "daemon.json", record)
        await self._wait_up(uid, process)

    def _host_set_up(self, uid: str) -> Path | None:
        """The claim's folders and shm tmpfs, its cgroup (the file the daemon joins it by), and no
        control socket of an earlier daemon (the new one's is the sign it is up). Blocking."""
        folder = self.claim_dir(uid)
        try:
            mps_folders.make(folder, shm_size=self.options.shm_size)
        except OSError as exc:
            hint = (
                " (mounting the claim's shm tmpfs needs CAP_SYS_ADMIN: run the agent privileged, as the "
                "gpu overlay and the chart do)"
                if exc.errno == errno.EPERM
                else ""
            )
            raise MpsError(f"setting up the claim's MPS folders under {folder}: {exc}{hint}") from None
        (folder / "pipe" / "control").unlink(missing_ok=True)
        if self.cgroups is None:
            return None
        try:
            # Whatever the dead daemon left in its cgroup (servers that outlived it) goes first.
            self.cgroups.remove(uid)
            return self.cgroups.create(uid)
        except CgroupError as exc:
            raise MpsError(f"the daemon's cgroup (--mps-cgroup-parent): {exc}") from None

    async def _wait_up(self, uid: str, process: asyncio.subprocess.Process) -> None:
        folder = self.claim_dir(uid)
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        control = folder / "pipe" / "control"
        while not await asyncio.to_thread(control.exists):
            if process.returncode is not None:
                tail = await asyncio.to_thread(_daemon_said, folder)
                raise MpsError(f"MPS control daemon exited with status {process.returncode}: {tail}")
            if time.monotonic() > deadline:
                tail = await asyncio.to_thread(_daemon_said, folder)
                raise MpsError(
                    f"MPS control daemon did not create {control} in {START_TIMEOUT_SECONDS:.0f} s: {tail}"
                )
            await asyncio.sleep(0.05)

    async def _send(self, uid: str, commands: Sequence[str]) -> None:
        """Send control commands through the daemon's client (nvidia-cuda-mps-control, stdin)."""
        if not commands:
            return
        assert self._control is not None
        env = {**self._env, "CUDA_MPS_PIPE_DIRECTORY": str(self.claim_dir(uid) / "pipe")}
        text = "".join(f"{c}\n" for c in commands).encode()
        try:
            status, said = await run_tool(
                [str(self._control)], env=env, deadline=COMMAND_TIMEOUT_SECONDS, stdin=text
            )
        except SharingError as exc:
            raise MpsError(f"the MPS control client: {exc}") from None
        if status != 0:
            raise MpsError(f"the MPS control daemon refused {'; '.join(commands)}: {said}")

    # --- find and stop -----------------------------------------------------------------------

    def running(self, uid: str) -> bool:
        """Whether the claim's daemon runs (its recorded PID is alive with the recorded command and
        its control FIFO is there); blocking."""
        record = _read_json(self.claim_dir(uid) / "daemon.json")
        if record is None or not (self.claim_dir(uid) / "pipe" / "control").exists():
            return False
        return _alive(int(record["pid"]), str(record["tool"]))

    def recorded_limits(self, uid: str) -> MpsLimits | None:
        record = _read_json(self.claim_dir(uid) / "daemon.json")
        return None if record is None else MpsLimits.from_json(record)

    def claims(self) -> list[str]:
        """The claim UIDs with a daemon folder (blocking)."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    async def stop(self, uid: str) -> None:
        """Stop the claim's daemon (``quit``, then SIGTERM, then SIGKILL to its group), end what is
        left in its cgroup, and remove its cgroup and folders. Safe when there is none."""
        folder = self.claim_dir(uid)
        record = await asyncio.to_thread(_read_json, folder / "daemon.json")
        pid = int(record["pid"]) if record else None
        tool = str(record["tool"]) if record else ""
        alive = pid is not None and await asyncio.to_thread(_alive, pid, tool)
        if pid is not None and alive:
            with contextlib.suppress(MpsError, OSError):
                await self._send(uid, ["quit"])
            if not await self._gone(uid, pid, tool, STOP_TIMEOUT_SECONDS / 2):
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, sig)
                    if await self._gone(uid, pid, tool, STOP_TIMEOUT_SECONDS / 4):
                        break
                else:
                    raise MpsError(f"MPS control daemon {pid} of claim {uid} did not stop")
        elif pid is not None:
            await asyncio.to_thread(self._report_death, uid)
        child = self._children.pop(uid, None)
        if child is not None and child.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(child.wait(), 1.0)
        if self.cgroups is not None:
            await asyncio.to_thread(self.cgroups.remove, uid)  # servers that outlived the daemon too
        try:
            await asyncio.to_thread(mps_folders.remove, folder)
        except OSError as exc:
            raise MpsError(f"removing the claim's MPS folders {folder}: {exc}") from None
        if pid is not None:
            logger.info("MPS control daemon of claim %s stopped", uid)

    def _report_death(self, uid: str) -> None:
        """A daemon found dead at stop: say so, and whether its cgroup's memory limit ended it."""
        kills = self.cgroups.oom_kills(uid) if self.cgroups is not None else 0
        if kills:
            logger.warning(
                "MPS control daemon of claim %s had ended before its stop: its cgroup's memory limit "
                "(%d bytes, --mps-daemon-memory-limit) OOM-killed %d of its processes",
                uid,
                self.options.memory_limit,
                kills,
            )
        else:
            logger.warning("MPS control daemon of claim %s had ended before its stop", uid)

    async def _gone(self, uid: str, pid: int, tool: str, within: float) -> bool:
        child = self._children.get(uid)
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if child is not None and child.returncode is not None:
                return True
            if not await asyncio.to_thread(_alive, pid, tool):
                return True
            await asyncio.sleep(0.05)
        return False


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, sort_keys=True))
    temporary.replace(path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: int, tool: str) -> bool:
    """The process exists, is not a zombie, and runs the recorded tool (not a reused PID).

    By name: the path the daemon was started by may not be the one its command line shows (on an
    H200 host, /usr/bin/nvidia-cuda-mps-control ran as /usr/local/nvidia/bin/nvidia-cuda-mps-control),
    and a script stand-in shows its interpreter first.
    """
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    if status.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return any(Path(arg).name == Path(tool).name for arg in argv[:2])


def _daemon_said(folder: Path) -> str:
    """What a failed daemon said: its own output, and its control log (the daemon logs its errors
    there, under CUDA_MPS_LOG_DIRECTORY, and may print nothing)."""
    said = _tail(folder / "log" / "daemon.out")
    logged = _tail(folder / "log" / "control.log")
    parts = [said, f"control.log: {logged}" if logged else ""]
    return "; ".join(p for p in parts if p) or "no output"


def _tail(path: Path) -> str:
    """The last three lines of a file, joined; empty when there are none."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " / ".join(lines[-3:])


def find_control_tool(driver_root: Path) -> Path | None:
    for relative in MPS_CONTROL_PATHS:
        candidate = driver_root / relative
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None
