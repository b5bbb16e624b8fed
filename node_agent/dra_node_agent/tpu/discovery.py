"""Google TPU chips from PCI sysfs and /dev (driver `tpu.google.com`).

A chip is a PCI slot with vendor 0x1ae0 and a TPU device ID; its generation comes from the device
ID (v2 and v3 share one and differ by subsystem device). v2-v4 chips show as `/dev/accel<N>`,
v5e/v5p/v6e/TPU7x chips are bound to vfio-pci and show as `/dev/vfio/<iommu group>`. Attribute
names follow kubernetes-sigs/dra-driver-google-tpu (`accelerator`, `tpuGen`, `chipCount`,
`topology`, `index`, `uuid`, `brand`), plus `type`, `tensorCores`, the standard PCI attributes
and a `memory` (HBM) capacity. A host of a multi-host slice also publishes `sliceId` (which
physical slice) and `workerId` (which host of it), from its tpu-env file.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dra_api.names import STANDARD_ATTRIBUTE_DOMAIN, TPU_DRIVER
from dra_node_agent.devices import (
    Attribute,
    ContainerEdits,
    DeviceNode,
    DiscoveredDevice,
    DiscoveredInventory,
    TpuHostInfo,
    int_attr,
    string_attr,
)
from dra_node_agent.pci import link_basename, pcie_root, read_hex, read_int, split_address

log = logging.getLogger(__name__)

GOOGLE_VENDOR = 0x1AE0
# Google PCI devices that are not TPUs (NVMe, gVNIC, Pixel neural core).
NON_TPU_DEVICE_IDS = frozenset({0x001F, 0x0042, 0xABCD})
GIB = 1 << 30


@dataclass(frozen=True)
class TpuGeneration:
    name: str  # tpuGen and the TPU_ACCELERATOR_TYPE prefix
    accelerator: str  # GKE accelerator label value
    cores_per_chip: int
    hbm_bytes: int
    dims: int  # 2 for the "lite" 2D tori, 3 for the 3D ones
    vfio: bool  # bound to vfio-pci rather than the accel driver


GENERATIONS = {
    "v2": TpuGeneration("v2", "tpu-v2", 2, 16 * GIB, 2, False),
    "v3": TpuGeneration("v3", "tpu-v3", 2, 32 * GIB, 2, False),
    "v4": TpuGeneration("v4", "tpu-v4-podslice", 2, 32 * GIB, 3, False),
    "v5litepod": TpuGeneration("v5litepod", "tpu-v5-lite-podslice", 1, 16 * GIB, 2, True),
    "v5p": TpuGeneration("v5p", "tpu-v5p-slice", 2, 95 * GIB, 3, True),
    "v6e": TpuGeneration("v6e", "tpu-v6e-slice", 1, 32 * GIB, 2, True),
    "tpu7x": TpuGeneration("tpu7x", "tpu7x", 2, 192 * GIB, 3, True),
}
# PCI device ID -> generation; 0x0027 is v2 or v3, told apart by subsystem device.
DEVICE_ID_GENERATIONS = {0x005E: "v4", 0x0062: "v5p", 0x0063: "v5litepod", 0x006F: "v6e", 0x0076: "tpu7x"}
V2_V3_DEVICE_ID = 0x0027
V2_V3_SUBSYSTEMS = {0x004E: "v2", 0x004F: "v3"}

# Chips on one host -> chips-per-host bounds, as GKE and the TPU DRA driver set them.
CHIPS_PER_HOST_BOUNDS = {1: (1, 1, 1), 2: (1, 2, 1), 4: (2, 2, 1), 8: (2, 4, 1)}

_TOPOLOGY = re.compile(r"^[1-9]\d*(x[1-9]\d*){1,2}$")
DEFAULT_TPU_ENV_FILE = "/etc/tpu/tpu-env"  # the host copy of GCE's tpu-env (Google's TPU_ENV_FILE)
MAX_SLICE_ID = 64  # a string attribute's limit
_SLICE_ID = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,63}$")


def _without_shared_groups(chips: list[_Chip], errors: list[str]) -> list[_Chip]:
    """The chips whose VFIO groups are theirs alone. A group is what VFIO hands a container whole: two
    chips in one (no ACS isolation between them) would give the claim of one the other as well, so
    neither is published, and the log and the inventory's errors say why."""
    holders: dict[str, list[str]] = {}
    for chip in chips:
        for node in chip.nodes:
            if node.path.startswith("/dev/vfio/"):
                holders.setdefault(node.path, []).append(chip.address)
    shared = {path: addresses for path, addresses in holders.items() if len(addresses) > 1}
    for path, addresses in sorted(shared.items()):
        message = (
            f"TPU chips at {', '.join(addresses)} share the VFIO group {path}: a container given one "
            "would reach the others, so none of them is published (each chip needs an IOMMU group "
            "of its own)"
        )
        log.error("%s", message)
        errors.append(message)
    return [c for c in chips if not any(n.path in shared for n in c.nodes)]


def generation_for(device_id: int, subsystem_device: int | None) -> str | None:
    if device_id == V2_V3_DEVICE_ID:
        return V2_V3_SUBSYSTEMS.get(subsystem_device or -1)
    return DEVICE_ID_GENERATIONS.get(device_id)


def chips_per_host_bounds(chips: int) -> tuple[int, int, int]:
    return CHIPS_PER_HOST_BOUNDS.get(chips, (chips, 1, 1))


def host_topology(chips: int, *, dims: int) -> str:
    """The topology of a slice made of this host's chips only ("2x4", "2x2x1")."""
    bounds = chips_per_host_bounds(chips)
    return "x".join(str(b) for b in bounds[:dims])


def validate_topology(topology: str) -> str:
    if not _TOPOLOGY.fullmatch(topology):
        raise ValueError(f"TPU topology {topology!r}: expected AxB or AxBxC with positive integers")
    return topology


def slice_identity(env: Mapping[str, str]) -> str | None:
    """The name of the physical slice this host belongs to, from its tpu-env values.

    Facts (reference devices.md 2.3): Cloud TPU's tpu-env carries TOPOLOGY, HOST_BOUNDS,
    CHIPS_PER_HOST_BOUNDS and WORKER_ID (this host's index in its slice), but no key the references
    name as the slice's identity. Our choice: ``SLICE_ID``, a key of this driver that whoever writes
    the file sets (on GKE the node pool's name, one multi-host TPU node pool being one slice; the
    simulated nodes of the tests write it); else ``NODE_ID``, which Cloud TPU VMs carry as the name
    of their TPU node (inferred, not in the references). Hosts with the same value form one slice.
    """
    for key in ("SLICE_ID", "NODE_ID"):
        value = env.get(key, "").strip()
        if value:
            return value
    return None


def read_tpu_env(path: Path) -> dict[str, str]:
    """Parse a Cloud TPU `tpu-env` file (lines `KEY: 'value'`); empty if absent."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            values[key.strip()] = value.strip().strip("'\"")
    return values


def google_tpu_present(sysfs_root: str | Path = "/sys") -> bool:
    """True if any PCI device is a Google TPU (vendor 0x1ae0, not a known non-TPU device)."""
    return any(True for _ in _google_tpu_functions(Path(sysfs_root)))


def _google_tpu_functions(sysfs_root: Path) -> Iterable[Path]:
    devices = sysfs_root / "bus" / "pci" / "devices"
    try:
        entries = sorted(devices.iterdir())
    except OSError:
        return
    for entry in entries:
        if read_hex(entry / "vendor") != GOOGLE_VENDOR:
            continue
        device_id = read_hex(entry / "device")
        if device_id is None or device_id in NON_TPU_DEVICE_IDS:
            continue
        yield entry


@dataclass
class _Chip:
    address: str  # PCI address of the chip's first function
    generation: str | None
    device_id: int
    local_id: str  # "accel0" or the VFIO group number
    nodes: tuple[DeviceNode, ...]
    numa_node: int | None


class TpuBackend:
    """Discovers the TPU chips of this host.

    `sysfs_root` and `dev_root` point at the real /sys and /dev or at fake trees (as the agent sees
    them); CDI specs name nodes under `host_dev_dir`, the host's /dev as the runtime sees it. The
    slice topology comes from `topology`, else `TOPOLOGY` in the `tpu_env_path` file, else this host alone.
    `node_name` seeds the chip UUIDs so different nodes publish different ones.
    """

    # The record that builds the rest of what this vendor brings (``tpu.record``).
    vendor: Final = "tpu"

    def __init__(
        self,
        *,
        node_name: str,
        driver: str = TPU_DRIVER,
        sysfs_root: str | Path = "/sys",
        dev_root: str | Path = "/dev",
        topology: str | None = None,
        tpu_env_path: str | Path | None = DEFAULT_TPU_ENV_FILE,
        worker_id: int | None = None,
        worker_hostnames: tuple[str, ...] = (),
        host_dev_dir: str = "/dev",
        simulated: bool = False,
    ) -> None:
        self._node_name = node_name
        self._driver = driver
        self._sysfs_root = Path(sysfs_root)
        self._dev_root = Path(dev_root)
        self._host_dev_dir = host_dev_dir.rstrip("/")
        self._topology = validate_topology(topology) if topology else None
        self._tpu_env_path = Path(tpu_env_path) if tpu_env_path else None
        self._worker_id = worker_id
        self._worker_hostnames = worker_hostnames
        self._simulated = simulated

    @property
    def driver(self) -> str:
        return self._driver

    @property
    def sysfs_root(self) -> Path:
        return self._sysfs_root

    @property
    def dev_root(self) -> Path:
        return self._dev_root

    async def discover(self) -> DiscoveredInventory:
        return await asyncio.to_thread(self.discover_sync)

    def discover_sync(self) -> DiscoveredInventory:
        """One blocking pass over sysfs and /dev."""
        errors: list[str] = []
        chips = self._chips(errors)
        if not chips:
            return DiscoveredInventory(driver=self._driver, errors=tuple(errors), simulated=self._simulated)
        generations = {c.generation for c in chips}
        if len(generations) != 1 or None in generations:
            ids = sorted({f"0x{c.device_id:04x}" for c in chips})
            message = f"TPU chips of unknown or mixed generations (PCI device IDs {', '.join(ids)})"
            log.error("%s; publishing no TPU devices", message)
            return DiscoveredInventory(
                driver=self._driver, errors=(*errors, message), simulated=self._simulated
            )
        gen = GENERATIONS[str(chips[0].generation)]
        host = self._host_info(gen, len(chips), errors)
        devices = [self._device(gen, host, index, chip) for index, chip in enumerate(chips)]
        common = ContainerEdits()
        if gen.vfio:
            common = ContainerEdits(
                device_nodes=(DeviceNode(path="/dev/vfio/vfio", host_path=f"{self._host_dev_dir}/vfio/vfio"),)
            )
        return DiscoveredInventory(
            driver=self._driver,
            devices=tuple(devices),
            common_edits=common,
            tpu_host=host,
            errors=tuple(errors),
            simulated=self._simulated,
        )

    def _chips(self, errors: list[str]) -> list[_Chip]:
        slots: dict[str, list[tuple[int, Path]]] = {}
        for entry in _google_tpu_functions(self._sysfs_root):
            try:
                slot, function = split_address(entry.name)
            except ValueError:
                continue
            slots.setdefault(slot, []).append((function, entry))
        chips: list[_Chip] = []
        for slot in sorted(slots):
            functions = sorted(slots[slot])
            first = functions[0][1]
            device_id = read_hex(first / "device") or 0
            generation = generation_for(device_id, read_hex(first / "subsystem_device"))
            nodes: list[DeviceNode] = []
            local_id = ""
            for _, entry in functions:
                found = self._function_node(entry)
                if found is None:
                    continue
                function_id, node = found
                local_id = local_id or function_id
                if node.path not in {n.path for n in nodes}:
                    nodes.append(node)
            if not nodes:
                message = f"TPU at {first.name}: no /dev/accel or /dev/vfio node found; skipped"
                log.warning("%s", message)
                errors.append(message)
                continue
            numa = read_int(first / "numa_node")
            chips.append(
                _Chip(
                    address=first.name,
                    generation=generation,
                    device_id=device_id,
                    local_id=local_id,
                    nodes=tuple(nodes),
                    numa_node=numa if numa is not None and numa >= 0 else None,
                )
            )
        return _without_shared_groups(chips, errors)

    def _function_node(self, entry: Path) -> tuple[str, DeviceNode] | None:
        """The device node of one PCI function: its accel class device, else its VFIO group."""
        accel_dir = entry / "accel"
        accel_names = sorted(p.name for p in accel_dir.glob("accel*")) if accel_dir.is_dir() else []
        for name in accel_names:
            if (self._dev_root / name).exists():
                return name, DeviceNode(path=f"/dev/{name}", host_path=f"{self._host_dev_dir}/{name}")
        group = link_basename(entry / "iommu_group")
        if group is not None and (self._dev_root / "vfio" / group).exists():
            host_path = f"{self._host_dev_dir}/vfio/{group}"
            return group, DeviceNode(path=f"/dev/vfio/{group}", host_path=host_path)
        return None

    def _host_info(self, gen: TpuGeneration, chips: int, errors: list[str]) -> TpuHostInfo:
        env = read_tpu_env(self._tpu_env_path) if self._tpu_env_path else {}
        topology = self._topology
        if topology is None and env.get("TOPOLOGY"):
            try:
                topology = validate_topology(env["TOPOLOGY"])
            except ValueError as err:
                errors.append(f"{self._tpu_env_path}: {err}")
        if topology is None:
            topology = host_topology(chips, dims=gen.dims)
            log.info("assuming the single-host topology %s for %d TPU chips", topology, chips)
        worker_id = self._worker_id
        if worker_id is None and env.get("WORKER_ID", "").isdigit():
            worker_id = int(env["WORKER_ID"])
        slice_id = slice_identity(env)
        if slice_id is not None and not _SLICE_ID.fullmatch(slice_id):
            errors.append(
                f"{self._tpu_env_path}: slice identity {slice_id!r} is not 1-{MAX_SLICE_ID} letters, "
                "digits, '-', '_' or '.'; sliceId is not published"
            )
            slice_id = None
        return TpuHostInfo(
            generation=gen.name,
            accelerator=gen.accelerator,
            cores_per_chip=gen.cores_per_chip,
            chips_on_host=chips,
            topology=topology,
            chips_per_host_bounds=chips_per_host_bounds(chips),
            worker_id=worker_id,
            worker_hostnames=self._worker_hostnames,
            slice_id=slice_id,
        )

    def _device(self, gen: TpuGeneration, host: TpuHostInfo, index: int, chip: _Chip) -> DiscoveredDevice:
        chip_uuid = "tpu-" + str(
            uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"tpu://{self._node_name}/{chip.address}")
        )
        attributes: dict[str, Attribute] = {
            "type": string_attr("tpu"),
            "uuid": string_attr(chip_uuid),
            "index": int_attr(index),
            "brand": string_attr("Google"),
            "tpuGen": string_attr(gen.name),
            "accelerator": string_attr(gen.accelerator),
            "chipCount": int_attr(host.chips_on_host),
            "topology": string_attr(host.topology),
            "tensorCores": int_attr(gen.cores_per_chip),
            f"{STANDARD_ATTRIBUTE_DOMAIN}/pciBusID": string_attr(chip.address),
        }
        root = pcie_root(self._sysfs_root, chip.address)
        if root is not None:
            attributes[f"{STANDARD_ATTRIBUTE_DOMAIN}/pcieRoot"] = string_attr(root)
        if chip.numa_node is not None:
            # Google's driver's own name, and the standard one that other drivers (a NIC's) share,
            # so a claim can match a chip with a NIC on its NUMA node across drivers.
            attributes["numaNode"] = int_attr(chip.numa_node)
            attributes[f"{STANDARD_ATTRIBUTE_DOMAIN}/numaNode"] = int_attr(chip.numa_node)
        # Which physical slice and which host of it: a claim's selector on sliceId keeps the pods of
        # a multi-host workload on the hosts of one slice (see slice_identity).
        if host.slice_id is not None:
            attributes["sliceId"] = string_attr(host.slice_id)
        if host.worker_id is not None:
            attributes["workerId"] = int_attr(host.worker_id)
        return DiscoveredDevice(
            # Google's driver names a chip by its device file: accelN, or its VFIO group number.
            name=chip.local_id or f"tpu-{index}",
            kind="tpu",
            uuid=chip_uuid,
            attributes=attributes,
            capacity={"memory": gen.hbm_bytes},
            pci_bus_id=chip.address,
            local_id=chip.local_id,
            edits=ContainerEdits(device_nodes=chip.nodes),
        )
