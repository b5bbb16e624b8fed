from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from dra_operator.base.settings import Settings
from dra_operator.cel import compile_selector
from dra_operator.client.kubeapi import KubeApi
from dra_operator.upkeep.deviceclasses import (
    DeviceClassKeeper,
    desired_classes,
    drifted,
    invalid_selectors,
    is_managed,
)


def test_desired_classes_follow_settings_and_are_labelled() -> None:
    classes = desired_classes(Settings(gpu_class="gpus", mig_enabled=True))
    assert set(classes) == {"gpus", "tpu.google.com", "mig.nvidia.com"}
    assert all(is_managed(c) for c in classes.values())
    assert set(desired_classes(Settings())) == {"gpu.nvidia.com", "tpu.google.com"}


def test_desired_selectors_compile() -> None:
    for cls in desired_classes(Settings(mig_enabled=True)).values():
        assert invalid_selectors(cls, compiler=compile_selector) == []


def test_drift_is_selectors_and_the_extended_resource_not_config() -> None:
    want = desired_classes(Settings())["gpu.nvidia.com"]
    same = {"metadata": {"name": "gpu.nvidia.com"}, "spec": {**want["spec"], "config": [{"opaque": {}}]}}
    assert not drifted(same, want)
    changed = {"spec": {"selectors": [{"cel": {"expression": "true"}}]}}
    assert drifted(changed, want)


def test_invalid_selector_names_expression_and_error() -> None:
    obj = {"spec": {"selectors": [{"cel": {"expression": "true"}}, {"cel": {"expression": "device.nope("}}]}}
    bad = invalid_selectors(obj, compiler=compile_selector)
    assert len(bad) == 1
    index, expression, error = bad[0]
    assert (index, expression) == (1, "device.nope(")
    assert error


def test_gpu_and_tpu_classes_serve_the_device_plugins_extended_resources() -> None:
    classes = desired_classes(Settings(mig_enabled=True))
    assert classes["gpu.nvidia.com"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert classes["tpu.google.com"]["spec"]["extendedResourceName"] == "google.com/tpu"
    assert "extendedResourceName" not in classes["mig.nvidia.com"]["spec"]
    off = desired_classes(
        Settings(gpu_extended_resource_name="", tpu_extended_resource_name="example.com/tpu")
    )
    assert "extendedResourceName" not in off["gpu.nvidia.com"]["spec"]
    assert off["tpu.google.com"]["spec"]["extendedResourceName"] == "example.com/tpu"
    dropped = desired_classes(Settings(), extended_resources=False)
    assert all("extendedResourceName" not in c["spec"] for c in dropped.values())


def test_a_missing_or_other_extended_resource_is_drift_unless_it_is_switched_off() -> None:
    want = desired_classes(Settings())["gpu.nvidia.com"]
    selectors = {"selectors": want["spec"]["selectors"]}
    assert drifted({"spec": selectors}, want)
    assert drifted({"spec": {**selectors, "extendedResourceName": "example.com/gpu"}}, want)
    assert not drifted({"spec": {**selectors, "extendedResourceName": "nvidia.com/gpu"}}, want)
    off = desired_classes(Settings(gpu_extended_resource_name=""))["gpu.nvidia.com"]
    assert not drifted({"spec": {**selectors, "extendedResourceName": "example.com/gpu"}}, off)


class _ServerWithoutTheField:
    """The API calls of a server that does not know DeviceClass.spec.extendedResourceName."""

    def __init__(self) -> None:
        self.patches = 0

    async def create_device_class(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "spec": {k: v for k, v in body["spec"].items() if k != "extendedResourceName"}}

    async def patch_device_class(self, *, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.patches += 1
        return {"metadata": {"name": name}, "spec": {"selectors": body["spec"]["selectors"]}}

    async def post_event(self, **_: Any) -> None:
        return None


def test_a_server_that_drops_the_field_gets_classes_without_it_and_no_endless_repair(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = _ServerWithoutTheField()
    keeper = DeviceClassKeeper(api=cast(KubeApi, server), settings=Settings(), compiler=compile_selector)
    selectors = desired_classes(Settings())["gpu.nvidia.com"]["spec"]["selectors"]
    existing = {
        "metadata": {
            "name": "gpu.nvidia.com",
            "labels": {"app.kubernetes.io/managed-by": "accel-dra-operator"},
        },
        "spec": {"selectors": selectors},
    }
    with caplog.at_level(logging.WARNING, logger="dra_operator.upkeep.deviceclasses"):
        asyncio.run(keeper.reconcile(name="gpu.nvidia.com", obj=existing))
        asyncio.run(keeper.reconcile(name="gpu.nvidia.com", obj=existing))
    assert server.patches == 1  # tried once; the second event finds nothing to repair
    assert not keeper.extended_resources
    assert "dropped DeviceClass.spec.extendedResourceName" in caplog.text
