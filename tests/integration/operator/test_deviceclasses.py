"""The driver's DeviceClasses: created, repaired on drift, recreated; a user's class is left alone."""

from __future__ import annotations

import json
from typing import Any

from dra_devcluster import LocalCluster
from tests.integration.operator.conftest import Operators

MANAGED = "app.kubernetes.io/managed-by"


def _selectors(cluster: LocalCluster, name: str) -> list[dict[str, Any]] | None:
    result = cluster.kubectl("get", "deviceclass", name, "-o", "json", check=False)
    if result.returncode != 0:
        return None
    selectors: list[dict[str, Any]] = json.loads(result.stdout)["spec"]["selectors"]
    return selectors


def _extended(cluster: LocalCluster, name: str) -> str | None:
    spec = cluster.get_json("deviceclass", name).get("spec") or {}
    value = spec.get("extendedResourceName")
    return str(value) if value is not None else None


def test_managed_classes_are_kept_and_user_classes_left_alone(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    # A class with the TPU class's name made by a user before the operator starts.
    user_selectors = [{"cel": {"expression": 'device.driver == "tpu.google.com" && true'}}]
    local_cluster.apply(
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": operators.tpu_class},
                "spec": {"selectors": user_selectors},
            }
        ]
    )
    scratch.append(("deviceclass", operators.tpu_class))
    operators.start()
    gpu = operators.gpu_class
    wanted = local_cluster.wait_for(lambda: _selectors(local_cluster, gpu), what="GPU class created")
    assert 'device.attributes["gpu.nvidia.com"].type == "gpu"' in wanted[0]["cel"]["expression"]
    # It serves device-plugin style pods (`limits: nvidia.com/gpu`), and keeps doing so.
    assert _extended(local_cluster, gpu) == "nvidia.com/gpu"
    local_cluster.kubectl(
        "patch",
        "deviceclass",
        gpu,
        "--type=json",
        "-p",
        json.dumps([{"op": "remove", "path": "/spec/extendedResourceName"}]),
    )
    local_cluster.wait_for(
        lambda: _extended(local_cluster, gpu) == "nvidia.com/gpu",
        timeout=60,
        what="extended resource put back",
    )

    # Drift: someone edits the managed class's selectors; the operator puts them back.
    local_cluster.kubectl(
        "patch",
        "deviceclass",
        gpu,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"selectors": [{"cel": {"expression": "true"}}]}}),
    )
    local_cluster.wait_for(
        lambda: _selectors(local_cluster, gpu) == wanted, timeout=60, what="drift repaired"
    )

    # Deleted: recreated.
    local_cluster.kubectl("delete", "deviceclass", gpu)
    local_cluster.wait_for(
        lambda: _selectors(local_cluster, gpu) == wanted, timeout=60, what="class recreated"
    )

    # The user's class kept its selectors and got no label.
    assert _selectors(local_cluster, operators.tpu_class) == user_selectors
    labels = local_cluster.get_json("deviceclass", operators.tpu_class)["metadata"].get("labels") or {}
    assert MANAGED not in labels
