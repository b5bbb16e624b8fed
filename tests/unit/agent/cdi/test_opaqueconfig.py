"""Strict validation of the drivers' opaque config parameters (inputs to prepare, like CDI its output)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_node_agent.opaqueconfig import (
    GpuConfig,
    MigDeviceConfig,
    MpsConfig,
    OpaqueConfigError,
    OpaqueConfigParser,
    Sharing,
    TpuConfig,
    effective,
)

GPU = "gpu.nvidia.com"
TPU = "tpu.google.com"
parser = OpaqueConfigParser()


def gpu_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", **fields}


def test_nvidia_time_slicing_config() -> None:
    config = parser.parse(
        driver=GPU,
        parameters=gpu_config(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
    )
    assert config == GpuConfig(sharing=Sharing(strategy="TimeSlicing", time_slice_interval="Long"))


def test_nvidia_mps_config_from_json_text() -> None:
    raw = json.dumps(
        gpu_config(
            sharing={
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 50,
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"},
                },
            }
        )
    )
    config = parser.parse(driver=GPU, parameters=raw.encode())
    assert config == GpuConfig(
        sharing=Sharing(
            strategy="MPS",
            mps=MpsConfig(
                default_active_thread_percentage=50,
                default_pinned_device_memory_limit="10Gi",
                default_per_device_pinned_memory_limit={"0": "5Gi"},
            ),
        )
    )


def test_alias_api_version_and_mig_kind() -> None:
    config = parser.parse(
        driver=GPU,
        parameters={
            "apiVersion": "gpu.nvidia.com/v1beta1",
            "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS"},
        },
    )
    assert config == MigDeviceConfig(sharing=Sharing(strategy="MPS"))


def test_tpu_config() -> None:
    config = parser.parse(
        driver=TPU,
        parameters={
            "apiVersion": "tpu.google.com/v1alpha1",
            "kind": "TpuConfig",
            "workerId": 1,
            "workerHostnames": ["w-0.svc", "w-1.svc"],
            "iciResiliency": False,
        },
    )
    assert config == TpuConfig(worker_id=1, worker_hostnames=("w-0.svc", "w-1.svc"), ici_resiliency=False)


@pytest.mark.parametrize(
    ("driver", "parameters", "message"),
    [
        (
            GPU,
            gpu_config(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Long"}}),
            "parameters.sharing.timeSlicingConfig.intervall: unknown field",
        ),
        (GPU, gpu_config(shareing={}), "parameters.shareing: unknown field"),
        (
            GPU,
            gpu_config(sharing={"strategy": "Exclusive"}),
            "parameters.sharing.strategy: 'Exclusive' is not one of TimeSlicing, MPS",
        ),
        (
            GPU,
            gpu_config(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}),
            "parameters.sharing.mpsConfig.defaultActiveThreadPercentage: must be an integer, not a string",
        ),
        (
            GPU,
            gpu_config(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
            "defaultActiveThreadPercentage: 101 is out of range (1..100)",
        ),
        (
            GPU,
            gpu_config(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}),
            "defaultPinnedDeviceMemoryLimit: 'lots' is not a non-negative quantity",
        ),
        (
            GPU,
            gpu_config(sharing={"strategy": "MPS", "timeSlicingConfig": {}}),
            "parameters.sharing.timeSlicingConfig: only allowed with strategy TimeSlicing",
        ),
        (GPU, gpu_config(sharing={}), "parameters.sharing.strategy: required"),
        (GPU, gpu_config(sharing="MPS"), "parameters.sharing: must be an object, not a string"),
        (
            GPU,
            {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "TpuConfig"},
            "parameters.kind: unknown kind 'TpuConfig' (expected GpuConfig, MigDeviceConfig)",
        ),
        (GPU, {"kind": "GpuConfig"}, "parameters.apiVersion: required"),
        (
            GPU,
            {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
            "parameters.apiVersion: 'resource.nvidia.com/v1' is not one of",
        ),
        (GPU, [], "parameters: must be an object, not a list"),
        (GPU, b"{not json", "parameters: not valid JSON"),
        (
            GPU,
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "MigDeviceConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}},
            },
            "timeSlicingConfig: unknown field (time-slicing does not apply to MIG)",
        ),
        (
            TPU,
            {"apiVersion": "tpu.google.com/v1alpha1", "kind": "TpuConfig", "workerId": -1},
            "parameters.workerId: -1 is out of range (>= 0)",
        ),
        (
            TPU,
            {
                "apiVersion": "tpu.google.com/v1alpha1",
                "kind": "TpuConfig",
                "workerId": 2,
                "workerHostnames": ["a"],
            },
            "parameters.workerId: 2 has no entry in workerHostnames",
        ),
        (
            TPU,
            {"apiVersion": "tpu.google.com/v1alpha1", "kind": "TpuConfig", "iciResiliency": "yes"},
            "parameters.iciResiliency: must be a boolean, not a string",
        ),
        (
            TPU,
            {"apiVersion": "tpu.google.com/v1alpha1", "kind": "TpuConfig", "workerHostnames": ["bad host"]},
            "parameters.workerHostnames[0]: 'bad host' is not a hostname",
        ),
        ("fpga.example.com", {}, "driver 'fpga.example.com' is not handled"),
    ],
)
def test_invalid_parameters_name_the_field(driver: str, parameters: Any, message: str) -> None:
    with pytest.raises(OpaqueConfigError) as caught:
        parser.parse(driver=driver, parameters=parameters)
    assert message in str(caught.value)


def test_allocation_configs_skip_other_drivers_and_order_class_before_claim() -> None:
    long = gpu_config(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
    short = gpu_config(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}})
    configs = [
        {"source": "FromClaim", "requests": ["gpus"], "opaque": {"driver": GPU, "parameters": short}},
        {
            "source": "FromClaim",
            "opaque": {"driver": "net.example.com", "parameters": {"anything": ["goes"]}},
        },
        {"source": "FromClass", "opaque": {"driver": GPU, "parameters": long}},
    ]
    found = parser.for_driver(driver=GPU, configs=configs, where="claim ns/c")
    assert [c.source for c in found] == ["FromClass", "FromClaim"]
    chosen = effective(found, request="gpus", device_kind="gpu")
    assert isinstance(chosen, GpuConfig)
    assert chosen.sharing is not None
    assert chosen.sharing.time_slice_interval == "Short"  # the claim overrides the class
    other = effective(found, request="other", device_kind="gpu")
    assert isinstance(other, GpuConfig)
    assert other.sharing is not None
    assert other.sharing.time_slice_interval == "Long"
    assert effective(found, request="gpus/sub", device_kind="gpu") == chosen
    assert effective(found, request="gpus", device_kind="mig") is None


def test_allocation_config_errors_point_at_the_entry() -> None:
    configs = [{"opaque": {"driver": GPU, "parameters": gpu_config(extra=1)}}]
    with pytest.raises(
        OpaqueConfigError, match=r"claim ns/c.config\[0\].opaque.parameters.extra: unknown field"
    ):
        parser.for_driver(driver=GPU, configs=configs, where="claim ns/c")
