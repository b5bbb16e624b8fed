"""Simulated hardware from a YAML profile, discovered by the real backends.

A profile describes one node's accelerators (see `dra_node_agent/profiles/*.yaml`). The simulated
backend turns it into a `FakeNvml` (NVIDIA) or a fake sysfs and /dev tree (TPU) and runs
`NvmlBackend` or `TpuBackend` over it, so a simulated node publishes exactly what real hardware of
that kind would. UUIDs derive from the node name, so two simulated nodes never share one. A `nic:`
profile runs the simulated NIC driver of `simulated.nic` (a test stand-in for aligning GPUs with NICs).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.resources
import stat
import tempfile
import threading
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from dra_api.names import GPU_DRIVER, TPU_DRIVER
from dra_node_agent.devices import DiscoveredInventory
from dra_node_agent.discovery_config import SHARES_DISABLED
from dra_node_agent.nvidia import record as nvidia_record
from dra_node_agent.nvidia.cd_discovery import ComputeDomainBackend
from dra_node_agent.nvidia.discovery import (
    ARCHITECTURE_NAMES,
    BRAND_NAMES,
    MPS_CONTROL_PATHS,
    NvmlBackend,
)
from dra_node_agent.simulated import container_tools
from dra_node_agent.simulated.fakehw import (
    FakeFabric,
    FakeGpu,
    FakeMig,
    FakeMigProfile,
    FakeNvml,
    write_fabric_nodes,
    write_nvidia_nodes,
)
from dra_node_agent.simulated.fakekernel import FakePciKernel
from dra_node_agent.simulated.faketree import (
    BAR_MEM32,
    BAR_MEM64_PREFETCH,
    NVIDIA_DRIVER,
    VFIO_PCI,
    FakePciFunction,
    write_pci_tree,
)
from dra_node_agent.simulated.host_tools import install_simulated_imex, install_simulated_mps_control
from dra_node_agent.simulated.migtables import MIG_TABLES
from dra_node_agent.simulated.nic import (
    NIC_DRIVER,
    NicProfile,
    SimNic,
    SimulatedNicBackend,
    nic_pci_functions,
    valid_if_name,
)
from dra_node_agent.simulated.profile_reader import ProfileError as ProfileError
from dra_node_agent.simulated.profile_reader import Reader as _Reader
from dra_node_agent.tpu import record as tpu_record
from dra_node_agent.tpu.discovery import GENERATIONS, GOOGLE_VENDOR, TpuBackend, validate_topology
from dra_node_agent.vendor_record import VendorRecord

PROFILE_PACKAGE = "dra_node_agent.profiles"
NVIDIA_VENDOR = 0x10DE
# Under a simulated node's hardware root: each GPU's persisted settings (fakehw), and the driver root
# (``container_tools``) whose usr/bin/nvidia-smi sets time slices on the host and lists GPUs in a container.
GPU_STATE_DIR = "gpu-state"
SIMULATED_DRIVER_ROOT = "driver"
# A simulated GPU's own IOMMU group, when its profile names none: this plus its position on the node.
SIMULATED_GPU_GROUP_BASE = 40
_TPU_DEVICE_IDS = {"v4": 0x005E, "v5p": 0x0062, "v5litepod": 0x0063, "v6e": 0x006F, "tpu7x": 0x0076}


@dataclass(frozen=True)
class GpuGroup:
    product_name: str
    count: int
    brand: int
    architecture: int
    compute_capability: tuple[int, int]
    memory_mib: int
    pci_bus_ids: tuple[str, ...]
    pcie_roots: tuple[str | None, ...]
    numa_nodes: tuple[int, ...]
    # Per GPU of the group: its IOMMU group (None: one of its own, numbered after the GPU).
    iommu_groups: tuple[int | None, ...]
    mig_capable: bool
    # MIG mode on for every GPU of the group, instances or not (dynamic MIG makes them at prepare).
    mig_enabled: bool
    # Per GPU of the group (by position): MIG layout as (profile name, placement start) pairs.
    mig_layouts: tuple[tuple[tuple[str, int], ...], ...]


FABRIC_STATES: Final = {"NotSupported": 0, "NotStarted": 1, "InProgress": 2, "Completed": 3}


@dataclass(frozen=True)
class FabricProfile:
    """What NVML's fabric info says of every GPU of a node: the NVLink fabric's cluster UUID, the
    clique (the default, or per node name), its registration state and status."""

    cluster_uuid: str
    clique: int
    state: int
    status: int = 0
    cliques: Mapping[str, int] = field(default_factory=dict)

    def clique_of(self, node_name: str) -> int:
        return self.cliques.get(node_name, self.clique)


@dataclass(frozen=True)
class NvidiaProfile:
    driver_version: str
    cuda_driver_version: int
    mig_profiles: Mapping[str, FakeMigProfile]
    gpus: tuple[GpuGroup, ...]
    # The kernel has IOMMUFD (/dev/iommu; a cdev per function vfio-pci holds).
    iommufd: bool = False
    # None: the driver has no fabric info for these GPUs (NVML says NotSupported).
    fabric: FabricProfile | None = None


@dataclass(frozen=True)
class TpuProfile:
    generation: str
    chips: int
    topology: str | None
    pci_addresses: tuple[str, ...]
    iommu_groups: tuple[int, ...]
    numa_nodes: tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    nvidia: NvidiaProfile | None = None
    tpu: TpuProfile | None = None
    nic: NicProfile | None = None

    @property
    def driver(self) -> str:
        if self.nic is not None:
            return self.nic.driver
        return GPU_DRIVER if self.nvidia is not None else TPU_DRIVER


def available_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    root = importlib.resources.files(PROFILE_PACKAGE)
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name ("h100-80gb-x8") or a profile file by path (blocking read)."""
    text_name = str(name_or_path)
    if text_name.endswith((".yaml", ".yml")) or "/" in text_name:
        path = Path(text_name)
        try:
            text = path.read_text()
        except OSError as err:
            raise ProfileError(f"profile {path}: {err.strerror}") from err
        label = path.stem
    else:
        resource = importlib.resources.files(PROFILE_PACKAGE) / f"{text_name}.yaml"
        if not resource.is_file():
            known = ", ".join(available_profiles())
            raise ProfileError(f"profile {text_name!r}: not shipped (known: {known})")
        text = resource.read_text()
        label = text_name
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ProfileError(f"profile {label}: not valid YAML: {err}") from err
    return parse_profile(data, label=label)


def parse_profile(data: Any, *, label: str) -> Profile:
    p = _Reader(label)
    top = p.mapping(data, "", {"name", "description", "nvidia", "tpu", "nic"})
    has_nvidia, has_tpu, has_nic = "nvidia" in top, "tpu" in top, "nic" in top
    if has_nvidia + has_tpu + has_nic != 1:
        raise ProfileError(f"profile {label}: exactly one of 'nvidia', 'tpu' and 'nic' must be set")
    return Profile(
        name=p.string(top.get("name", label), "name"),
        description=p.string(top.get("description", ""), "description"),
        nvidia=_parse_nvidia(p, top["nvidia"]) if has_nvidia else None,
        tpu=_parse_tpu(p, top["tpu"]) if has_tpu else None,
        nic=_parse_nic(p, top["nic"]) if has_nic else None,
    )


def _parse_nvidia(p: _Reader, raw: Any) -> NvidiaProfile:
    section = p.mapping(
        raw, "nvidia", {"driverVersion", "cudaDriverVersion", "migProfiles", "gpus", "iommufd", "fabric"}
    )
    mig_profiles: dict[str, FakeMigProfile] = {}
    for i, item in enumerate(p.sequence(section.get("migProfiles", []), "nvidia.migProfiles")):
        name, profile = _parse_mig_profile(p, item, where=f"nvidia.migProfiles[{i}]")
        mig_profiles[name] = profile
    groups = [
        _parse_gpu_group(p, item, where=f"nvidia.gpus[{i}]", mig_profiles=mig_profiles)
        for i, item in enumerate(p.sequence(section.get("gpus"), "nvidia.gpus"))
    ]
    return NvidiaProfile(
        driver_version=p.string(section.get("driverVersion"), "nvidia.driverVersion"),
        cuda_driver_version=p.integer(section.get("cudaDriverVersion"), "nvidia.cudaDriverVersion"),
        mig_profiles=mig_profiles,
        gpus=tuple(groups),
        iommufd=p.boolean(section.get("iommufd", False), "nvidia.iommufd"),
        fabric=_parse_fabric(p, section["fabric"]) if "fabric" in section else None,
    )


def _parse_fabric(p: _Reader, raw: Any) -> FabricProfile:
    f = p.mapping(raw, "nvidia.fabric", {"clusterUUID", "clique", "state", "status", "cliques"})
    cluster = p.string(f.get("clusterUUID"), "nvidia.fabric.clusterUUID")
    try:
        uuidlib.UUID(cluster)
    except ValueError:
        raise p.fail("nvidia.fabric.clusterUUID", f"{cluster!r} is not a UUID") from None
    state = p.string(f.get("state", "Completed"), "nvidia.fabric.state")
    if state not in FABRIC_STATES:
        raise p.fail("nvidia.fabric.state", f"unknown state {state!r} (known: {', '.join(FABRIC_STATES)})")
    cliques = p.mapping(f.get("cliques", {}), "nvidia.fabric.cliques", set(f.get("cliques") or {}))
    return FabricProfile(
        cluster_uuid=cluster,
        clique=p.integer(f.get("clique", 0), "nvidia.fabric.clique"),
        state=FABRIC_STATES[state],
        status=p.integer(f.get("status", 0), "nvidia.fabric.status"),
        cliques={str(k): p.integer(v, f"nvidia.fabric.cliques.{k}") for k, v in cliques.items()},
    )


def _parse_mig_profile(p: _Reader, item: Any, *, where: str) -> tuple[str, FakeMigProfile]:
    fields = {"name", "index", "id", "slices", "memoryMiB", "multiprocessors", "copyEngines",
              "decoders", "encoders", "jpeg", "ofa"}  # fmt: skip
    m = p.mapping(item, where, fields)
    return p.string(m.get("name"), f"{where}.name"), FakeMigProfile(
        index=p.integer(m.get("index"), f"{where}.index"),
        id=p.integer(m.get("id"), f"{where}.id"),
        slices=p.integer(m.get("slices"), f"{where}.slices"),
        memory_mib=p.integer(m.get("memoryMiB"), f"{where}.memoryMiB"),
        multiprocessors=p.integer(m.get("multiprocessors"), f"{where}.multiprocessors"),
        copy_engines=p.integer(m.get("copyEngines", 0), f"{where}.copyEngines"),
        decoders=p.integer(m.get("decoders", 0), f"{where}.decoders"),
        encoders=p.integer(m.get("encoders", 0), f"{where}.encoders"),
        jpeg=p.integer(m.get("jpeg", 0), f"{where}.jpeg"),
        ofa=p.integer(m.get("ofa", 0), f"{where}.ofa"),
    )


def _parse_gpu_group(
    p: _Reader, item: Any, *, where: str, mig_profiles: Mapping[str, FakeMigProfile]
) -> GpuGroup:
    brands = {v: k for k, v in BRAND_NAMES.items()}
    architectures = {v: k for k, v in ARCHITECTURE_NAMES.items()}
    fields = {"productName", "count", "brand", "architecture", "computeCapability", "memoryMiB",
              "pciBusIds", "pcieRoots", "numaNodes", "iommuGroups", "migCapable", "migEnabled",
              "mig"}  # fmt: skip
    g = p.mapping(item, where, fields)
    count = p.integer(g.get("count"), f"{where}.count")
    brand = p.string(g.get("brand", "Nvidia"), f"{where}.brand")
    if brand not in brands:
        raise p.fail(f"{where}.brand", f"unknown brand {brand!r}")
    architecture = p.string(g.get("architecture"), f"{where}.architecture")
    if architecture not in architectures:
        raise p.fail(f"{where}.architecture", f"unknown architecture {architecture!r}")
    cc_text = p.string(g.get("computeCapability"), f"{where}.computeCapability")
    major, _, minor = cc_text.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise p.fail(f"{where}.computeCapability", "must look like '9.0'")
    bus_ids = tuple(
        p.string(b, f"{where}.pciBusIds") for b in p.sequence(g.get("pciBusIds"), f"{where}.pciBusIds", count)
    )
    raw_roots = g.get("pcieRoots")
    roots: tuple[str | None, ...] = (None,) * count
    if raw_roots is not None:
        roots = tuple(
            p.string(r, f"{where}.pcieRoots") for r in p.sequence(raw_roots, f"{where}.pcieRoots", count)
        )
    numa = tuple(
        p.integer(n, f"{where}.numaNodes")
        for n in p.sequence(g.get("numaNodes", [-1] * count), f"{where}.numaNodes", count)
    )
    groups: tuple[int | None, ...] = (None,) * count
    if g.get("iommuGroups") is not None:
        groups = tuple(
            p.integer(n, f"{where}.iommuGroups")
            for n in p.sequence(g["iommuGroups"], f"{where}.iommuGroups", count)
        )
    layouts = _parse_mig_layouts(p, g.get("mig", []), where=f"{where}.mig", mig_profiles=mig_profiles)
    if len(layouts) > count:
        raise p.fail(f"{where}.mig", f"{len(layouts)} layouts for {count} GPUs")
    return GpuGroup(
        product_name=p.string(g.get("productName"), f"{where}.productName"),
        count=count,
        brand=brands[brand],
        architecture=architectures[architecture],
        compute_capability=(int(major), int(minor)),
        memory_mib=p.integer(g.get("memoryMiB"), f"{where}.memoryMiB"),
        pci_bus_ids=bus_ids,
        pcie_roots=roots,
        numa_nodes=numa,
        iommu_groups=groups,
        mig_capable=bool(g.get("migCapable", bool(layouts) or bool(g.get("migEnabled")))),
        mig_enabled=bool(g.get("migEnabled", False)),
        mig_layouts=tuple(layouts),
    )


def _parse_mig_layouts(
    p: _Reader, raw: Any, *, where: str, mig_profiles: Mapping[str, FakeMigProfile]
) -> list[tuple[tuple[str, int], ...]]:
    layouts: list[tuple[tuple[str, int], ...]] = []
    for j, layout in enumerate(p.sequence(raw, where)):
        entries = []
        for k, entry in enumerate(p.sequence(layout, f"{where}[{j}]")):
            e = p.mapping(entry, f"{where}[{j}][{k}]", {"profile", "start"})
            name = p.string(e.get("profile"), f"{where}[{j}][{k}].profile")
            if name not in mig_profiles:
                raise p.fail(f"{where}[{j}][{k}].profile", f"unknown MIG profile {name!r}")
            entries.append((name, p.integer(e.get("start"), f"{where}[{j}][{k}].start")))
        layouts.append(tuple(entries))
    return layouts


def _parse_tpu(p: _Reader, raw: Any) -> TpuProfile:
    section = p.mapping(
        raw, "tpu", {"generation", "chips", "topology", "pciAddresses", "iommuGroups", "numaNodes"}
    )
    generation = p.string(section.get("generation"), "tpu.generation")
    if generation not in _TPU_DEVICE_IDS:
        raise p.fail(
            "tpu.generation", f"unknown generation {generation!r} (known: {sorted(_TPU_DEVICE_IDS)})"
        )
    chips = p.integer(section.get("chips"), "tpu.chips")
    topology = section.get("topology")
    if topology is not None:
        try:
            topology = validate_topology(p.string(topology, "tpu.topology"))
        except ValueError as err:
            raise p.fail("tpu.topology", str(err)) from err
    default_addresses = [f"0000:00:{4 + i:02x}.0" for i in range(chips)]
    addresses = p.sequence(section.get("pciAddresses", default_addresses), "tpu.pciAddresses", chips)
    groups = p.sequence(section.get("iommuGroups", list(range(chips))), "tpu.iommuGroups", chips)
    numa = p.sequence(section.get("numaNodes", [-1] * chips), "tpu.numaNodes", chips)
    return TpuProfile(
        generation=generation,
        chips=chips,
        topology=topology,
        pci_addresses=tuple(p.string(a, "tpu.pciAddresses") for a in addresses),
        iommu_groups=tuple(p.integer(g, "tpu.iommuGroups") for g in groups),
        numa_nodes=tuple(p.integer(n, "tpu.numaNodes") for n in numa),
    )


def _parse_nic(p: _Reader, raw: Any) -> NicProfile:
    section = p.mapping(raw, "nic", {"driver", "nics"})
    driver = p.string(section.get("driver", NIC_DRIVER), "nic.driver")
    nics: list[SimNic] = []
    for i, item in enumerate(p.sequence(section.get("nics"), "nic.nics")):
        where = f"nic.nics[{i}]"
        n = p.mapping(item, where, {"ifName", "pciBusId", "pcieRoot", "numaNode", "rdma"})
        if_name = p.string(n.get("ifName"), f"{where}.ifName")
        if not valid_if_name(if_name):
            raise p.fail(f"{where}.ifName", f"{if_name!r} is not a Linux interface name")
        rdma = n.get("rdma", True)
        if not isinstance(rdma, bool):
            raise p.fail(f"{where}.rdma", "must be true or false")
        root = n.get("pcieRoot")
        nics.append(
            SimNic(
                if_name=if_name,
                pci_bus_id=p.string(n.get("pciBusId"), f"{where}.pciBusId"),
                pcie_root=None if root is None else p.string(root, f"{where}.pcieRoot"),
                numa_node=p.integer(n.get("numaNode", -1), f"{where}.numaNode"),
                rdma=rdma,
            )
        )
    if not nics:
        raise p.fail("nic.nics", "must list at least one NIC")
    return NicProfile(driver=driver, nics=tuple(nics))


def simulated_gpus(profile: NvidiaProfile, *, node_name: str) -> list[FakeGpu]:
    """The fake GPUs of a profile, with UUIDs derived from the node name."""
    fabric = profile.fabric
    gpu_fabric = (
        FakeFabric(
            cluster_uuid=fabric.cluster_uuid,
            clique=fabric.clique_of(node_name),
            state=fabric.state,
            status=fabric.status,
        )
        if fabric is not None
        else None
    )
    gpus: list[FakeGpu] = []
    for group in profile.gpus:
        for position in range(group.count):
            minor = len(gpus)
            layout = group.mig_layouts[position] if position < len(group.mig_layouts) else ()
            migs = tuple(
                FakeMig(
                    profile=profile.mig_profiles[name],
                    start=start,
                    gi_id=gi_id,
                    ci_id=0,
                    uuid="MIG-"
                    + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"sim://{node_name}/gpu/{minor}/gi/{gi_id}")),
                )
                for gi_id, (name, start) in enumerate(layout, start=1)
            )
            gpus.append(
                FakeGpu(
                    uuid="GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"sim://{node_name}/gpu/{minor}")),
                    name=group.product_name,
                    minor=minor,
                    pci_bus_id=group.pci_bus_ids[position],
                    memory_total=group.memory_mib << 20,
                    brand=group.brand,
                    architecture=group.architecture,
                    compute_capability=group.compute_capability,
                    mig_mode=(1 if layout or group.mig_enabled else 0) if group.mig_capable else None,
                    # The product's real profile table where there is one (placements included).
                    mig_profiles=MIG_TABLES.get(group.product_name, tuple(profile.mig_profiles.values()))
                    if group.mig_capable
                    else (),
                    migs=migs,
                    fabric=gpu_fabric,
                )
            )
    return gpus


def _gpu_pci_functions(profile: NvidiaProfile) -> list[FakePciFunction]:
    functions: list[FakePciFunction] = []
    for group in profile.gpus:
        # BAR0 registers, BAR1 the framebuffer aperture (the memory, rounded up), BAR3 more registers.
        memory = group.memory_mib << 20
        bars = (
            (16 << 20, BAR_MEM32),
            (1 << (memory - 1).bit_length(), BAR_MEM64_PREFETCH),
            (32 << 20, BAR_MEM64_PREFETCH),
        )
        for position in range(group.count):
            iommu = group.iommu_groups[position]
            functions.append(
                FakePciFunction(
                    address=group.pci_bus_ids[position],
                    vendor=NVIDIA_VENDOR,
                    device=0x2330,
                    class_code=0x030200,
                    numa_node=group.numa_nodes[position],
                    driver=NVIDIA_DRIVER,
                    pcie_root=group.pcie_roots[position],
                    iommu_group=SIMULATED_GPU_GROUP_BASE + len(functions) if iommu is None else iommu,
                    bars=bars,
                )
            )
    return functions


def tpu_pci_functions(profile: TpuProfile) -> list[FakePciFunction]:
    gen = GENERATIONS[profile.generation]
    return [
        FakePciFunction(
            address=profile.pci_addresses[i],
            vendor=GOOGLE_VENDOR,
            device=_TPU_DEVICE_IDS[profile.generation],
            numa_node=profile.numa_nodes[i],
            iommu_group=profile.iommu_groups[i],
            driver="vfio-pci" if gen.vfio else "accel",
            accel=None if gen.vfio else f"accel{i}",
        )
        for i in range(profile.chips)
    ]


@dataclass
class SimulatedHardware:
    """What the simulated backend built: the fake tree root and, for NVIDIA, the fake NVML; the
    vendor's real backend that runs over them, and that vendor's record (None for the simulated
    NIC driver, which brings nothing beyond its devices)."""

    root: Path
    nvml: FakeNvml | None = None
    backend: NvmlBackend | TpuBackend | SimulatedNicBackend | ComputeDomainBackend | None = field(
        default=None, repr=False
    )
    vendor: VendorRecord[Any] | None = field(default=None, repr=False)
    char_devices: bool = False
    """Whether the fake /dev holds character devices (the agent may mknod), which a container
    runtime can inject as it would the real ones."""
    kernel: FakePciKernel | None = field(default=None, repr=False)
    """What the kernel does on writes to the fake sysfs (binding GPUs to vfio-pci and back)."""


class SimulatedBackend:
    """Discovery over simulated hardware described by `profile`.

    The fake trees are written once under `state_dir` (a fresh temporary directory by default).
    A TPU profile's host reads `tpu_env_path`, a Cloud TPU tpu-env file, as a real host does: that
    is where a simulated host of a multi-host slice gets its WORKER_ID and SLICE_ID, so hardware and
    simulation share one code path (None: no file, a host whose slice identity is unknown).
    """

    # The record that builds the rest of what this vendor brings (``simulated.record``).
    vendor: Final = "simulated"

    def __init__(
        self,
        *,
        profile: Profile | str | Path,
        node_name: str,
        state_dir: str | Path | None = None,
        driver: str | None = None,
        tpu_env_path: str | Path | None = None,
        dynamic_mig: bool = False,
        cdi_hook_path: str | None = None,
        passthrough: bool = False,
        consumable_shares: str = SHARES_DISABLED,
    ) -> None:
        self._passthrough = passthrough
        self._consumable_shares = consumable_shares
        self._cdi_hook_path = cdi_hook_path
        self._tpu_env_path = tpu_env_path
        self._dynamic_mig = dynamic_mig
        self._profile_ref = profile
        self._node_name = node_name
        self._state_dir = Path(state_dir) if state_dir else None
        self._driver_override = driver
        self._hardware: SimulatedHardware | None = None
        self._profile: Profile | None = profile if isinstance(profile, Profile) else None
        self._lock = threading.Lock()

    @property
    def driver(self) -> str:
        if self._driver_override:
            return self._driver_override
        return self.profile().driver

    def profile(self) -> Profile:
        if self._profile is None:
            self._profile = load_profile(self._profile_ref)  # type: ignore[arg-type]
        return self._profile

    async def discover(self) -> DiscoveredInventory:
        return await asyncio.to_thread(self.discover_sync)

    def discover_sync(self) -> DiscoveredInventory:
        hardware = self.hardware()
        assert hardware.backend is not None
        inventory = hardware.backend.discover_sync()
        inventory = dataclasses.replace(inventory, simulated_nodes_on_host=hardware.char_devices)
        if hardware.nvml is not None:
            # The driver root's nvidia-smi, which a claim's spec mounts, lists the node's GPUs.
            container_tools.write_nvidia_smi(
                hardware.root / SIMULATED_DRIVER_ROOT,
                state_dir=hardware.root / GPU_STATE_DIR,
                devices=inventory.devices,
            )
            if hardware.char_devices:
                # A container on a real node gets a client of its claim's simulated MPS daemon.
                tools = container_tools.install_mps_client(hardware.root / SIMULATED_DRIVER_ROOT)
                inventory = dataclasses.replace(inventory, common_edits=inventory.common_edits.merged(tools))
        return inventory

    def hardware(self) -> SimulatedHardware:
        """Build the fake hardware on first use (blocking file writes)."""
        with self._lock:
            if self._hardware is None:
                self._hardware = self._build()
            return self._hardware

    def _build(self) -> SimulatedHardware:
        profile = self.profile()
        root = self._state_dir or Path(tempfile.mkdtemp(prefix="dra-sim-"))
        root.mkdir(parents=True, exist_ok=True)
        driver = self._driver_override or profile.driver
        if profile.nvidia is not None:
            return self._build_nvidia(profile.nvidia, root=root, driver=driver)
        if profile.nic is not None:
            # NICs have no device nodes here: their CDI specs carry environment only.
            write_pci_tree(root, nic_pci_functions(profile.nic))
            nic_backend = SimulatedNicBackend(
                driver=driver, profile=profile.nic, sysfs_root=root / "sys", node_name=self._node_name
            )
            return SimulatedHardware(root=root, backend=nic_backend)
        assert profile.tpu is not None
        write_pci_tree(root, tpu_pci_functions(profile.tpu), char_devices=True)
        nodes = [p for p in (root / "dev").rglob("*") if not p.is_dir()]
        char_devices = bool(nodes) and all(_char_device(p) for p in nodes)
        backend = TpuBackend(
            node_name=self._node_name,
            driver=driver,
            sysfs_root=root / "sys",
            dev_root=root / "dev",
            topology=profile.tpu.topology,
            tpu_env_path=self._tpu_env_path,
            host_dev_dir=str(root / "dev") if char_devices else "/dev",
            simulated=True,
        )
        return SimulatedHardware(
            root=root, backend=backend, vendor=tpu_record.RECORD, char_devices=char_devices
        )

    def _build_nvidia(self, profile: NvidiaProfile, *, root: Path, driver: str) -> SimulatedHardware:
        gpus = simulated_gpus(profile, node_name=self._node_name)
        write_pci_tree(
            root, _gpu_pci_functions(profile), char_devices=True, drivers=(VFIO_PCI,), iommufd=profile.iommufd
        )
        write_nvidia_nodes(root, gpus, char_devices=True)
        char_devices = _char_device(root / "dev" / "nvidiactl")
        kernel = FakePciKernel(root, char_devices=char_devices, iommufd=profile.iommufd)
        # The GPUs' settings outlive the agent, as on hardware; the host's nvidia-smi sets the
        # time slice there (gpu_sharing).
        nvml = FakeNvml(
            gpus=gpus,
            driver_version=profile.driver_version,
            cuda_driver_version=profile.cuda_driver_version,
            state_dir=root / GPU_STATE_DIR,
            node_root=root,
            char_devices=char_devices,
            sysfs_root=root / "sys",
        )
        # A driver root as a real driver lays it out, with stand-ins for its tools: the spec
        # mounts its files into GPU containers, and time-slicing and MPS run its tools.
        driver_root = root / SIMULATED_DRIVER_ROOT
        container_tools.install_driver_files(driver_root, version=profile.driver_version)
        if not (driver_root / container_tools.NVIDIA_SMI).exists():
            # The host's side needs the tool before discovery; discovery writes it with its
            # device table (a restart rewrites nothing: the same devices give the same text).
            container_tools.write_nvidia_smi(driver_root, state_dir=root / GPU_STATE_DIR)
        install_simulated_mps_control(driver_root / MPS_CONTROL_PATHS[0])
        # /proc/devices, the IMEX tools and (in a multi-node clique) the IMEX capability.
        write_fabric_nodes(root, with_fabric=_multi_node(profile.fabric), char_devices=True)
        install_simulated_imex(driver_root)
        backend = NvmlBackend(
            driver=driver,
            nvml=nvml,
            driver_root=driver_root,
            # The agent and the runtime see the simulated tree at the same path.
            host_driver_root=str(driver_root),
            cdi_hook_path=self._cdi_hook_path,
            sysfs_root=root / "sys",
            proc_root=root / "proc",
            dev_root=root / "dev",
            host_dev_dir=str(root / "dev") if char_devices else "/dev",
            simulated=True,
            dynamic_mig=self._dynamic_mig,
            passthrough=self._passthrough,
            consumable_shares=self._consumable_shares,
            sysfs_written=kernel,
        )
        return SimulatedHardware(
            root=root,
            nvml=nvml,
            backend=backend,
            vendor=nvidia_record.RECORD,
            char_devices=char_devices,
            kernel=kernel,
        )


def _multi_node(fabric: FabricProfile | None) -> bool:
    """Whether a profile's fabric joins its node to others (a non-zero cluster UUID)."""
    return (
        fabric is not None
        and fabric.state == FABRIC_STATES["Completed"]
        and uuidlib.UUID(fabric.cluster_uuid).int != 0
    )


def _char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.lstat().st_mode)
    except OSError:
        return False


def profile_summary(profiles: Sequence[str]) -> dict[str, str]:
    """Profile name -> description, for `--help` texts and the CLI."""
    return {name: load_profile(name).description for name in profiles}
