"""Dynamic MIG at prepare and unprepare, over the simulated node's fake NVML (the real code path):
the instance is made at prepare and recorded before the CDI spec names it, destroyed at unprepare;
what a crash leaves is repaired by the retry or at start; NVML's refusal fails the prepare with
the claim, the request and the device named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent import checkpoint as cp
from dra_node_agent import prepare_tools
from dra_node_agent.nvidia.dynamic_mig import DynamicMig
from dra_node_agent.prepare import PrepareHandler
from dra_node_agent.simulated.discovery import GPU_STATE_DIR
from dra_node_agent.simulated.fakehw import MIG_INSTANCES_FILE
from tests.unit.agent.prepare.simnode import SimulatedNode
from tests.unit.agent.prepare.test_prepare_configs import GPU, NODE, NVIDIA, entry

THREE_G = "gpu-0-mig-3g20gb-9-4"  # A100 40GB, memory slices 4-7
ONE_G_OVERLAPPING = "gpu-0-mig-1g5gb-19-6"  # memory slice 6


class Node(SimulatedNode):
    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path, profile="mig-dynamic", dynamic_mig=True)

    def mig(self) -> DynamicMig:
        mig = prepare_tools.mig_instances(self.backend)
        assert mig is not None
        return mig

    async def handler(self) -> PrepareHandler:  # type: ignore[override]
        """A fresh handler over the same hardware and state (an agent (re)start)."""
        return await super().handler(dynamic_mig=self.mig())

    def parent(self) -> str:
        device = self.backend.discover_sync().by_name()[THREE_G]
        assert device.parent_uuid is not None
        return device.parent_uuid

    def instances(self) -> list[dict[str, Any]]:
        path = self.tmp_path / "hw" / GPU_STATE_DIR / self.parent() / MIG_INSTANCES_FILE
        return list(json.loads(path.read_text())) if path.exists() else []

    def add_claim(
        self, name: str, device: str, config: dict[str, Any] | None = None, *, admin: bool = False
    ) -> ClaimRef:
        uid = f"uid-{name}"
        result: dict[str, Any] = {"request": "mig", "driver": GPU, "pool": NODE, "device": device}
        if admin:
            result["adminAccess"] = True
        self.claims.objects[name] = {
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [result],
                        "config": [entry(GPU, config)] if config else [],
                    }
                }
            },
        }
        return ClaimRef(namespace="ns", name=name, uid=uid)


async def test_the_instance_is_made_at_prepare_named_in_the_cdi_spec_and_destroyed_at_unprepare(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    ref = node.add_claim("c", THREE_G)
    result = (await handler.prepare([ref]))[ref.uid]
    assert result.error == ""
    (live,) = node.instances()
    assert live["start"] == 4
    (recorded,) = handler.store.load()
    assert recorded.state == cp.ClaimState.PREPARE_COMPLETED
    assert [(d.dynamic_mig, d.mig_uuid) for d in recorded.devices] == [(True, live["uuid"])]
    spec = next((tmp_path / "cdi").glob("*.json")).read_text()
    # The instance's UUID names it in the spec (the simulated device's variable), and the
    # container gets its capability nodes; NVIDIA_VISIBLE_DEVICES stays void, as in NVIDIA's specs.
    assert f"={live['uuid']}" in spec
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec
    assert "nvidia-caps/nvidia-cap" in spec

    assert (await handler.unprepare([ref]))[ref.uid] == ""
    assert node.instances() == []
    assert handler.store.load() == []


async def test_nvmls_refusal_fails_the_prepare_naming_claim_request_and_device_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    # The allocator never picks overlapping placements; NVML refusing one anyway (an instance made
    # behind the agent's back) must fail cleanly.
    node = Node(tmp_path)
    handler = await node.handler()
    first = node.add_claim("first", THREE_G)
    assert (await handler.prepare([first]))[first.uid].error == ""
    second = node.add_claim("second", ONE_G_OVERLAPPING)
    error = (await handler.prepare([second]))[second.uid].error
    assert "ns/second" in error
    assert "request mig" in error
    assert f"device {ONE_G_OVERLAPPING}" in error
    assert "creating the MIG device failed" in error
    assert len(node.instances()) == 1
    assert [e.name for e in handler.store.load()] == ["first"]


async def test_time_slicing_on_a_dynamic_mig_device_is_refused_before_anything_is_made(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    ref = node.add_claim("ts", THREE_G, {"apiVersion": NVIDIA, "kind": "MigDeviceConfig", "sharing": sharing})
    error = (await handler.prepare([ref]))[ref.uid].error
    assert "time-slicing does not apply to MIG" in error
    assert node.instances() == []


async def test_mps_on_a_dynamic_mig_device_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    ref = node.add_claim(
        "mps", THREE_G, {"apiVersion": NVIDIA, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}
    )
    error = (await handler.prepare([ref]))[ref.uid].error
    assert "MigDeviceConfig sharing.strategy MPS: MPS on a dynamic MIG placement is not implemented" in error
    assert node.instances() == []
    assert handler.store.load() == []


async def test_an_interrupted_prepare_is_rolled_back_and_redone_with_one_instance(tmp_path: Path) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    ref = node.add_claim("c", THREE_G)
    # A crash after the instance was made and recorded, before the CDI spec: PrepareStarted stays.
    placement = node.backend.discover_sync().by_name()[THREE_G].mig_placement
    assert placement is not None
    made = node.mig().create(placement)
    handler.store.begin(
        ref,
        [
            cp.CheckpointedDevice(
                request="mig", pool=NODE, device=THREE_G, dynamic_mig=True, mig_uuid=made.uuid
            )
        ],
    )
    restarted = await node.handler()
    assert [i["uuid"] for i in node.instances()] == [made.uuid], "a recorded instance survives the start"
    assert (await restarted.prepare([ref]))[ref.uid].error == ""
    (live,) = node.instances()
    (recorded,) = restarted.store.load()
    assert recorded.state == cp.ClaimState.PREPARE_COMPLETED
    assert recorded.devices[0].mig_uuid == live["uuid"]


async def test_an_instance_no_claim_records_is_destroyed_at_start(tmp_path: Path) -> None:
    # A crash between NVML making the instance and the checkpoint recording it.
    node = Node(tmp_path)
    await node.handler()
    placement = node.backend.discover_sync().by_name()[THREE_G].mig_placement
    assert placement is not None
    node.mig().create(placement)
    assert len(node.instances()) == 1
    await node.handler()
    assert node.instances() == []


async def test_admin_access_observes_the_instance_a_holder_made_and_never_makes_or_destroys_one(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    handler = await node.handler()
    # Nothing holds the placement: there is no instance to observe, and admin access makes none.
    early = node.add_claim("early", THREE_G, admin=True)
    error = (await handler.prepare([early]))[early.uid].error
    assert error == (
        f"ResourceClaim ns/early (uid {early.uid}): request mig: device {THREE_G}: admin access observes a "
        "dynamic MIG placement, and it has no instance: a claim that holds the placement makes it, admin "
        "access never does"
    )
    assert node.instances() == []
    assert handler.store.load() == []

    holder = node.add_claim("holder", THREE_G)
    assert (await handler.prepare([holder]))[holder.uid].error == ""
    (live,) = node.instances()
    observer = node.add_claim("observer", THREE_G, admin=True)
    assert (await handler.prepare([observer]))[observer.uid].error == ""
    # Its CDI spec names the holder's instance; it records nothing to destroy.
    assert f"={live['uuid']}" in handler.cdi.spec_path(observer.uid).read_text()  # the holder's instance
    recorded = {e.name: e for e in handler.store.load()}
    assert [(d.admin_access, d.dynamic_mig) for d in recorded["observer"].devices] == [(True, False)]
    assert node.instances() == [live]
    assert (await handler.unprepare([observer]))[observer.uid] == ""
    assert node.instances() == [live], "the observer's unprepare destroyed the holder's instance"
    assert (await handler.unprepare([holder]))[holder.uid] == ""
    assert node.instances() == []


async def test_an_admin_entry_of_an_older_agent_never_destroys_the_holders_instance(tmp_path: Path) -> None:
    # An agent before this change recorded an admin-access result on a placement as dynamic MIG
    # (it "kept" the holder's instance at prepare, and destroyed it at unprepare).
    node = Node(tmp_path)
    handler = await node.handler()
    holder = node.add_claim("holder", THREE_G)
    assert (await handler.prepare([holder]))[holder.uid].error == ""
    (live,) = node.instances()
    legacy = ClaimRef(namespace="ns", name="legacy", uid="uid-legacy")
    device = cp.CheckpointedDevice(
        request="mig", pool=NODE, device=THREE_G, admin_access=True, dynamic_mig=True, mig_uuid=live["uuid"]
    )
    handler.store.begin(legacy, [device])
    handler.store.complete(legacy.uid, [device])

    assert (await handler.unprepare([legacy]))[legacy.uid] == ""
    assert node.instances() == [live]
    assert (await handler.unprepare([holder]))[holder.uid] == ""
    assert node.instances() == []


async def test_a_second_claim_on_a_held_placement_fails_and_its_roll_back_leaves_the_instance(
    tmp_path: Path,
) -> None:
    # An allocation that names a placement another claim holds (a forged status, or a bug):
    # refused before set-up, and undoing the attempt destroys nothing.
    node = Node(tmp_path)
    handler = await node.handler()
    holder = node.add_claim("holder", THREE_G)
    assert (await handler.prepare([holder]))[holder.uid].error == ""
    (live,) = node.instances()
    second = node.add_claim("second", THREE_G)
    error = (await handler.prepare([second]))[second.uid].error
    assert f"device {NODE}/{THREE_G} is already prepared for claim ns/holder" in error
    assert node.instances() == [live]
    assert [e.name for e in handler.store.load()] == ["holder"]
