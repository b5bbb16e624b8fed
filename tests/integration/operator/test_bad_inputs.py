"""Bad claims and classes: each gets a Warning Event and a condition; other claims keep being served."""

from __future__ import annotations

import json
from typing import Any

from dra_api.localcluster import LocalCluster
from tests.integration.operator.conftest import Operators, assert_no_double_booking, claims_json, events_for
from tests.integration.operator.objects import (
    CONDITION_ANNOTATION,
    OPERATOR_FINALIZER,
    add_gpu_node,
    claim,
)

MISSING_ATTRIBUTE = 'device.attributes["gpu.nvidia.com"].noSuchAttribute == "x"'


def _warning(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any] | None:
    warnings = [e for e in events_for(cluster, ns, name) if e["type"] == "Warning"]
    return warnings[-1] if warnings else None


def test_bad_claims_are_explained_and_do_not_block_others(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    ns = "op-bad"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-bad-a", 2)
    broken_class = f"{operators.gpu_class}-broken"
    local_cluster.apply(
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": broken_class},
                "spec": {"selectors": [{"cel": {"expression": MISSING_ATTRIBUTE}}]},
            }
        ]
    )
    scratch.append(("deviceclass", broken_class))
    operators.start()
    gpu = operators.gpu_class
    bad = {
        "bad-cel": (claim("bad-cel", ns, cls=gpu, selectors=[MISSING_ATTRIBUTE]), "noSuchAttribute"),
        "unknown-class": (
            claim(
                "unknown-class",
                ns,
                cls=gpu,
                extra_requests=[{"name": "other", "exactly": {"deviceClassName": "no-such-class"}}],
            ),
            "DeviceClass no-such-class not found",
        ),
        "too-many": (claim("too-many", ns, cls=gpu, count=9), "needs 9 devices on one node"),
        "mixed-drivers": (
            claim("mixed-drivers", ns, cls=gpu, selectors=['device.driver == "tpu.google.com"']),
            "no node can satisfy",
        ),
        "unknown-config": (
            claim("unknown-config", ns, cls=gpu, config_driver="fpga.example.com"),
            "opaque.driver 'fpga.example.com'",
        ),
        "broken-class": (
            claim(
                "broken-class",
                ns,
                cls=gpu,
                extra_requests=[{"name": "other", "exactly": {"deviceClassName": broken_class}}],
            ),
            "noSuchAttribute",
        ),
    }
    local_cluster.apply([obj for obj, _ in bad.values()])
    local_cluster.apply([claim("good", ns, cls=gpu, count=2)])

    for name, (_, expected) in bad.items():
        event = local_cluster.wait_for(
            lambda n=name: _warning(local_cluster, ns, n), timeout=60, what=f"Warning event on {name}"
        )
        assert expected in event["message"], (name, event["message"])
        obj = local_cluster.get_json("resourceclaim", name, "-n", ns)
        condition = json.loads(obj["metadata"]["annotations"][CONDITION_ANNOTATION])
        assert condition["type"] == "Allocated"
        assert condition["status"] == "False"
        assert expected in condition["message"]
        # Nothing half-written: no allocation, no finalizer of ours.
        assert not obj.get("status", {}).get("allocation")
        assert OPERATOR_FINALIZER not in obj["metadata"].get("finalizers", [])

    good = local_cluster.wait_for(
        lambda: (
            (c := local_cluster.get_json("resourceclaim", "good", "-n", ns))
            .get("status", {})
            .get("allocation")
            and c
        ),
        timeout=60,
        what="good claim allocated",
    )
    assert good
    assert_no_double_booking(claims_json(local_cluster, ns))

    # A fixed cluster is noticed without polling: a node big enough arrives, the big claim fits.
    add_gpu_node(local_cluster, scratch, "op-bad-big", 9)
    local_cluster.wait_for(
        lambda: (
            local_cluster.get_json("resourceclaim", "too-many", "-n", ns).get("status", {}).get("allocation")
        ),
        timeout=60,
        what="too-many allocated once a node with 9 GPUs exists",
    )
    fixed = local_cluster.get_json("resourceclaim", "too-many", "-n", ns)
    assert CONDITION_ANNOTATION not in fixed["metadata"].get("annotations", {})


def test_device_class_with_invalid_cel_is_reported(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    """The API server compiles selectors too; what it lets through but cannot run (here a
    selector that is not boolean for some devices... or that names an attribute devices lack) is
    reported on the class by the operator when the class's selectors fail to compile in its
    environment, and on every claim that uses it."""
    name = f"{operators.gpu_class}-user"
    bad_expression = 'device.driver == "gpu.nvidia.com" &&'
    result = local_cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": bad_expression}}]},
            }
        ),
        check=False,
    )
    scratch.append(("deviceclass", name))
    operators.start()
    if result.returncode != 0:
        # The API server refused it; the operator's own check is covered by the unit tests.
        assert "compilation failed" in result.stderr or "Syntax error" in result.stderr, result.stderr
        return
    event = local_cluster.wait_for(
        lambda: [
            e
            for e in local_cluster.get_json(
                "events", "-n", "default", f"--field-selector=involvedObject.name={name}"
            )["items"]
            if e["reason"] == "InvalidSelector"
        ],
        timeout=60,
        what="InvalidSelector event",
    )[0]
    assert bad_expression in event["message"]
