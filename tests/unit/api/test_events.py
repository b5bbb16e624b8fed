"""The one Event body both programs post."""

from __future__ import annotations

from dra_api.events import MAX_MESSAGE, event_body


def test_an_event_about_a_claim_goes_to_its_namespace() -> None:
    body = event_body(
        involved={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "name": "c",
            "namespace": "ns",
            "uid": "",
        },
        type_="Warning",
        reason="NoFit",
        message="x" * 5000,
        component="accel-dra-operator",
        instance="op-0" * 100,
    )
    assert body["metadata"] == {"generateName": "c.", "namespace": "ns"}
    assert "uid" not in body["involvedObject"]  # empty fields are left out
    assert len(body["message"]) == MAX_MESSAGE
    assert len(body["reportingInstance"]) == 128
    assert body["source"] == {"component": "accel-dra-operator"}
    assert body["firstTimestamp"] == body["lastTimestamp"]


def test_an_event_about_a_node_names_the_host_and_lands_in_default() -> None:
    body = event_body(
        involved={"apiVersion": "v1", "kind": "Node", "name": "n1"},
        type_="Warning",
        reason="DeviceUnhealthy",
        message="gpu-0: XID 79",
        component="accel-dra-node-agent",
        instance="n1",
        host="n1",
    )
    assert body["metadata"]["namespace"] == "default"
    assert body["source"] == {"component": "accel-dra-node-agent", "host": "n1"}
