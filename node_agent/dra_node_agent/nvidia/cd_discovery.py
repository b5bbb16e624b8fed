"""The devices of NVIDIA's compute-domain driver (``compute-domain.nvidia.com``) on this node.

As NVIDIA's plugin publishes them: one pool per node with ``channel-0`` (``type=channel``,
``id=0``) and ``daemon-0`` (``type=daemon``, ``id=0``; none when the hosts run IMEX themselves).
Channels 1 to 2047 are never published: a channel claim in allocationMode All gets every channel
injected, and channel 0 is held by one claim at a time, so a node serves one ComputeDomain at a time.

Discovery also learns what a prepare needs from the node (``NodeFabric``): the NVLink clique
(``fabric``), the major number of IMEX channel devices and of NVIDIA's capability devices from
``/proc/devices``, the ``fabric-imex-mgmt`` capability an IMEX daemon needs, and the driver's files
(``nvidia-imex`` and ``nvidia-imex-ctl`` among them) that a daemon's container gets mounted.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pynvml

from dra_api import computedomains as cd
from dra_node_agent.devices import (
    ContainerEdits,
    DeviceNode,
    DiscoveredDevice,
    DiscoveredInventory,
    int_attr,
    string_attr,
)
from dra_node_agent.nvidia.driver_files import scan_driver_root
from dra_node_agent.nvidia.fabric import FabricError, read_clique_id
from dra_node_agent.nvidia.mig_discovery import text

log = logging.getLogger(__name__)

IMEX_CHANNELS_DEVICE: Final = "nvidia-caps-imex-channels"
CAPS_DEVICE: Final = "nvidia-caps"
IMEX_MGMT_CAPABILITY: Final = "driver/nvidia/capabilities/fabric-imex-mgmt"
CHANNEL_DIR: Final = "/dev/nvidia-caps-imex-channels"


def device_major(proc_root: Path, name: str) -> int | None:
    """The character device major of ``name`` in ``/proc/devices`` (blocking read)."""
    try:
        content = (proc_root / "devices").read_text()
    except OSError:
        return None
    in_chars = False
    for line in content.splitlines():
        if line.strip().endswith(":"):
            in_chars = line.strip() == "Character devices:"
            continue
        parts = line.split()
        if in_chars and len(parts) == 2 and parts[1] == name and parts[0].isdigit():
            return int(parts[0])
    return None


def capability_minor(proc_root: Path, relative: str) -> int | None:
    """The ``DeviceFileMinor`` of an NVIDIA capability file under ``/proc`` (blocking read)."""
    try:
        content = (proc_root / relative).read_text()
    except OSError:
        return None
    for line in content.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value.strip())
    return None


def channel_nodes(major: int, count: int) -> tuple[DeviceNode, ...]:
    """The IMEX channel device nodes 0..count-1, made by the runtime in the container (mode 0666,
    as NVIDIA's plugin gives them)."""
    return tuple(
        DeviceNode(path=f"{CHANNEL_DIR}/channel{i}", device_type="c", major=major, minor=i, file_mode=0o666)
        for i in range(count)
    )


@dataclass(frozen=True)
class NodeFabric:
    """What a compute-domain prepare needs to know of this node."""

    clique_id: str
    channel_major: int | None
    imex_mgmt: DeviceNode | None
    driver_edits: ContainerEdits = field(default_factory=ContainerEdits)
    # Simulated hardware only: what a daemon's container also gets (its fault folder).
    simulated_daemon_edits: ContainerEdits = field(default_factory=ContainerEdits)


class ComputeDomainBackend:
    """Discovers the compute-domain driver's devices and the node's fabric through NVML."""

    # The record that builds what else this driver brings (``nvidia.cd_record``).
    vendor: Final = "nvidia-compute-domain"

    def __init__(
        self,
        *,
        nvml: Any = None,
        driver_root: str | Path = "/",
        host_driver_root: str = "/",
        cdi_hook_path: str | None = None,
        proc_root: str | Path = "/proc",
        host_managed: bool = False,
        strict_fabric: bool = True,
        simulated: bool = False,
        simulated_daemon_edits: ContainerEdits | None = None,
    ) -> None:
        self._nvml = nvml
        self.driver_root = Path(driver_root)
        self._host_driver_root = host_driver_root
        self._cdi_hook_path = cdi_hook_path
        self.proc_root = Path(proc_root)
        self.host_managed = host_managed
        self.strict_fabric = strict_fabric
        self.simulated = simulated
        self._simulated_daemon_edits = simulated_daemon_edits or ContainerEdits()
        self.fabric: NodeFabric | None = None
        """The node's fabric as the last discovery found it (None before one succeeded)."""

    @property
    def driver(self) -> str:
        return cd.DRIVER

    def nvml_module(self) -> Any:
        return self._nvml if self._nvml is not None else pynvml

    async def discover(self) -> DiscoveredInventory:
        return await asyncio.to_thread(self.discover_sync)

    def discover_sync(self) -> DiscoveredInventory:
        """One blocking pass: NVML's fabric info, /proc, the driver's files."""
        nvml = self.nvml_module()
        try:
            nvml.nvmlInitWithFlags(pynvml.NVML_INIT_FLAG_NO_GPUS)
        except (pynvml.NVMLError, OSError) as err:
            return self._unavailable(f"NVML: {err}")
        try:
            version = text(nvml.nvmlSystemGetDriverVersion())
            clique = read_clique_id(nvml, strict=self.strict_fabric)
        except FabricError as err:
            return self._unavailable(f"NVLink fabric: {err}; the compute-domain driver publishes no devices")
        except pynvml.NVMLError as err:
            return self._unavailable(f"NVML: {err}")
        finally:
            try:
                nvml.nvmlShutdown()
            except pynvml.NVMLError as err:
                log.warning("NVML shutdown failed: %s", err)
        return self._inventory(clique=clique, version=version)

    def _unavailable(self, problem: str) -> DiscoveredInventory:
        log.warning("compute-domain driver: %s", problem)
        return DiscoveredInventory(
            driver=cd.DRIVER, available=False, errors=(problem,), simulated=self.simulated
        )

    def _inventory(self, *, clique: str, version: str) -> DiscoveredInventory:
        channel_major = device_major(self.proc_root, IMEX_CHANNELS_DEVICE)
        if clique and channel_major is None:
            return self._unavailable(
                f"this node is in NVLink clique {clique}, but /proc/devices has no {IMEX_CHANNELS_DEVICE} "
                "(load the driver with IMEX channels enabled)"
            )
        imex_mgmt = None
        if clique and not self.host_managed:
            caps = device_major(self.proc_root, CAPS_DEVICE)
            minor = capability_minor(self.proc_root, IMEX_MGMT_CAPABILITY)
            if caps is not None and minor is not None:
                imex_mgmt = DeviceNode(
                    path=f"/dev/nvidia-caps/nvidia-cap{minor}",
                    device_type="c",
                    major=caps,
                    minor=minor,
                    file_mode=0o444,
                )
        files = scan_driver_root(self.driver_root, version=version)
        self.fabric = NodeFabric(
            clique_id=clique,
            channel_major=channel_major,
            imex_mgmt=imex_mgmt,
            driver_edits=files.container_edits(
                host_root=self._host_driver_root, hook_path=self._cdi_hook_path
            ),
            simulated_daemon_edits=self._simulated_daemon_edits,
        )
        devices = [_device(cd.CHANNEL_DEVICE, "channel")]
        if not self.host_managed:
            devices.append(_device(cd.DAEMON_DEVICE, "daemon"))
        if clique:
            log.info("compute-domain driver: this node is in NVLink clique %s", clique)
        else:
            log.info(
                "compute-domain driver: this node has no multi-node NVLink clique (channels carry no device)"
            )
        return DiscoveredInventory(
            driver=cd.DRIVER,
            devices=tuple(devices),
            simulated=self.simulated,
            # Its device nodes are made by the runtime from their numbers, as on hardware.
            simulated_nodes_on_host=self.simulated,
        )


def _device(name: str, kind: str) -> DiscoveredDevice:
    return DiscoveredDevice(
        name=name,
        kind="channel" if kind == "channel" else "daemon",
        uuid="",
        attributes={"type": string_attr(kind), "id": int_attr(0)},
    )
