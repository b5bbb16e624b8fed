"""A corrupt checkpoint is reported to the cluster: one CheckpointCorrupted Warning Event on the Node,
``dra_agent_checkpoint_corrupt`` at 1, and back to 0 after the documented reset (file moved aside,
agent restarted), after which the kubelet's prepare succeeds again.

The agent is a real subprocess with the project's ClusterRole, so the Event is created under the
agent's own RBAC; the kubelet's side is the test kubelet client over the real sockets.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_api.kubeletapi.model import ClaimRef
from dra_devcluster import LocalCluster

from .agentproc import GPU, AgentProcess
from .conftest import wait_until
from .test_agent_faults import allocated_pod_claim, prepare, unprepare

pytestmark = pytest.mark.cluster

REASON = "CheckpointCorrupted"


def corrupted_events(cluster: LocalCluster, node: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json(
        "events",
        "-n",
        "default",
        f"--field-selector=involvedObject.name={node},involvedObject.kind=Node,reason={REASON}",
    )["items"]
    return items


async def test_corrupt_checkpoint_warns_on_the_node_and_in_metrics_until_reset(
    local_cluster: LocalCluster, agent: AgentProcess, node: str, namespace: str, device_classes: Any
) -> None:
    agent.start()
    ref = allocated_pod_claim(local_cluster, agent, node, namespace)
    assert (await prepare(agent, ref)).error == ""
    assert agent.metric("dra_agent_checkpoint_corrupt", driver=GPU) == 0.0
    agent.kill()
    checkpoint = agent.dirs.checkpoint()
    raw = bytearray(checkpoint.read_bytes())
    raw[raw.index(b"PrepareCompleted")] = ord("X")  # one flipped byte inside the checksummed data
    checkpoint.write_bytes(bytes(raw))

    agent.start()
    assert agent.metric("dra_agent_checkpoint_corrupt", driver=GPU) == 1.0
    # The kubelet retrying, and other claims, are refused again and again: still one Event.
    other = ClaimRef(namespace=namespace, name="other", uid="00000000-0000-4000-8000-000000000001")
    for claim in (ref, other, ref):
        assert "checkpoint is corrupt" in (await prepare(agent, claim)).error
    assert "checkpoint is corrupt" in await unprepare(agent, ref)
    (event,) = wait_until(
        lambda: corrupted_events(local_cluster, node), timeout=60, what=f"a {REASON} Event on {node}"
    )
    assert event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == local_cluster.get_json("node", node)["metadata"]["uid"]
    assert event["reportingComponent"] == event["source"]["component"] == GPU
    message = event["message"]
    assert f"Checkpoint {checkpoint} of driver {GPU} cannot be trusted: checksum mismatch" in message
    assert f"Every prepare and unprepare of {GPU} claims on this node fails closed" in message
    assert "'Recovering from a corrupt checkpoint' in accel-dra's docs/operations.md" in message
    assert checkpoint.read_bytes() == bytes(raw)  # never discarded by the agent

    # The documented reset: move the file aside, restart the agent.
    assert agent.stop() == 0  # SIGTERM lets Events still being posted finish
    checkpoint.rename(checkpoint.with_name("checkpoint.json.corrupt-test"))
    agent.start()
    assert agent.metric("dra_agent_checkpoint_corrupt", driver=GPU) == 0.0
    assert (await prepare(agent, ref)).error == ""  # the kubelet's next prepare records it afresh
    assert list(agent.dirs.checkpoint_claims()) == [ref.uid]
    assert len(corrupted_events(local_cluster, node)) == 1
