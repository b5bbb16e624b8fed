"""The operator's TpuSliceMixed Events: pods of one Job bound to hosts of two physical TPU slices
(the sliceId their hosts publish) each get one Warning naming which workers are where; a Job on one
slice, a single pod, GPU-only Jobs and unallocated claims get nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_operator.model.cluster import ClusterModel
from dra_operator.reporters.tpuslices import REASON, MixedSliceReporter

TPU = "tpu.google.com"
NS = "ml"


class Sink:
    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []

    def post(self, *, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.posted.append({"involved": dict(involved), "type": type_, "reason": reason, "message": message})


def host_slice(node: str, *, slice_id: str | None, worker: int) -> dict[str, Any]:
    attributes: dict[str, Any] = {"tpuGen": {"string": "v5p"}, "workerId": {"int": worker}}
    if slice_id is not None:
        attributes["sliceId"] = {"string": slice_id}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-tpu", "resourceVersion": "1"},
        "spec": {
            "driver": TPU,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"accel{i}", "attributes": attributes} for i in range(4)],
        },
    }


def claim(name: str, *, node: str | None, driver: str = TPU) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {
            "devices": {"requests": [{"name": "tpu", "exactly": {"deviceClassName": "tpu.google.com"}}]}
        },
    }
    if node is not None:
        results = [
            {"request": "tpu", "driver": driver, "pool": node, "device": f"accel{i}"} for i in range(4)
        ]
        obj["status"] = {"allocation": {"devices": {"results": results}}}
    return obj


def pod(job: str, index: int, *, node: str | None) -> dict[str, Any]:
    name = f"{job}-{index}-x"
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": {"batch.kubernetes.io/job-name": job},
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
        },
        "spec": {"nodeName": node} if node else {},
        "status": {
            "phase": "Pending",
            "resourceClaimStatuses": [{"name": "tpu", "resourceClaimName": f"{name}-tpu"}],
        },
    }


def model_with(placement: dict[int, str | None], *, job: str = "train") -> ClusterModel:
    model = ClusterModel()
    for w in range(4):
        model.upsert_slice(host_slice(f"a{w}", slice_id="slice-a", worker=w))
        model.upsert_slice(host_slice(f"b{w}", slice_id="slice-b", worker=w))
    for index, node in placement.items():
        model.upsert_claim(claim(f"{job}-{index}-x-tpu", node=node))
        model.upsert_pod(pod(job, index, node=node))
    return model


def test_a_job_across_two_slices_warns_every_pod_once_naming_workers_slices_and_nodes() -> None:
    sink = Sink()
    reporter = MixedSliceReporter(
        model=model_with({0: "a0", 1: "a1", 2: "b2", 3: "a3"}), driver=TPU, events=sink
    )
    assert reporter.sweep() == 4
    assert reporter.sweep() == 0
    assert {e["involved"]["name"] for e in sink.posted} == {f"train-{i}-x" for i in range(4)}
    assert {(e["type"], e["reason"]) for e in sink.posted} == {("Warning", REASON)}
    message = sink.posted[0]["message"]
    assert "the pods of Job ml/train are on hosts of 2 physical TPU slices" in message, message
    assert "worker 0, worker 1, worker 3 on slice slice-a (nodes a0, a1, a3)" in message, message
    assert "worker 2 on slice slice-b (nodes b2)" in message, message
    assert "sliceId" in message, message


def test_a_job_on_one_slice_or_alone_or_not_yet_placed_gets_nothing() -> None:
    for placement in ({0: "a0", 1: "a1", 2: "a2", 3: "a3"}, {0: "b0"}, {0: "a0", 1: None, 2: None}):
        sink = Sink()
        assert MixedSliceReporter(model=model_with(placement), driver=TPU, events=sink).sweep() == 0
        assert sink.posted == []


def test_a_pod_bound_later_to_another_slice_is_reported_then_and_gone_pods_are_forgotten() -> None:
    sink = Sink()
    model = model_with({0: "a0", 1: "a1"})
    reporter = MixedSliceReporter(model=model, driver=TPU, events=sink)
    assert reporter.sweep() == 0
    model.upsert_claim(claim("train-2-x-tpu", node="b2"))
    model.upsert_pod(pod("train", 2, node="b2"))
    assert reporter.sweep() == 3
    model.remove_pod(namespace=NS, name="train-2-x")
    reporter.sweep()
    assert len(reporter) == 2


def test_devices_of_another_driver_and_hosts_without_a_slice_id_are_not_slices() -> None:
    model = model_with({0: "a0"})
    model.upsert_slice(host_slice("c0", slice_id=None, worker=0))
    model.upsert_claim(claim("train-1-x-tpu", node="c0"))
    model.upsert_pod(pod("train", 1, node="c0"))
    model.upsert_claim(claim("train-2-x-tpu", node="b2", driver="gpu.nvidia.com"))
    model.upsert_pod(pod("train", 2, node="b2"))
    sink = Sink()
    assert MixedSliceReporter(model=model, driver=TPU, events=sink).sweep() == 0
