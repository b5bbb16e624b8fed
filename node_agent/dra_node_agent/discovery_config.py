"""What the agent's settings decide about discovery, as every vendor's record reads it.

Each vendor's record (``vendor_record``) builds its discovery backends from a ``DiscoveryConfig``;
``discovery.detect`` asks every record which of them run on this node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from dra_api.names import GPU_DRIVER, TPU_DRIVER

AUTO: Final = "auto"
BACKEND_CHOICES: Final = (AUTO, "nvidia", "tpu")
SHARES_DISABLED: Final = "disabled"
SHARES_MODES: Final = ("memory", "unlimited")
# More shares of one GPU than claims one node's checkpoint could ever hold means nothing.
MAX_SHARES: Final = 1_000_000


def consumable_shares(text: str) -> str | int | None:
    """``--consumable-shares`` as NVIDIA's driver reads it: None for ``disabled`` (or empty),
    ``memory``, ``unlimited``, or a number of shares per GPU. ValueError names what is wrong."""
    value = text.strip()
    if value in ("", SHARES_DISABLED):
        return None
    if value in SHARES_MODES:
        return value
    if value.isdigit() and 0 < int(value) <= MAX_SHARES:
        return int(value)
    raise ValueError(
        f"{text!r} is not 'disabled', 'memory', 'unlimited' or a number of shares from 1 to {MAX_SHARES}"
    )


@dataclass(frozen=True)
class DiscoveryConfig:
    """What the agent's Settings decide about discovery.

    node_name: this node; seeds simulated and TPU UUIDs.
    backends: "auto" (detect), or any of "nvidia", "tpu" to force them on.
    simulated_profiles: profile names or paths; when set, only simulated backends run (at most one
        per driver: GPU, TPU, and the simulated NIC driver a `nic:` profile names).
    gpu_driver / tpu_driver: the driver names devices are published under.
    driver_root: where the NVIDIA driver's files live (/run/nvidia/driver for a containerised driver).
    host_driver_root: the same as the container runtime sees it (the host side of CDI driver mounts).
    cdi_hook_path: the host's nvidia-cdi-hook, for NVIDIA's hooks in GPU specs; None for none.
    dev_root / sysfs_root / proc_root: the host's /dev, /sys and /proc as the agent sees them.
    host_dev_dir: the host's /dev as the container runtime sees it (device paths in CDI specs).
    tpu_topology: the TPU slice topology when the host does not say (e.g. "4x4x4" for a multi-host slice).
    tpu_env_path: the Cloud TPU `tpu-env` file (simulated TPU hosts read it too); None to ignore.
    simulation_dir: where simulated fake trees are written (a temporary directory if None).
    dynamic_mig: MIG-enabled GPUs publish their placements, instances made at prepare.
    passthrough: GPUs are also published for passthrough (``gpu-vfio-<index>``).
    consumable_shares: GPUs and MIG devices publish as shares (``consumable_shares`` says how).
    compute_domains: NVIDIA's compute-domain driver runs beside the GPU driver (channel and
        daemon devices, the node's NVLink clique).
    imex_host_managed: the hosts run nvidia-imex themselves (no daemon devices).
    strict_fabric: an NVLink fabric whose registration did not complete (or failed) stops the
        compute-domain driver from publishing, rather than counting as no clique.
    """

    node_name: str
    backends: tuple[str, ...] = (AUTO,)
    simulated_profiles: tuple[str, ...] = ()
    gpu_driver: str = GPU_DRIVER
    tpu_driver: str = TPU_DRIVER
    driver_root: str = "/"
    host_driver_root: str = "/"
    cdi_hook_path: str | None = None
    dev_root: str = "/dev"
    dynamic_mig: bool = False
    passthrough: bool = False
    sysfs_root: str = "/sys"
    proc_root: str = "/proc"
    host_dev_dir: str = "/dev"
    tpu_topology: str | None = None
    tpu_env_path: str | None = "/etc/tpu/tpu-env"
    simulation_dir: str | None = None
    consumable_shares: str = SHARES_DISABLED
    compute_domains: bool = False
    imex_host_managed: bool = False
    strict_fabric: bool = True

    def __post_init__(self) -> None:
        consumable_shares(self.consumable_shares)  # ValueError for a value no backend could use
        unknown = [b for b in self.backends if b not in BACKEND_CHOICES]
        if unknown:
            raise ValueError(
                f"discovery backends: unknown backend {unknown[0]!r} (choose from {BACKEND_CHOICES})"
            )

    def selects(self, backend: str, *, detected: Callable[[], bool]) -> bool:
        """Whether ``backend`` ("nvidia", "tpu") runs here: forced on by name, or with "auto" when
        ``detected()`` finds its hardware (blocking; called only then)."""
        return backend in self.backends or (AUTO in self.backends and detected())
