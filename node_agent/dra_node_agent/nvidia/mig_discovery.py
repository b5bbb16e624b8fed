"""The MIG devices of a MIG-enabled GPU as NVML shows them, for the NVML backend (``discovery``).

Without dynamic MIG a GPU publishes the MIG devices that exist (``add_mig_devices``); with it, one
device per placement of every GPU-instance profile, whose instance prepare creates, and a counter
set that keeps the scheduler from picking placements the GPU cannot hold at once
(``add_placements``). Names and attributes follow NVIDIA's DRA driver. All blocking (NVML).
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import pynvml

from dra_node_agent.devices import (
    Attribute,
    ContainerEdits,
    CounterSet,
    DeviceNode,
    DiscoveredDevice,
    MigPlacement,
    dns_label,
    string_attr,
)

log = logging.getLogger(__name__)

MIB = 1 << 20
GIB = 1 << 30

# GPU-instance profile indices whose names carry a media-engine or graphics suffix (go-nvlib).
_PROFILE_SUFFIXES = {
    0x7: "+me", 0x8: "+me", 0xA: "+gfx", 0xB: "+gfx", 0xC: "+gfx",
    0xD: "-me", 0xE: "-me", 0xF: "+me.all", 0x10: "+me.all", 0x11: "+gfx",
}  # fmt: skip


# NVML compute-instance profile by compute slices: dynamic MIG makes one compute instance spanning
# its GPU instance, as NVIDIA's driver does.
COMPUTE_PROFILE_BY_SLICES: Final = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}
# A GPU-instance profile's engines: (counter of a dynamic-MIG GPU's counter set, named after the
# capacity as NVIDIA's driver names it; the capacity; the NVML profile-info field). The counter set
# also holds ``memory`` and one ``memory-slice-<i>`` per memory slice (a placement consumes those it
# covers).
_ENGINES: Final = (
    ("multiprocessors", "multiprocessors", "multiprocessorCount"),
    ("copy-engines", "copyEngines", "copyEngineCount"),
    ("decoders", "decoders", "decoderCount"),
    ("encoders", "encoders", "encoderCount"),
    ("jpeg-engines", "jpegEngines", "jpegCount"),
    ("ofa-engines", "ofaEngines", "ofaCount"),
)


def possible_placements(nvml: Any, handle: Any, profile_id: int) -> list[tuple[int, int]]:
    """(start, size) of each placement of a GPU-instance profile (pynvml wants ctypes arrays)."""
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    if count.value == 0:
        return []
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
    return [(int(p.start), int(p.size)) for p in array[: count.value]]


def mig_profile_name(
    *, gi_slices: int, ci_slices: int, memory_mib: int, total_bytes: int, profile_index: int | None
) -> str:
    """NVIDIA's MIG profile name, e.g. "1g.10gb", "1c.2g.20gb", "1g.10gb+me".

    The memory figure is rounded to eighths of the whole GPU, as go-nvlib does, so the name matches
    what `nvidia-smi` and NVIDIA's driver print.
    """
    total_gb = math.ceil(total_bytes / GIB)
    eighths = math.ceil(memory_mib * MIB / total_bytes * 8)
    # Halves round up, as Go's math.Round does (Python's round() would make the H200's 3g.71gb 3g.70gb).
    gb = math.floor(eighths / 8 * total_gb + 0.5)
    base = f"{gi_slices}g.{gb}gb"
    if ci_slices != gi_slices:
        base = f"{ci_slices}c.{base}"
    return base + _PROFILE_SUFFIXES.get(profile_index if profile_index is not None else -1, "")


def text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class DiscoveryPass:
    """State of one discovery pass."""

    devices: list[DiscoveredDevice] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    counter_sets: list[CounterSet] = field(default_factory=list)


@dataclass(frozen=True)
class ParentGpu:
    """A MIG-enabled GPU as its MIG devices see it."""

    handle: Any
    uuid: str
    minor: int
    bus_id: str
    total: int  # bytes of memory (profile names need it)
    shared: Mapping[str, Attribute]  # the attributes its MIG devices share with it
    node: DeviceNode  # /dev/nvidia<minor>


def gi_profile_indices(nvml: Any, handle: Any) -> dict[int, int]:
    """GPU-instance profile id -> profile index (the index decides the +me/-me/+gfx suffix)."""
    found: dict[int, int] = {}
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue
        found.setdefault(int(info.id), index)
    return found


# --- dynamic MIG: every placement ---------------------------------------------------------------

_Profile = tuple[int, Any, list[tuple[int, int]]]  # profile index, NVML profile info, placements


def _dynamic_profiles(nvml: Any, handle: Any) -> list[_Profile]:
    """The GPU-instance profiles dynamic MIG can make (one compute instance spanning each)."""
    profiles: list[_Profile] = []
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue
        if int(info.instanceCount) == 0 or int(info.sliceCount) not in COMPUTE_PROFILE_BY_SLICES:
            continue
        placements = possible_placements(nvml, handle, int(info.id))
        if placements:
            profiles.append((index, info, placements))
    return profiles


def _whole_gpu(gpu: ParentGpu, profiles: list[_Profile]) -> CounterSet:
    """The GPU's counter set: the largest profile's engines and memory, one counter per memory slice."""
    counters: dict[str, int] = {}
    for counter, _, field_name in _ENGINES:
        counters[counter] = max(int(getattr(info, field_name)) for _, info, _ in profiles)
    counters["memory"] = max(int(info.memorySizeMB) for _, info, _ in profiles) * MIB
    memory_slices = max(start + size for _, _, placements in profiles for start, size in placements)
    for i in range(memory_slices):
        counters[f"memory-slice-{i}"] = 1
    return CounterSet(name=f"gpu-{gpu.minor}-counter-set", counters=counters)


def add_placements(nvml: Any, gpu: ParentGpu, state: DiscoveryPass) -> None:
    """Dynamic MIG: one counter set for the GPU and one device per profile placement.

    Each placement consumes its profile's engines and memory and the memory slices it covers, so
    the scheduler never picks two that the GPU could not hold at once.
    """
    profiles = _dynamic_profiles(nvml, gpu.handle)
    if not profiles:
        state.errors.append(f"GPU {gpu.uuid}: MIG is on but NVML lists no GPU-instance profile; skipped")
        return
    whole = _whole_gpu(gpu, profiles)
    state.counter_sets.append(whole)
    for index, info, placements in profiles:
        state.devices.extend(
            _placement_devices(gpu, index=index, info=info, placements=placements, set_name=whole.name)
        )


def _placement_devices(
    gpu: ParentGpu, *, index: int, info: Any, placements: list[tuple[int, int]], set_name: str
) -> list[DiscoveredDevice]:
    """One device per placement of one GPU-instance profile."""
    gi_slices = int(info.sliceCount)
    profile = mig_profile_name(
        gi_slices=gi_slices,
        ci_slices=gi_slices,
        memory_mib=int(info.memorySizeMB),
        total_bytes=gpu.total,
        profile_index=index,
    )
    engines = {(counter, name): int(getattr(info, field_name)) for counter, name, field_name in _ENGINES}
    capacity = {name: value for (_, name), value in engines.items()}
    capacity["memory"] = int(info.memorySizeMB) * MIB
    attributes = {
        "type": string_attr("mig"),
        "parentUUID": string_attr(gpu.uuid),
        "profile": string_attr(profile),
        **gpu.shared,
    }
    devices: list[DiscoveredDevice] = []
    for start, size in placements:
        uses = {counter: value for (counter, _), value in engines.items() if value}
        uses["memory"] = capacity["memory"]
        uses.update({f"memory-slice-{i}": 1 for i in range(start, start + size)})
        devices.append(
            DiscoveredDevice(
                name=f"gpu-{gpu.minor}-mig-{dns_label(profile)}-{int(info.id)}-{start}",
                kind="mig",
                uuid="",
                attributes=attributes,
                capacity=capacity,
                pci_bus_id=gpu.bus_id,
                parent_uuid=gpu.uuid,
                local_id=f"{gpu.minor}:{int(info.id)}:{start}",
                edits=ContainerEdits(device_nodes=(gpu.node,)),
                mig_placement=MigPlacement(
                    parent_uuid=gpu.uuid,
                    parent_minor=gpu.minor,
                    profile_id=int(info.id),
                    start=start,
                    size=size,
                    compute_profile=COMPUTE_PROFILE_BY_SLICES[gi_slices],
                ),
                consumes=CounterSet(name=set_name, counters=uses),
            )
        )
    return devices


# --- static MIG: the devices that exist ---------------------------------------------------------

# The /dev/nvidia-caps nodes granting access to one GPU and compute instance (minor, gi_id, ci_id).
CapNodes = Callable[..., list[DeviceNode]]


def add_mig_devices(nvml: Any, gpu: ParentGpu, state: DiscoveryPass, *, cap_nodes: CapNodes) -> None:
    """The MIG devices that exist on the GPU; one NVML cannot describe is skipped with an error."""
    profiles = gi_profile_indices(nvml, gpu.handle)
    for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
        except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
            continue  # empty slot
        try:
            state.devices.append(_mig_device(nvml, mig=mig, gpu=gpu, profiles=profiles, cap_nodes=cap_nodes))
        except pynvml.NVMLError as err:
            message = f"MIG device {slot} of GPU {gpu.uuid}: {err}; skipped"
            log.warning("%s", message)
            state.errors.append(message)


def _mig_device(
    nvml: Any, *, mig: Any, gpu: ParentGpu, profiles: dict[int, int], cap_nodes: CapNodes
) -> DiscoveredDevice:
    uuid = text(nvml.nvmlDeviceGetUUID(mig))
    gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
    ci_id = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
    attrs = nvml.nvmlDeviceGetAttributes(mig)
    gi_info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(gpu.handle, gi_id))
    gi_slices = int(attrs.gpuInstanceSliceCount)
    ci_slices = int(attrs.computeInstanceSliceCount)
    profile = mig_profile_name(
        gi_slices=gi_slices,
        ci_slices=ci_slices,
        memory_mib=int(attrs.memorySizeMB),
        total_bytes=gpu.total,
        profile_index=profiles.get(int(gi_info.profileId)),
    )
    start = int(gi_info.placement.start)
    # NVIDIA's canonical name: parent minor, profile, GPU-instance profile ID, placement start.
    name = f"gpu-{gpu.minor}-mig-{dns_label(profile)}-{int(gi_info.profileId)}-{start}"
    if ci_slices != gi_slices:
        name += f"-{ci_id}"  # several compute instances share this GPU instance
    attributes = {
        "type": string_attr("mig"),
        "uuid": string_attr(uuid),
        "parentUUID": string_attr(gpu.uuid),
        "profile": string_attr(profile),
        **gpu.shared,
    }
    capacity = {
        "multiprocessors": int(attrs.multiprocessorCount),
        "copyEngines": int(attrs.sharedCopyEngineCount),
        "decoders": int(attrs.sharedDecoderCount),
        "encoders": int(attrs.sharedEncoderCount),
        "jpegEngines": int(attrs.sharedJpegCount),
        "ofaEngines": int(attrs.sharedOfaCount),
        "memory": int(attrs.memorySizeMB) * MIB,
    }
    nodes = [gpu.node, *cap_nodes(minor=gpu.minor, gi_id=gi_id, ci_id=ci_id)]
    return DiscoveredDevice(
        name=name,
        kind="mig",
        uuid=uuid,
        attributes=attributes,
        capacity=capacity,
        pci_bus_id=gpu.bus_id,
        parent_uuid=gpu.uuid,
        local_id=f"{gpu.minor}:{gi_id}:{ci_id}",
        edits=ContainerEdits(device_nodes=tuple(nodes)),
    )
