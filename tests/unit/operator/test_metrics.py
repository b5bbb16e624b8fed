from __future__ import annotations

from prometheus_client import generate_latest

from dra_operator.model.cluster import ClusterModel
from dra_operator.model.metrics import Metrics
from tests.unit.operator.helpers import allocation, claim, gpu_class, gpu_slice


def _scrape(metrics: Metrics) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out


def test_claims_and_devices_are_counted_from_the_model() -> None:
    model = ClusterModel()
    model.upsert_class(gpu_class())
    model.upsert_slice(gpu_slice("n1", 3))
    model.upsert_claim(claim("a", allocation=allocation("n1", "gpu-0")))
    model.upsert_claim(claim("b"))
    model.upsert_claim(claim("c"))
    metrics = Metrics()
    metrics.attach_model(model, lambda: frozenset({("ns", "c")}))
    metrics.allocation_failures.labels("NoFit").inc()
    metrics.allocation_latency.observe(0.3)
    seen = _scrape(metrics)
    assert seen['dra_operator_claims{state="allocated_by_others"}'] == 1
    assert seen['dra_operator_claims{state="pending"}'] == 1
    assert seen['dra_operator_claims{state="unallocatable"}'] == 1
    assert seen['dra_operator_devices{driver="gpu.nvidia.com"}'] == 3
    assert seen['dra_operator_class_devices{device_class="gpu.nvidia.com"}'] == 3
    assert seen['dra_operator_devices_allocated{device_class="gpu.nvidia.com",driver="gpu.nvidia.com"}'] == 1
    assert seen['dra_operator_allocation_failures_total{reason="NoFit"}'] == 1
    assert seen["dra_operator_allocation_duration_seconds_count"] == 1
