"""The node agent's configuration: one ``Settings`` dataclass, loaded from flags and ``DRA_AGENT_*`` env.

Every field carries its help text, its flag and its environment variable in the dataclass metadata,
so ``dra-node-agent run --help`` is generated from this one place and reads as a configuration
reference. Precedence: command-line flag, then environment, then the default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dra_api.kubeletapi.socketpaths import MAX_SOCKET_PATH_BYTES, longest_socket_path, path_bytes
from dra_api.names import GPU_DRIVER, TPU_DRIVER
from dra_api.quantity import Quantity
from dra_node_agent.discovery_config import consumable_shares

ENV_PREFIX: Final = "DRA_AGENT_"
BACKENDS: Final = ("nvidia", "tpu")
AUTO: Final = "auto"


class SettingsError(ValueError):
    """A flag or environment variable has an unusable value."""


def _opt(
    help: str,
    *,
    env: tuple[str, ...] = (),
    metavar: str | None = None,
) -> dict[str, Any]:
    return {"help": help, "env": env, "metavar": metavar}


@dataclass(frozen=True)
class Settings:
    """What one node agent needs to know; see ``dra-node-agent run --help`` for each field."""

    node_name: str = field(
        default="",
        metadata=_opt(
            "Name of the Node object this agent serves; its pool and ResourceSlices carry this name "
            "(set it from the downward API: spec.nodeName).",
            env=("NODE_NAME",),
            metavar="NAME",
        ),
    )
    kubeconfig: str | None = field(
        default=None,
        metadata=_opt(
            "Kubeconfig file for the API server; unset means the in-cluster ServiceAccount.",
            env=("KUBECONFIG",),
            metavar="PATH",
        ),
    )
    backends: tuple[str, ...] = field(
        default=(AUTO,),
        metadata=_opt(
            "Device backends to enable, comma-separated: 'nvidia', 'tpu', or 'auto' (each one whose "
            "hardware is present). Ignored with --simulate-profile.",
            metavar="LIST",
        ),
    )
    simulate_profile: tuple[str, ...] = field(
        default=(),
        metadata=_opt(
            "Publish simulated devices instead of discovering hardware: built-in profile names (e.g. "
            "h100-80gb-x8, tpu-v6e-2x4; nic-sim-h100-x4, a simulated NIC driver for tests) or profile "
            "YAML paths, comma-separated, at most one per driver.",
            metavar="NAME|PATH",
        ),
    )
    gpu_driver_name: str = field(
        default=GPU_DRIVER,
        metadata=_opt(
            "DRA driver name for NVIDIA GPUs (ResourceSlices, sockets, CDI vendor).", metavar="NAME"
        ),
    )
    tpu_driver_name: str = field(
        default=TPU_DRIVER,
        metadata=_opt(
            "DRA driver name for Google TPUs (ResourceSlices, sockets, CDI vendor).", metavar="NAME"
        ),
    )
    tpu_env_file: str = field(
        default="",
        metadata=_opt(
            "Cloud TPU tpu-env file (lines KEY: 'value'): the slice's TOPOLOGY, this host's WORKER_ID and "
            "the slice's identity (SLICE_ID, else NODE_ID), published as the sliceId and workerId "
            "attributes. Unset: /etc/tpu/tpu-env on TPU hardware, none with --simulate-profile (a "
            "simulated host of a multi-host slice is given its own file).",
            env=("TPU_ENV_FILE",),
            metavar="PATH",
        ),
    )
    kubelet_registry_dir: Path = field(
        default=Path("/var/lib/kubelet/plugins_registry"),
        metadata=_opt(
            "Kubelet's plugin registration folder, where the registration sockets go.", metavar="DIR"
        ),
    )
    kubelet_plugins_dir: Path = field(
        default=Path("/var/lib/kubelet/plugins"),
        metadata=_opt(
            "Kubelet's plugins folder; each driver's DRA socket goes in <DIR>/<driver>/.", metavar="DIR"
        ),
    )
    cdi_dir: Path = field(
        default=Path("/var/run/cdi"),
        metadata=_opt("Folder for the per-claim CDI spec files the container runtime reads.", metavar="DIR"),
    )
    state_dir: Path = field(
        default=Path("/var/lib/accel-dra"),
        metadata=_opt(
            "Folder for the agent's state: each driver's prepared-claims checkpoint in "
            "<DIR>/<driver>/, and the fake hardware trees of simulated profiles. It must survive "
            "agent restarts (a hostPath).",
            metavar="DIR",
        ),
    )
    sysfs_root: Path = field(
        default=Path("/sys"),
        metadata=_opt("Where the host's sysfs is mounted (PCI topology, TPU chips).", metavar="DIR"),
    )
    dev_root: Path = field(
        default=Path("/dev"),
        metadata=_opt("Where the host's /dev is mounted (device nodes for CDI specs).", metavar="DIR"),
    )
    proc_root: Path = field(
        default=Path("/proc"),
        metadata=_opt("Where the host's /proc is mounted (MIG capability minors, boot ID).", metavar="DIR"),
    )
    driver_root: Path = field(
        default=Path("/"),
        metadata=_opt(
            "Root of the NVIDIA driver installation (e.g. /run/nvidia/driver for a containerised "
            "driver); NVML is loaded from there, and GPU claims' CDI specs mount the driver's "
            "libraries and tools found there.",
            metavar="DIR",
        ),
    )
    host_driver_root: Path = field(
        default=Path("/"),
        metadata=_opt(
            "The same driver root as the container runtime sees it on the host (the hostPath that "
            "--driver-root is mounted from): the host side of the CDI specs' driver mounts.",
            metavar="DIR",
        ),
    )
    nvidia_cdi_hook_path: str = field(
        default="",
        metadata=_opt(
            "Host path of NVIDIA's nvidia-cdi-hook (NVIDIA container toolkit): GPU claims' CDI specs "
            "then run its create-symlinks and update-ldcache hooks, as NVIDIA's generated specs do. "
            "Unset: no hook, each driver library is also mounted at the names that link to it "
            "(docs/install.md).",
            metavar="PATH",
        ),
    )
    metrics_address: str = field(
        default=":8081",
        metadata=_opt(
            "Address for the Prometheus /metrics endpoint; empty disables it.", metavar="HOST:PORT"
        ),
    )
    resync_interval: float = field(
        default=300.0,
        metadata=_opt(
            "Seconds between full re-discovery and ResourceSlice reconciliation, beside the watch on "
            "the agent's own slices.",
            metavar="SECONDS",
        ),
    )
    slice_resync_delay: float = field(
        default=1.0,
        metadata=_opt(
            "Seconds to wait after a change to the agent's ResourceSlices (e.g. one deleted by "
            "someone else) before reconciling them, so bursts of events cause one pass.",
            metavar="SECONDS",
        ),
    )
    claim_read_timeout: float = field(
        default=10.0,
        metadata=_opt(
            "Seconds one GET of a claim at NodePrepareResources may take before it is given up and "
            "retried; with --claim-read-attempts it must fit the kubelet's 45 s deadline for the call.",
            metavar="SECONDS",
        ),
    )
    claim_read_attempts: int = field(
        default=3,
        metadata=_opt(
            "How many times a claim GET that timed out or met a connection error, 429 or 5xx is tried.",
            metavar="N",
        ),
    )
    api_request_timeout: float = field(
        default=30.0,
        metadata=_opt(
            "Seconds any other API request of the slice publisher (list, create, update, delete) may "
            "take; a stalled one fails and the pass is retried.",
            metavar="SECONDS",
        ),
    )
    watch_inactivity_timeout: float = field(
        default=70.0,
        metadata=_opt(
            "Seconds the ResourceSlice watch may stay silent (no event, no bookmark: the API server "
            "sends one about every minute) before it is dropped and the agent lists again.",
            metavar="SECONDS",
        ),
    )
    mps_support: bool = field(
        default=True,
        metadata=_opt(
            "Carry out GpuConfig sharing.strategy MPS: a control daemon per claim, started at prepare "
            "(false: such claims fail at prepare, saying MPS is off).",
            metavar="BOOL",
        ),
    )
    mps_shm_size: str = field(
        default="1Gi",
        metadata=_opt(
            "Size of each MPS claim's /dev/shm, a tmpfs its containers and its daemon share (NVIDIA's "
            "MpsConfig has no field for it); a write past it fails with ENOSPC, and the node's disk is "
            "never used. A Kubernetes quantity of at least 1Mi.",
            metavar="QUANTITY",
        ),
    )
    mps_daemon_memory_limit: str = field(
        default="1Gi",
        metadata=_opt(
            "Memory limit of each MPS claim's cgroup, which holds its control daemon and the servers "
            "that daemon starts; past it the kernel OOM-kills in that cgroup only, never the agent or "
            "another claim's daemon. A Kubernetes quantity of at least 16Mi.",
            metavar="QUANTITY",
        ),
    )
    mps_cgroup_parent: str = field(
        default="accel-dra-mps",
        metadata=_opt(
            "The cgroup, relative to the root of the node's hierarchy (see --cgroup-root), under which "
            "each MPS claim's daemon gets a cgroup of its own, outside the agent's. Empty keeps the "
            "daemons in the agent's cgroup, sharing its memory limit (not for shared nodes).",
            metavar="PATH",
        ),
    )
    cgroup_root: Path = field(
        default=Path("/sys/fs/cgroup"),
        metadata=_opt(
            "Where the node's cgroup file system is mounted: a cgroup v2 root, or the folder holding "
            "the v1 hierarchies (its memory/ is used). A privileged container on cgroup v2 sees the "
            "node's whole hierarchy there.",
            metavar="DIR",
        ),
    )
    dynamic_mig: bool = field(
        default=False,
        metadata=_opt(
            "Dynamic MIG (NVIDIA's DynamicMIG gate): a MIG-enabled GPU publishes every placement of every "
            "GPU-instance profile and a counter set, and the instance a claim was allocated is created at "
            "prepare and destroyed at unprepare (false: only the MIG devices that exist are published).",
            metavar="BOOL",
        ),
    )
    passthrough_support: bool = field(
        default=False,
        metadata=_opt(
            "GPU passthrough to virtual machines (NVIDIA's PassthroughSupport gate): every GPU the NVIDIA "
            "driver holds without MIG devices is also published as gpu-vfio-<index> (type vfio); a "
            "claim for one binds the GPU to vfio-pci at prepare and gives its container the IOMMU "
            "group's device nodes, and unprepare gives it back to the NVIDIA driver. Needs the IOMMU "
            "on, vfio-pci loaded and a privileged agent (on real GPUs, for now, --health-enabled=false: the "
            "monitor's NVML session holds the GPUs); not with --dynamic-mig or --consumable-shares.",
            metavar="BOOL",
        ),
    )
    consumable_shares: str = field(
        default="disabled",
        metadata=_opt(
            "Share whole GPUs between claims (NVIDIA's ConsumableShares; MIG devices serve one claim "
            "each): 'memory' publishes GPUs with allowMultipleAllocations and a request policy on "
            "their memory, each claim taking the whole memory unless it asks for less "
            "(capacity.requests.memory, in steps of 1Mi); 'unlimited' the same, a claim taking no "
            "memory unless it asks; a number N (1 to 1000000) adds a capacity 'shares' of N, each "
            "claim taking 1 unless it asks for more. 'disabled': every device serves one claim. Not "
            "with --passthrough-support.",
            env=("CONSUMABLE_SHARES",),
            metavar="MODE",
        ),
    )
    health_enabled: bool = field(
        default=True,
        metadata=_opt(
            "Watch device health (NVML events and polls, TPU presence): taint unhealthy devices in "
            "the ResourceSlice, report them on the kubelet's health stream and as metrics and Events.",
            metavar="BOOL",
        ),
    )
    health_poll_interval: float = field(
        default=10.0,
        metadata=_opt(
            "Seconds between health polls (ECC, row remapping, temperature, presence).", metavar="SECONDS"
        ),
    )
    health_recovery_period: float = field(
        default=300.0,
        metadata=_opt(
            "Seconds a device must stay free of problems before its taint is removed; no restart needed.",
            metavar="SECONDS",
        ),
    )
    health_taint_effect: str = field(
        default="NoSchedule",
        metadata=_opt(
            "Effect of the taints on unhealthy devices: NoSchedule (keep running pods) or NoExecute "
            "(also evict pods using the device).",
            metavar="EFFECT",
        ),
    )
    additional_xids_to_ignore: str = field(
        default="",
        metadata=_opt(
            "Comma-separated XIDs that are application errors, not device faults, beyond the built-in "
            "13, 31, 43, 45, 68, 109 (same name as NVIDIA's driver).",
            metavar="LIST",
            env=("ADDITIONAL_XIDS_TO_IGNORE",),
        ),
    )
    instance: str = field(
        default="",
        metadata=_opt(
            "Per-instance suffix for socket names, so two agent pods can overlap during a rolling "
            "update with maxSurge (kubelet 1.33+ uses the newest registration); the DaemonSet sets "
            "POD_UID. Empty uses the fixed names, which a restarted agent reuses.",
            env=("POD_UID",),
            metavar="ID",
        ),
    )
    max_prepared_claims: int = field(
        default=1024,
        metadata=_opt(
            "Most claims of one driver prepared on this node at once (its checkpoint's entries); a "
            "claim beyond it fails at prepare with a message saying so, and the kubelet retries.",
            metavar="N",
        ),
    )
    compute_domains: bool = field(
        default=False,
        metadata=_opt(
            "Serve NVIDIA's compute-domain driver (compute-domain.nvidia.com) beside the GPU driver: "
            "IMEX channel and daemon devices for ComputeDomains, and the node's nvidia.com/gpu.clique "
            "label. Needs the operator's --compute-domains and the ComputeDomain CRDs.",
        ),
    )
    compute_domain_namespace: str = field(
        default="",
        metadata=_opt(
            "Namespace of the ComputeDomains' IMEX daemons and their cliques (the operator's "
            "--compute-domain-namespace); only daemon claims of this namespace are prepared. Empty: "
            "the agent's own (POD_NAMESPACE), else accel-dra.",
            metavar="NAMESPACE",
        ),
    )
    compute_domain_imex_mode: str = field(
        default="driverManaged",
        metadata=_opt(
            "driverManaged (a ComputeDomain's daemon pods run IMEX) or hostManaged (the host runs "
            "nvidia-imex; no daemon devices, channel prepares ask the host's daemon), as the operator's.",
            metavar="MODE",
        ),
    )
    imex_host_socket: str = field(
        default="/etc/nvidia-imex/imex_ctrl.sock",
        metadata=_opt(
            "With hostManaged IMEX: the host daemon's command socket (its IMEX_CMD_UNIX_DOMAIN_PATH), "
            "which nvidia-imex-ctl from the driver root asks for READY.",
            metavar="PATH",
        ),
    )
    compute_domain_ready_timeout: float = field(
        default=40.0,
        metadata=_opt(
            "Seconds a channel claim's prepare waits for its domain's IMEX daemon on this node to be "
            "ready before it answers the kubelet with an error the kubelet retries (within its 45 s).",
            metavar="SECONDS",
        ),
    )
    nvlink_fabric_strict: bool = field(
        default=True,
        metadata=_opt(
            "An NVLink fabric whose registration did not complete, or failed, keeps the compute-domain "
            "driver from publishing (NVIDIA's CrashOnNVLinkFabricErrors); false counts such GPUs as "
            "having no clique.",
        ),
    )
    gpu_clique_label: bool = field(
        default=True,
        metadata=_opt(
            "Keep the node's nvidia.com/gpu.clique label (its NVLink clique ID), which pod affinity "
            "uses to keep a job inside one NVLink domain.",
        ),
    )
    log_level: str = field(
        default="INFO",
        metadata=_opt("Log level: DEBUG, INFO, WARNING or ERROR.", metavar="LEVEL"),
    )

    def checkpoint_dir(self, *, driver: str) -> Path:
        """The folder holding ``driver``'s checkpoint."""
        return self.state_dir / driver

    def compute_domain_namespace_name(self) -> str:
        """Where the ComputeDomains' daemons live."""
        return self.compute_domain_namespace or os.environ.get("POD_NAMESPACE") or "accel-dra"

    def driver_names(self) -> dict[str, str]:
        """Backend kind -> DRA driver name."""
        return {"nvidia": self.gpu_driver_name, "tpu": self.tpu_driver_name}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_names(f: dataclasses.Field[Any]) -> tuple[str, ...]:
    """Environment variables for a field: DRA_AGENT_<FIELD> first, then its conventional aliases."""
    aliases: tuple[str, ...] = f.metadata.get("env", ())
    return (ENV_PREFIX + f.name.upper(), *aliases)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per Settings field; the help names its environment variables and default."""
    for f in dataclasses.fields(Settings):
        default = f.default
        shown = ",".join(default) if isinstance(default, tuple) else default
        if shown is None or shown == "":
            shown = "unset"
        envs = " or ".join(f"${e}" for e in env_names(f))
        parser.add_argument(
            _flag(f.name),
            dest=f.name,
            default=None,
            metavar=f.metadata.get("metavar"),
            help=f"{f.metadata['help']} Env: {envs}. Default: {shown!s}.",
        )


def _convert(name: str, raw: str, *, default: Any) -> Any:
    if name == "kubeconfig":
        return raw or None
    if isinstance(default, bool):
        lowered = raw.strip().lower()
        if lowered not in ("true", "false", "1", "0", "yes", "no"):
            raise SettingsError(f"setting {name}: {raw!r} is not true or false")
        return lowered in ("true", "1", "yes")
    if isinstance(default, Path):
        return Path(raw)
    if isinstance(default, float):
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"setting {name}: {raw!r} is not a number") from None
        if value <= 0:
            raise SettingsError(f"setting {name}: must be greater than 0, not {raw}")
        return value
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise SettingsError(f"setting {name}: {raw!r} is not an integer") from None
    if isinstance(default, tuple):
        return tuple(item.strip() for item in raw.split(",") if item.strip())
    return raw


def load_settings(
    *, args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Settings from parsed flags (those left unset fall back to env, then to the defaults)."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        raw: str | None = getattr(args, f.name, None) if args is not None else None
        if raw is None:
            raw = next((env[e] for e in env_names(f) if e in env), None)
        if raw is not None:
            values[f.name] = _convert(f.name, raw, default=f.default)
    settings = Settings(**values)
    validate(settings)
    return settings


def validate(settings: Settings) -> None:
    """Reject settings the agent cannot run with, naming the field."""
    if not settings.node_name:
        raise SettingsError(
            "setting node_name is empty: pass --node-name or set NODE_NAME (downward API spec.nodeName)"
        )
    if not settings.simulate_profile:
        unknown = [b for b in settings.backends if b not in (*BACKENDS, AUTO)]
        if unknown or not settings.backends:
            raise SettingsError(
                f"setting backends: {','.join(settings.backends) or 'empty'} is not a list of "
                f"{', '.join((*BACKENDS, AUTO))}"
            )
    if settings.gpu_driver_name == settings.tpu_driver_name:
        raise SettingsError(
            f"settings gpu_driver_name and tpu_driver_name are both {settings.gpu_driver_name!r}"
        )
    if settings.health_taint_effect not in ("NoSchedule", "NoExecute"):
        raise SettingsError(
            f"setting health_taint_effect: {settings.health_taint_effect!r} is not NoSchedule or NoExecute"
        )
    bad_xids = [
        x for x in settings.additional_xids_to_ignore.split(",") if x.strip() and not x.strip().isdigit()
    ]
    if bad_xids:
        raise SettingsError(
            f"setting additional_xids_to_ignore: {bad_xids[0].strip()!r} is not a non-negative integer"
        )
    if settings.metrics_address:
        from dra_node_agent.http_endpoints import split_address

        try:
            _, port = split_address(settings.metrics_address)
        except ValueError as exc:
            raise SettingsError(f"setting metrics_address: {exc}") from None
        if port > 65535:
            raise SettingsError(f"setting metrics_address: port {port} is not a port number (0-65535)")
    _check_socket_paths(settings)
    if settings.nvidia_cdi_hook_path and not settings.nvidia_cdi_hook_path.startswith("/"):
        raise SettingsError(
            f"setting nvidia_cdi_hook_path: {settings.nvidia_cdi_hook_path!r} is not an absolute path"
        )
    if not settings.host_driver_root.is_absolute():
        raise SettingsError(
            f"setting host_driver_root: {str(settings.host_driver_root)!r} is not an absolute path"
        )
    if settings.max_prepared_claims < 1:
        raise SettingsError(f"setting max_prepared_claims: {settings.max_prepared_claims} is less than 1")
    _check_mps(settings)
    if settings.passthrough_support and settings.dynamic_mig:
        # As NVIDIA's gates: a GPU's MIG placements and its passthrough device would share nothing
        # the scheduler could see, so both would be given out at once.
        raise SettingsError("settings passthrough_support and dynamic_mig cannot both be on")
    try:
        shares = consumable_shares(settings.consumable_shares)
    except ValueError as exc:
        raise SettingsError(f"setting consumable_shares: {exc}") from None
    if settings.passthrough_support and shares is not None:
        # A shared GPU holds claims of several namespaces at once, and passthrough hands the GPU whole
        # to one VM: each would keep the other off the GPU, with nothing the scheduler could see.
        raise SettingsError("settings passthrough_support and consumable_shares cannot both be on")
    if settings.claim_read_attempts < 1:
        raise SettingsError(f"setting claim_read_attempts: {settings.claim_read_attempts} is less than 1")
    if settings.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise SettingsError(f"setting log_level: {settings.log_level!r} is not DEBUG, INFO, WARNING or ERROR")
    if settings.compute_domain_imex_mode not in ("driverManaged", "hostManaged"):
        raise SettingsError(
            f"setting compute_domain_imex_mode: {settings.compute_domain_imex_mode!r} is not driverManaged "
            "or hostManaged"
        )
    if not 0 <= settings.compute_domain_ready_timeout <= 44:
        raise SettingsError(
            f"setting compute_domain_ready_timeout: {settings.compute_domain_ready_timeout:g} is not between "
            "0 and 44 seconds (the kubelet gives a prepare call 45 s)"
        )


MPS_SHM_SIZE_MIN: Final = 1 << 20
# Names that do not start with a dot (so never '..'), joined by '/'.
_CGROUP_PATH: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
MPS_DAEMON_MEMORY_MIN: Final = 16 << 20


def quantity_bytes(name: str, raw: str, *, least: int) -> int:
    """A setting's Kubernetes quantity in bytes, at least ``least``; SettingsError naming it."""
    try:
        value = Quantity.parse(raw).as_int()
    except ValueError:
        value = None
    if value is None or value < least:
        raise SettingsError(f"setting {name}: {raw!r} is not a quantity of at least {least} bytes")
    return value


def _check_mps(settings: Settings) -> None:
    quantity_bytes("mps_shm_size", settings.mps_shm_size, least=MPS_SHM_SIZE_MIN)
    quantity_bytes("mps_daemon_memory_limit", settings.mps_daemon_memory_limit, least=MPS_DAEMON_MEMORY_MIN)
    parent = settings.mps_cgroup_parent
    if parent and not _CGROUP_PATH.fullmatch(parent):
        raise SettingsError(
            f"setting mps_cgroup_parent: {parent!r} is not a relative cgroup path (names of letters, "
            "digits, '.', '_' and '-', joined by '/')"
        )


def _check_socket_paths(settings: Settings) -> None:
    """Every socket the agent will bind fits a unix socket path, or the folder that makes it too
    long is named: a kubelet whose --root-dir is deep leaves less room than /var/lib/kubelet."""
    drivers = settings.driver_names().values()
    instance = settings.instance or None
    for name, registry, plugins in (
        ("kubelet_registry_dir", settings.kubelet_registry_dir, Path("/")),
        ("kubelet_plugins_dir", Path("/"), settings.kubelet_plugins_dir),
    ):
        longest = longest_socket_path(
            drivers=drivers, registry_dir=registry, plugins_dir=plugins, instance=instance
        )
        if path_bytes(longest) > MAX_SOCKET_PATH_BYTES:
            raise SettingsError(
                f"setting {name}: the socket {longest} would be {path_bytes(longest)} bytes, more than the "
                f"{MAX_SOCKET_PATH_BYTES} a unix socket path may have; choose a shorter {_flag(name)}"
            )


WRITTEN_FOLDERS: Final = ("state_dir", "cdi_dir", "kubelet_plugins_dir", "kubelet_registry_dir")


def check_folders(settings: Settings) -> None:
    """Reject a folder the agent writes that it could neither create nor write, naming the field.
    Nothing is created here: the nearest existing folder on the path must be writable. Without
    this check the agent would fail only after logging in, at its first checkpoint or socket."""
    for name in WRITTEN_FOLDERS:
        path: Path = getattr(settings, name)
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise SettingsError(f"setting {name}: {path}: {existing} is not a folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise SettingsError(f"setting {name}: {path}: {existing} is not writable")


def describe(settings: Settings) -> Sequence[str]:
    """``name=value`` lines for the start-up log."""
    return [f"{f.name}={getattr(settings, f.name)}" for f in dataclasses.fields(Settings)]
