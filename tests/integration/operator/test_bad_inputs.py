"""Bad claims and classes: each gets a Warning Event and a condition; other claims keep being served."""

from __future__ import annotations

import json
from typing import Any

from dra_devcluster import LocalCluster
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
            "device class no-such-class not found",
        ),
        "too-many": (claim("too-many", ns, cls=gpu, count=9), "wants 9 of class"),
        "mixed-drivers": (
            claim("mixed-drivers", ns, cls=gpu, selectors=['device.driver == "tpu.google.com"']),
            "0 match the selectors",
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


def test_device_class_with_invalid_cel(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    """The API server refuses selectors that do not compile, so what reaches the operator is a
    selector that compiles but fails on devices: it is reported on the DeviceClass, naming the
    expression and the error, as soon as a claim uses the class."""
    refused = local_cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": f"{operators.gpu_class}-syntax"},
                "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com" &&'}}]},
            }
        ),
        check=False,
    )
    assert refused.returncode != 0
    assert "compilation failed" in refused.stderr

    ns = "op-bad-class"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-bad-class", 1)
    name = f"{operators.gpu_class}-user"
    local_cluster.apply(
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": MISSING_ATTRIBUTE}}]},
            }
        ]
    )
    scratch.append(("deviceclass", name))
    operators.start()
    local_cluster.apply(
        [
            claim(
                "uses-it",
                ns,
                cls=operators.gpu_class,
                extra_requests=[{"name": "other", "exactly": {"deviceClassName": name}}],
            )
        ]
    )

    def class_warning() -> list[dict[str, Any]]:
        events = local_cluster.get_json(
            "events", "-n", "default", f"--field-selector=involvedObject.name={name}"
        )["items"]
        return [e for e in events if e["reason"] == "InvalidSelector"]

    event = local_cluster.wait_for(class_warning, timeout=60, what="InvalidSelector event on the class")[0]
    assert MISSING_ATTRIBUTE in event["message"]
    assert "noSuchAttribute" in event["message"]
    assert event["type"] == "Warning"
