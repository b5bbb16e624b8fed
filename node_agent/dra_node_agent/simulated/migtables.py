"""GPU-instance profile tables of the MIG-capable GPUs the fake NVML simulates.

Each row is what NVML reports for one profile (``nvmlDeviceGetGpuInstanceProfileInfo`` and
``nvmlDeviceGetGpuInstancePossiblePlacements``), as ``nvidia-smi mig -lgip`` and ``-lgipp`` print it
on the product: profile index and ID, compute slices, memory, engines, the most instances at once,
and the placements (start and size in memory slices; a GPU has 8). Dynamic MIG publishes one device
per placement and creates the instance at prepare, so these are the numbers a scheduler sees.
"""

from __future__ import annotations

from typing import Final

from dra_node_agent.simulated.fakehw import FakeMigProfile


def _row(
    index: int,
    profile_id: int,
    slices: int,
    memory_mib: int,
    multiprocessors: int,
    copy_engines: int,
    decoders: int,
    jpeg: int,
    ofa: int,
    instances: int,
    starts: tuple[int, ...],
    size: int,
) -> FakeMigProfile:
    return FakeMigProfile(
        index=index,
        id=profile_id,
        slices=slices,
        memory_mib=memory_mib,
        multiprocessors=multiprocessors,
        copy_engines=copy_engines,
        decoders=decoders,
        jpeg=jpeg,
        ofa=ofa,
        instances=instances,
        placements=starts,
        placement_size=size,
    )


ONE_SLICE: Final = (0, 1, 2, 3, 4, 5, 6)

# index, id, compute slices, MiB, SMs, copy engines, NVDEC, NVJPG, OFA, max instances, starts, size
A100_40GB: Final = (
    _row(0, 19, 1, 4864, 14, 1, 0, 0, 0, 7, ONE_SLICE, 1),  # 1g.5gb
    _row(7, 20, 1, 4864, 14, 1, 1, 1, 1, 1, ONE_SLICE, 1),  # 1g.5gb+me
    _row(9, 15, 1, 9856, 14, 1, 1, 0, 0, 4, (0, 2, 4, 6), 2),  # 1g.10gb
    _row(1, 14, 2, 9856, 28, 2, 1, 0, 0, 3, (0, 2, 4), 2),  # 2g.10gb
    _row(2, 9, 3, 19968, 42, 3, 2, 0, 0, 2, (0, 4), 4),  # 3g.20gb
    _row(3, 5, 4, 19968, 56, 4, 2, 0, 0, 1, (0,), 4),  # 4g.20gb
    _row(4, 0, 7, 40192, 98, 7, 5, 1, 1, 1, (0,), 8),  # 7g.40gb
)
A100_80GB: Final = (
    _row(0, 19, 1, 9728, 14, 1, 0, 0, 0, 7, ONE_SLICE, 1),  # 1g.10gb
    _row(7, 20, 1, 9728, 14, 1, 1, 1, 1, 1, ONE_SLICE, 1),  # 1g.10gb+me
    _row(9, 15, 1, 19968, 14, 1, 1, 0, 0, 4, (0, 2, 4, 6), 2),  # 1g.20gb
    _row(1, 14, 2, 19968, 28, 2, 1, 0, 0, 3, (0, 2, 4), 2),  # 2g.20gb
    _row(2, 9, 3, 40192, 42, 3, 2, 0, 0, 2, (0, 4), 4),  # 3g.40gb
    _row(3, 5, 4, 40192, 56, 4, 2, 0, 0, 1, (0,), 4),  # 4g.40gb
    _row(4, 0, 7, 81152, 98, 7, 5, 1, 1, 1, (0,), 8),  # 7g.80gb
)
H100_80GB: Final = (
    _row(0, 19, 1, 9984, 16, 1, 1, 1, 0, 7, ONE_SLICE, 1),  # 1g.10gb
    _row(7, 20, 1, 9984, 16, 1, 1, 1, 1, 1, ONE_SLICE, 1),  # 1g.10gb+me
    _row(9, 15, 1, 20096, 26, 1, 1, 1, 0, 4, (0, 2, 4, 6), 2),  # 1g.20gb
    _row(1, 14, 2, 20096, 32, 2, 2, 2, 0, 3, (0, 2, 4), 2),  # 2g.20gb
    _row(2, 9, 3, 40448, 60, 3, 3, 3, 0, 2, (0, 4), 4),  # 3g.40gb
    _row(3, 5, 4, 40448, 64, 4, 4, 4, 0, 1, (0,), 4),  # 4g.40gb
    _row(4, 0, 7, 81152, 132, 8, 7, 7, 1, 1, (0,), 8),  # 7g.80gb
)
# As NVML reported it on an H200 (driver 580.159.04, 2026-11-26; tests/hardware).
H200_141GB: Final = (
    _row(0, 19, 1, 16384, 16, 1, 1, 1, 0, 7, ONE_SLICE, 1),  # 1g.18gb
    _row(7, 20, 1, 16384, 16, 1, 1, 1, 1, 1, ONE_SLICE, 1),  # 1g.18gb+me
    _row(9, 15, 1, 33280, 26, 1, 1, 1, 0, 4, (0, 2, 4, 6), 2),  # 1g.35gb
    _row(1, 14, 2, 33280, 32, 2, 2, 2, 0, 3, (0, 2, 4), 2),  # 2g.35gb
    _row(2, 9, 3, 71424, 60, 3, 3, 3, 0, 2, (0, 4), 4),  # 3g.71gb
    _row(3, 5, 4, 71424, 64, 4, 4, 4, 0, 1, (0,), 4),  # 4g.71gb
    _row(4, 0, 7, 143360, 132, 8, 7, 7, 1, 1, (0,), 8),  # 7g.141gb
)

# By the product name NVML reports.
MIG_TABLES: Final[dict[str, tuple[FakeMigProfile, ...]]] = {
    "NVIDIA A100-SXM4-40GB": A100_40GB,
    "NVIDIA A100-PCIE-40GB": A100_40GB,
    "NVIDIA A100-SXM4-80GB": A100_80GB,
    "NVIDIA A100 80GB PCIe": A100_80GB,
    "NVIDIA H100 80GB HBM3": H100_80GB,
    "NVIDIA H200": H200_141GB,
}
