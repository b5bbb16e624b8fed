"""A GPU and a NIC of another driver under one PCIe root, or on one NUMA node: the allocator honours
``matchAttribute`` on a fully qualified attribute across drivers, and the explanation of a claim that
cannot be met names the constraint, its requests and the values there were to choose from.

The node looks like the simulated profiles h100-80gb-x8 and nic-sim-h100-x4: eight GPUs, each under
a PCIe root of its own, four per NUMA node, and NICs under the roots of GPUs 0, 2, 4 and 6 only.
"""

from __future__ import annotations

from typing import Any

from dra_api.model import AllocationResult, DeviceClass, Node, ResourceClaim, ResourceSlice
from dra_operator.allocator import AllocatedState, Allocator
from dra_operator.planner import EVENT_MESSAGE_LIMIT, Planner
from tests.unit.operator.planner.builders import V1, device_class, not_placed, placed, rc, request

GPU = "gpu.nvidia.com"
NIC = "nic.sim.accel-dra.dev"
NODE = "n1"
ROOT = "resource.kubernetes.io/pcieRoot"
NUMA = "resource.kubernetes.io/numaNode"
GPU_ROOTS = [
    *("pci0000:15", "pci0000:3a", "pci0000:4b", "pci0000:5a"),
    *("pci0000:97", "pci0000:bb", "pci0000:ca", "pci0000:d8"),
]
NIC_OF_GPU = {0: 0, 2: 1, 4: 2, 6: 3}  # GPU index -> the NIC under its root


def _numa(gpu: int) -> int:
    return 0 if gpu < 4 else 1


def _slice(driver: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _device(name: str, *, root: str, numa: int, **attributes: Any) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {ROOT: {"string": root}, NUMA: {"int": numa}, **attributes},
    }


def _slices() -> list[dict[str, Any]]:
    gpus = [
        _device(f"gpu-{i}", root=root, numa=_numa(i), type={"string": "gpu"})
        for i, root in enumerate(GPU_ROOTS)
    ]
    nics = [
        _device(f"nic-{n}", root=GPU_ROOTS[g], numa=_numa(g), ifName={"string": f"ens{n + 1}f0np0"})
        for g, n in NIC_OF_GPU.items()
    ]
    return [_slice(GPU, gpus), _slice(NIC, nics)]


def _classes() -> list[dict[str, Any]]:
    return [
        device_class("gpu", f'device.driver == "{GPU}"'),
        device_class("nic", f'device.driver == "{NIC}"'),
    ]


def _pair(name: str, attribute: str, *, count: int = 1) -> ResourceClaim:
    return rc(
        name,
        request("gpu", cls="gpu", count=count),
        request("nic", cls="nic", count=count),
        constraints=[{"requests": ["gpu", "nic"], "matchAttribute": attribute}],
    )


def _taken(*devices: str) -> AllocatedState:
    return AllocatedState(devices={(GPU if d.startswith("gpu") else NIC, NODE, d) for d in devices})


def _allocate(claim: ResourceClaim, *taken: str) -> dict[str, str] | None:
    allocator = Allocator(
        classes=[DeviceClass.from_json(c) for c in _classes()],
        slices=[ResourceSlice.from_json(s) for s in _slices()],
        allocated=_taken(*taken),
    )
    results = allocator.allocate(node=Node.make(NODE), claims=[claim])
    if results is None:
        return None
    (result,) = results
    return {r.request: r.device for r in result.devices}


def _attribute(device: str, name: str) -> object:
    for s in _slices():
        for d in s["spec"]["devices"]:
            if d["name"] == device:
                return next(iter(d["attributes"][name].values()))
    raise AssertionError(device)


def test_a_gpu_and_a_nic_of_another_driver_come_from_one_pcie_root() -> None:
    got = _allocate(_pair("pair", ROOT))
    assert got == {"gpu": "gpu-0", "nic": "nic-0"}
    assert _attribute(got["gpu"], ROOT) == _attribute(got["nic"], ROOT)


def test_gpus_whose_root_has_no_free_nic_are_skipped() -> None:
    # gpu-0 is taken; gpu-1's root has no NIC at all; gpu-2's root has nic-1.
    assert _allocate(_pair("pair", ROOT), "gpu-0") == {"gpu": "gpu-2", "nic": "nic-1"}
    # nic-1 taken too: gpu-2's root has no free NIC left, gpu-3 none at all.
    assert _allocate(_pair("pair", ROOT), "gpu-0", "nic-1") == {"gpu": "gpu-4", "nic": "nic-2"}


def test_the_pair_cannot_be_met_when_every_root_with_a_nic_has_its_gpu_taken() -> None:
    # Four GPUs and four NICs are free, but never under one root.
    assert _allocate(_pair("pair", ROOT), "gpu-0", "gpu-2", "gpu-4", "gpu-6") is None
    # Without the constraint the same claim fits: the constraint is what fails.
    loose = rc("loose", request("gpu", cls="gpu"), request("nic", cls="nic"))
    assert _allocate(loose, "gpu-0", "gpu-2", "gpu-4", "gpu-6") is not None
    # Two pairs under one root cannot exist (one GPU per root).
    assert _allocate(_pair("pairs", ROOT, count=2)) is None


def test_a_gpu_and_a_nic_on_one_numa_node() -> None:
    got = _allocate(_pair("pair", NUMA), "gpu-0", "gpu-1", "gpu-2", "gpu-3")
    assert got is not None
    # NUMA node 0's GPUs are taken: nic-0 and nic-1 (node 0) are passed over for nic-2 (node 1).
    assert got == {"gpu": "gpu-4", "nic": "nic-2"}
    assert _attribute(got["gpu"], NUMA) == _attribute(got["nic"], NUMA) == 1
    # Two GPUs and two NICs on one NUMA node: node 0 has two NICs.
    two = _allocate(_pair("two", NUMA, count=2))
    assert two is not None
    assert {_attribute(d, NUMA) for d in two.values()} == {0}


def test_numa_alignment_cannot_be_met_when_gpus_and_nics_are_free_on_different_nodes() -> None:
    # Free GPUs only on NUMA node 0, free NICs only on node 1.
    taken = ("gpu-4", "gpu-5", "gpu-6", "gpu-7", "nic-0", "nic-1")
    assert _allocate(_pair("pair", NUMA), *taken) is None
    assert _allocate(_pair("pair", ROOT), *taken) is None


def _planner(*taken: str) -> Planner:
    allocated = [
        AllocationResult.from_json(
            {
                "devices": {
                    "results": [
                        {
                            "request": "x",
                            "driver": GPU if d.startswith("gpu") else NIC,
                            "pool": NODE,
                            "device": d,
                        }
                        for d in taken
                    ]
                }
            }
        )
    ]
    return Planner(
        classes=[DeviceClass.from_json(c) for c in _classes()],
        slices=[ResourceSlice.from_json(s) for s in _slices()],
        nodes=[Node.make(NODE)],
        allocated=allocated,
        policy="first-fit",
    )


def test_the_planner_places_the_pair_under_one_root() -> None:
    outcome = placed(_planner("gpu-0").plan([_pair("pair", ROOT)]))
    devices = {r.request: r.device for r in outcome.allocations[0].devices}
    assert _attribute(devices["gpu"], ROOT) == _attribute(devices["nic"], ROOT)


def test_the_explanation_names_the_failed_constraint_its_requests_and_the_values() -> None:
    outcome = not_placed(_planner("gpu-0", "gpu-2", "gpu-4", "gpu-6").plan([_pair("pair", ROOT)]))
    why = outcome.explanation
    name = f"constraint (matchAttribute {ROOT} on gpu, nic)"
    # Which values each request had to choose from: the free GPUs' roots, the free NICs' roots.
    values = (
        f"usable {ROOT} values: "
        "request gpu: pci0000:3a (1), pci0000:5a (1), pci0000:bb (1), pci0000:d8 (1); "
        "request nic: pci0000:15 (1), pci0000:4b (1), pci0000:97 (1), pci0000:ca (1); "
        "no one value has enough for every request (gpu needs 1, nic needs 1)"
    )
    # The feasibility check refuses the pair before any search, and says why.
    failed = (
        f"request gpu and request nic together want 2 devices sharing one value under {name}; "
        f"no value has that many that can serve them together (the most sharing one value: 1): {values}"
    )
    assert failed in why.full
    assert f"to change: relax {name}" in why.full
    # The Event's one-line form keeps the constraint and the values.
    assert len(why.short) <= EVENT_MESSAGE_LIMIT
    assert failed in why.short


def test_the_numa_explanation_counts_devices_per_value() -> None:
    outcome = not_placed(
        _planner("gpu-4", "gpu-5", "gpu-6", "gpu-7", "nic-0").plan([_pair("pair", NUMA, count=2)])
    )
    full = outcome.explanation.full
    assert (
        f"usable {NUMA} values: request gpu: 0 (4); request nic: 1 (2), 0 (1); "
        "no one value has enough for every request (gpu needs 2, nic needs 2)"
    ) in full


def test_values_that_would_fit_alone_are_told_apart_from_none_fitting() -> None:
    # One pair fits under pci0000:15 by the constraint alone, but a distinctAttribute on the same
    # requests forbids two devices with the same root, so the claim still fails.
    claim = rc(
        "odd",
        request("gpu", cls="gpu"),
        request("nic", cls="nic"),
        constraints=[
            {"requests": ["gpu", "nic"], "matchAttribute": ROOT},
            {"requests": ["gpu", "nic"], "distinctAttribute": ROOT},
        ],
    )
    full = not_placed(_planner().plan([claim])).explanation.full
    assert "pci0000:15, pci0000:4b, pci0000:97, pci0000:ca would have enough for every request" in full
