"""Which slices the operator's sweep may delete: node-local ones of its own drivers whose node is
gone and that no Node owns (finding L6 of the security review: it used to take any driver's)."""

from __future__ import annotations

import copy

from dra_operator.model.cluster import ClusterModel
from dra_operator.upkeep.slices import orphan_candidates

from . import helpers as h

DRIVERS = ("gpu.nvidia.com", "tpu.google.com")


def _foreign(node: str) -> dict[str, object]:
    obj = copy.deepcopy(h.gpu_slice(node, 1, owner_node=False))
    obj["metadata"]["name"] = f"{node}-nic"
    obj["metadata"]["uid"] = f"nic-{node}"
    obj["spec"]["driver"] = "nic.example.com"
    return obj


def test_only_its_own_drivers_unowned_slices_of_vanished_nodes_are_candidates() -> None:
    model = ClusterModel()
    model.upsert_node(h.node("alive"))
    for obj in (
        h.gpu_slice("gone", 1, owner_node=False),  # the only candidate
        h.gpu_slice("gone-owned", 1, owner_node=True),  # the garbage collector's
        h.gpu_slice("alive", 1, owner_node=False),  # its node is there
        _foreign("gone"),  # another driver's: that driver's to clean up
    ):
        model.upsert_slice(obj)
    assert [s.name for s in orphan_candidates(model, drivers=DRIVERS)] == ["gone-gpu"]
    assert orphan_candidates(model, drivers=()) == []
