"""Pods whose extended resources (``limits: nvidia.com/gpu``) DRA serves get one Normal Event naming
the claim kube-scheduler made for them, once it is allocated; nothing for other drivers' classes,
for pods scheduled long ago (an earlier instance said it), or twice."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from dra_operator.model.cluster import ClusterModel
from dra_operator.reporters.extended import REASON, REPORT_WINDOW_S, ExtendedResourceReporter

from . import helpers as h

SCHEDULED = datetime.datetime(2026, 1, 1, 0, 0, 10, tzinfo=datetime.UTC).timestamp()


class Sink:
    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []

    def post(self, *, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.posted.append({"involved": dict(involved), "type": type_, "reason": reason, "message": message})


def extended_pod(*, claim: str = "p-extended-resources-x7k2", uid: str = "pod-uid") -> dict[str, Any]:
    """A pod as kube-scheduler leaves it after binding: its special claim in the status."""
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": uid},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:10Z"}
            ],
            "extendedResourceClaimStatus": {
                "resourceClaimName": claim,
                "requestMappings": [
                    {
                        "containerName": "main",
                        "resourceName": "nvidia.com/gpu",
                        "requestName": "container-0-request-0",
                    }
                ],
            },
        },
    }


def model_with(*, allocated: bool, cls: str = h.GPU) -> ClusterModel:
    model = ClusterModel()
    model.upsert_class(h.gpu_class())
    model.upsert_node(h.node("n1"))
    model.upsert_slice(h.gpu_slice("n1", 4))
    model.upsert_claim(
        h.claim(
            "p-extended-resources-x7k2",
            count=2,
            cls=cls,
            owner_pod=True,
            allocation=h.allocation("n1", "gpu-1", "gpu-3") if allocated else None,
        )
    )
    model.upsert_pod(extended_pod())
    return model


def test_the_pod_uses_the_claim_kube_scheduler_made_for_its_extended_resources() -> None:
    info = model_with(allocated=False).pods[("ns", "p")]
    assert info.extended_claim == "p-extended-resources-x7k2"
    assert "p-extended-resources-x7k2" in info.claims
    assert info.extended_resources == (("main", "nvidia.com/gpu"),)


def test_one_event_names_the_claim_the_resources_and_the_devices_once_allocated() -> None:
    sink = Sink()
    model = model_with(allocated=False)
    reporter = ExtendedResourceReporter(model=model, classes={h.GPU}, events=sink)
    assert reporter.sweep(now=SCHEDULED + 1) == 0  # not allocated yet: nothing to say
    model.upsert_claim(
        h.claim(
            "p-extended-resources-x7k2",
            count=2,
            owner_pod=True,
            rv="2",
            allocation=h.allocation("n1", "gpu-1", "gpu-3"),
        )
    )
    assert reporter.sweep(now=SCHEDULED + 2) == 1
    assert reporter.sweep(now=SCHEDULED + 3) == 0
    (event,) = sink.posted
    assert event["type"] == "Normal"
    assert event["reason"] == REASON
    assert event["involved"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": "ns",
        "uid": "pod-uid",
    }
    message = event["message"]
    assert "nvidia.com/gpu (container main)" in message, message
    assert "ResourceClaim ns/p-extended-resources-x7k2" in message, message
    assert "gpu.nvidia.com gpu-1, gpu.nvidia.com gpu-3 on node n1" in message, message


def test_a_claim_of_another_drivers_class_gets_no_event() -> None:
    sink = Sink()
    reporter = ExtendedResourceReporter(
        model=model_with(allocated=True, cls="other-class"), classes={h.GPU}, events=sink
    )
    assert reporter.sweep(now=SCHEDULED + 1) == 0
    assert sink.posted == []


def test_pods_scheduled_before_the_window_are_left_to_the_instance_that_saw_them() -> None:
    sink = Sink()
    reporter = ExtendedResourceReporter(model=model_with(allocated=True), classes={h.GPU}, events=sink)
    assert reporter.sweep(now=SCHEDULED + REPORT_WINDOW_S + 1) == 0
    assert sink.posted == []


def test_a_new_pod_of_the_same_name_is_reported_again_and_gone_pods_are_forgotten() -> None:
    sink = Sink()
    model = model_with(allocated=True)
    reporter = ExtendedResourceReporter(model=model, classes={h.GPU}, events=sink)
    assert reporter.sweep(now=SCHEDULED + 1) == 1
    model.remove_pod(namespace="ns", name="p")
    reporter.sweep(now=SCHEDULED + 2)
    assert len(reporter) == 0
    model.upsert_pod(extended_pod(uid="pod-uid-2"))
    assert reporter.sweep(now=SCHEDULED + 3) == 1
    assert [e["involved"]["uid"] for e in sink.posted] == ["pod-uid", "pod-uid-2"]
