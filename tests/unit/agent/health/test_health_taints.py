"""Taint rendering and how tainted devices go into a slice."""

from __future__ import annotations

from dra_api.times import rfc3339
from dra_node_agent.health.state import Problem, ProblemKind
from dra_node_agent.health.taints import TaintEffect, decorate_devices, label_value, render_taints


def problem(kind: ProblemKind, value: str, first: float) -> Problem:
    return Problem(kind=kind, value=value, message="", first_seen=first, last_seen=first)


def test_render_taints_keys_values_effect_and_time() -> None:
    taints = render_taints(
        driver="gpu.nvidia.com",
        problems=[problem(ProblemKind.GPU_LOST, "", 200), problem(ProblemKind.XID, "79", 100)],
        effect=TaintEffect.NO_SCHEDULE,
    )
    assert taints == [
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule", "timeAdded": rfc3339(100)},
        {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule", "timeAdded": rfc3339(200)},
    ]
    assert rfc3339(1_800_000_000) == "2027-01-15T08:00:00Z"


def test_no_execute_effect_and_label_values() -> None:
    (taint,) = render_taints(
        driver="tpu.google.com",
        problems=[problem(ProblemKind.UNHEALTHY, "device node missing!", 0)],
        effect=TaintEffect.NO_EXECUTE,
    )
    assert taint["key"] == "tpu.google.com/unhealthy"
    assert taint["value"] == "device-node-missing"
    assert taint["effect"] == "NoExecute"
    assert label_value("x" * 80 + "-") == "x" * 63


def test_at_most_sixteen_taints_per_device() -> None:
    many = [problem(ProblemKind.XID, str(i), i) for i in range(20)]
    taints = render_taints(driver="gpu.nvidia.com", problems=many, effect=TaintEffect.NO_SCHEDULE)
    assert [t["value"] for t in taints] == [str(i) for i in range(16)]


def test_decorate_adds_taints_or_leaves_the_device_out() -> None:
    devices = [{"name": "gpu-0", "attributes": {}}, {"name": "gpu-1", "attributes": {}}]
    taints = {"gpu-1": [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}]}
    assert decorate_devices(devices, taints=taints, taints_supported=True) == [
        {"name": "gpu-0", "attributes": {}},
        {"name": "gpu-1", "attributes": {}, "taints": taints["gpu-1"]},
    ]
    assert decorate_devices(devices, taints=taints, taints_supported=False) == [
        {"name": "gpu-0", "attributes": {}}
    ]
    assert "taints" not in devices[1]  # the inputs are not changed
