"""Strict validation of the drivers' opaque config parameters (inputs to prepare, like CDI its output)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from dra_node_agent.opaqueconfig import (
    ComputeDomainChannelConfig,
    ComputeDomainDaemonConfig,
    GoogleTpuConfig,
    GpuConfig,
    IommuConfig,
    MigDeviceConfig,
    MpsConfig,
    OpaqueConfigError,
    OpaqueConfigParser,
    Sharing,
    TpuConfig,
    TpuLogging,
    VfioDeviceConfig,
    effective,
    effective_entry,
    not_implemented,
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
    # NVIDIA's Normalize gives MPS without settings an empty mpsConfig.
    assert config == MigDeviceConfig(sharing=Sharing(strategy="MPS", mps=MpsConfig()))


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
            'parameters.sharing.timeSlicingConfig.intervall: unknown field "intervall"',
        ),
        (GPU, gpu_config(shareing={}), 'parameters.shareing: unknown field "shareing"'),
        (
            GPU,
            gpu_config(sharing={"strategy": "Exclusive"}),
            "parameters.sharing.strategy: unknown GPU sharing strategy: Exclusive",
        ),
        (
            GPU,
            gpu_config(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}),
            "parameters.sharing.mpsConfig.defaultActiveThreadPercentage: must be an integer, not a string",
        ),
        (
            GPU,
            gpu_config(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
            "defaultActiveThreadPercentage: active thread percentage must not be greater than 100",
        ),
        (
            GPU,
            gpu_config(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}),
            'defaultPinnedDeviceMemoryLimit: "lots" is not a non-negative quantity',
        ),
        (
            GPU,
            gpu_config(sharing={"strategy": "MPS", "timeSlicingConfig": {}}),
            "parameters.sharing.timeSlicingConfig: cannot use TimeSlicingConfig with the 'MPS' strategy",
        ),
        (GPU, gpu_config(sharing={}), "parameters.sharing.strategy: required"),
        (GPU, gpu_config(sharing="MPS"), "parameters.sharing: must be an object, not a string"),
        (
            GPU,
            {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "TpuConfig"},
            'parameters.kind: no kind "TpuConfig" is registered for version "resource.nvidia.com/v1beta1" '
            "(expected GpuConfig, MigDeviceConfig, VfioDeviceConfig)",
        ),
        (GPU, {"kind": "GpuConfig"}, "parameters.apiVersion: required"),
        (
            GPU,
            {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
            'parameters.apiVersion: "resource.nvidia.com/v1" is not one of',
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
            'timeSlicingConfig: unknown field "timeSlicingConfig" (time-slicing does not apply to MIG)',
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
            'parameters.workerHostnames[0]: "bad host" is not a hostname',
        ),
        ("fpga.example.com", {}, 'driver "fpga.example.com" is not handled'),
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
    # An entry for every request skips devices of another kind; one naming the request is an error
    # there (NVIDIA: "cannot apply GpuConfig to device ... of type ...").
    assert effective(found, request="other", device_kind="mig") is None
    with pytest.raises(
        OpaqueConfigError,
        match=r"config\[0\]: cannot apply GpuConfig to device 'mig-0' of type 'mig' \(request: gpus\)",
    ):
        effective_entry(found, request="gpus", device_kind="mig", device_name="mig-0")


def test_allocation_config_errors_point_at_the_entry() -> None:
    configs = [{"opaque": {"driver": GPU, "parameters": gpu_config(extra=1)}}]
    with pytest.raises(
        OpaqueConfigError, match=r"claim ns/c.config\[0\].opaque.parameters.extra: unknown field"
    ):
        parser.for_driver(driver=GPU, configs=configs, where="claim ns/c")


# --- every kind the vendors' current drivers accept, with their defaults -------------------------


def parse_gpu(kind: str, **fields: Any) -> Any:
    return parser.parse(
        driver=GPU, parameters={"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, **fields}
    )


def parse_tpu(api_version: str, **fields: Any) -> Any:
    return parser.parse(driver=TPU, parameters={"apiVersion": api_version, "kind": "TpuConfig", **fields})


def test_nvidia_defaults_follow_normalize() -> None:
    # No sharing: nothing asked (NVIDIA's default with its sharing gates off).
    assert parse_gpu("GpuConfig") == GpuConfig(sharing=None)
    assert parse_gpu("MigDeviceConfig") == MigDeviceConfig(sharing=None)
    # TimeSlicing without settings means the Default interval; MPS without settings an empty config.
    assert parse_gpu("GpuConfig", sharing={"strategy": "TimeSlicing"}) == GpuConfig(
        sharing=Sharing(strategy="TimeSlicing", time_slice_interval="Default")
    )
    mps = parse_gpu("GpuConfig", sharing={"strategy": "MPS"})
    assert mps == GpuConfig(sharing=Sharing(strategy="MPS", mps=MpsConfig()))
    assert mps.sharing.mps.multi_user is False


def test_nvidia_mps_multi_user_and_zero_percentage() -> None:
    config = parse_gpu(
        "MigDeviceConfig",
        sharing={"strategy": "MPS", "mpsConfig": {"multiUser": True, "defaultActiveThreadPercentage": 0}},
    )
    assert config == MigDeviceConfig(
        sharing=Sharing(strategy="MPS", mps=MpsConfig(default_active_thread_percentage=0, multi_user=True))
    )


def test_nvidia_vfio_config_and_its_iommu_defaults() -> None:
    assert parse_gpu("VfioDeviceConfig") == VfioDeviceConfig(
        iommu=IommuConfig(backend_policy="LegacyOnly", enable_api_device=False)
    )
    assert parse_gpu("VfioDeviceConfig", iommu={}) == VfioDeviceConfig()
    assert parse_gpu(
        "VfioDeviceConfig", iommu={"backendPolicy": "PreferIommuFD", "enableAPIDevice": True}
    ) == VfioDeviceConfig(iommu=IommuConfig(backend_policy="PreferIommuFD", enable_api_device=True))


def test_google_tpu_logging_config_and_its_defaults() -> None:
    assert parse_tpu("tpu.resource.google.com/v1alpha1") == GoogleTpuConfig(logging=None)
    # stderrLevel defaults to level (Google's Normalize).
    both = parse_tpu("tpu.resource.google.com/v1alpha1", logging={"level": 2})
    assert both == GoogleTpuConfig(logging=TpuLogging(level=2, stderr_level=2))
    assert both.env() == ("TPU_MIN_LOG_LEVEL=2", "TPU_STDERR_LOG_LEVEL=2")
    split = parse_tpu("tpu.resource.google.com/v1alpha1", logging={"level": 0, "stderrLevel": 3})
    assert split.env() == ("TPU_MIN_LOG_LEVEL=0", "TPU_STDERR_LOG_LEVEL=3")
    only_stderr = parse_tpu("tpu.resource.google.com/v1alpha1", logging={"stderrLevel": 1})
    assert only_stderr.env() == ("TPU_STDERR_LOG_LEVEL=1",)
    assert GoogleTpuConfig().env() == ()


@pytest.mark.parametrize(
    ("driver", "parameters", "message"),
    [
        (
            GPU,
            gpu_config(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}),
            "parameters.sharing.timeSlicingConfig.interval: unknown time-slice interval: Forever",
        ),
        (
            GPU,
            gpu_config(sharing={"strategy": "TimeSlicing", "mpsConfig": {}}),
            "parameters.sharing.mpsConfig: cannot use MpsConfig with the 'TimeSlicing' strategy",
        ),
        (
            GPU,
            gpu_config(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": -1}}),
            "defaultActiveThreadPercentage: active thread percentage must not be negative",
        ),
        (
            GPU,
            gpu_config(sharing={"strategy": "MPS", "mpsConfig": {"multiUser": "yes"}}),
            "parameters.sharing.mpsConfig.multiUser: must be a boolean, not a string",
        ),
        (
            GPU,
            gpu_config(sharing={"strategy": "MPS", "mpsConfig": {"multiuser": True}}),
            'parameters.sharing.mpsConfig.multiuser: unknown field "multiuser"',
        ),
        (
            GPU,
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "VfioDeviceConfig",
                "iommu": {"backendPolicy": "Any"},
            },
            'parameters.iommu.backendPolicy: unknown IOMMU backend policy: "Any"',
        ),
        (
            GPU,
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "VfioDeviceConfig",
                "iommu": {"enableAPIDevice": 1},
            },
            "parameters.iommu.enableAPIDevice: must be a boolean, not a number",
        ),
        (
            GPU,
            {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig", "iommuConfig": {}},
            'parameters.iommuConfig: unknown field "iommuConfig"',
        ),
        (
            GPU,
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "ComputeDomainChannelConfig",
                "domainID": "d",
            },
            "parameters.kind: ComputeDomainChannelConfig configures NVIDIA's compute-domain driver "
            "(compute-domain.nvidia.com), not gpu.nvidia.com devices",
        ),
        (
            GPU,
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "ComputeDomainDaemonConfig",
                "domainID": "d",
            },
            "ComputeDomainDaemonConfig configures NVIDIA's compute-domain driver (compute-domain.nvidia.com)",
        ),
        (
            GPU,
            {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain"},
            'no kind "ComputeDomain" is registered for version "resource.nvidia.com/v1beta1"',
        ),
        (
            TPU,
            {"apiVersion": "tpu.resource.google.com/v1alpha1", "kind": "TpuConfig", "logging": {"level": 9}},
            "parameters.logging.level: invalid level: 9, must be between 0 (INFO) and 3 (FATAL)",
        ),
        (
            TPU,
            {
                "apiVersion": "tpu.resource.google.com/v1alpha1",
                "kind": "TpuConfig",
                "logging": {"stderrLevel": -1},
            },
            "parameters.logging.stderrLevel: invalid stderrLevel: -1, must be between 0 (INFO) and 3 (FATAL)",
        ),
        (
            TPU,
            {
                "apiVersion": "tpu.resource.google.com/v1alpha1",
                "kind": "TpuConfig",
                "logging": {"level": "2"},
            },
            "parameters.logging.level: must be an integer, not a string",
        ),
        (
            TPU,
            {"apiVersion": "tpu.resource.google.com/v1alpha1", "kind": "TpuConfig", "loggingg": {"level": 1}},
            'parameters.loggingg: unknown field "loggingg"',
        ),
        (
            TPU,
            # The two TPU groups do not share fields: workerId is this product's group only.
            {"apiVersion": "tpu.resource.google.com/v1alpha1", "kind": "TpuConfig", "workerId": 0},
            'parameters.workerId: unknown field "workerId"',
        ),
        (
            TPU,
            {"apiVersion": "tpu.resource.google.com/v1alpha1", "kind": "NotATpuConfig"},
            'parameters.kind: no kind "NotATpuConfig" is registered for version '
            '"tpu.resource.google.com/v1alpha1"',
        ),
        (
            TPU,
            {"apiVersion": "tpu.google.com/v1beta1", "kind": "TpuConfig"},
            'parameters.apiVersion: "tpu.google.com/v1beta1" is not one of '
            "tpu.resource.google.com/v1alpha1, tpu.google.com/v1alpha1",
        ),
    ],
)
def test_vendor_kinds_refuse_wrong_values_in_the_vendors_words(
    driver: str, parameters: Any, message: str
) -> None:
    with pytest.raises(OpaqueConfigError) as caught:
        parser.parse(driver=driver, parameters=parameters)
    assert message in str(caught.value)


def test_what_this_driver_does_not_implement_says_so() -> None:
    # Multi-user MPS on a GPU is carried out (``nvidia-cuda-mps-control -M``).
    multi = {"strategy": "MPS", "mpsConfig": {"multiUser": True}}
    assert not_implemented(parse_gpu("GpuConfig", sharing=multi)) is None
    # MPS on MIG devices is carried out too (one daemon over the claim's MIG devices).
    assert not_implemented(parse_gpu("MigDeviceConfig", sharing={"strategy": "MPS"})) is None
    # Time-slicing and MPS are carried out on GPUs; time-slicing on a MIG device does not apply.
    assert not_implemented(parse_gpu("GpuConfig", sharing={"strategy": "TimeSlicing"})) is None
    assert not_implemented(parse_gpu("GpuConfig", sharing={"strategy": "MPS"})) is None
    mig_ts = not_implemented(parse_gpu("MigDeviceConfig", sharing={"strategy": "TimeSlicing"}))
    assert "time-slicing does not apply to MIG devices" in (mig_ts or "")
    multi = parse_gpu("MigDeviceConfig", sharing={"strategy": "MPS", "mpsConfig": {"multiUser": True}})
    assert not_implemented(multi) is None
    # Passthrough is carried out where GPUs are published for it (prepare refuses it elsewhere).
    assert not_implemented(parse_gpu("VfioDeviceConfig")) is None
    # What is carried out (or asks for nothing) has no reason.
    assert not_implemented(parse_gpu("GpuConfig")) is None
    assert not_implemented(parse_gpu("MigDeviceConfig")) is None
    assert not_implemented(parse_tpu("tpu.resource.google.com/v1alpha1", logging={"level": 1})) is None
    assert not_implemented(parse_tpu("tpu.google.com/v1alpha1", workerId=0)) is None


def test_the_two_tpu_groups_resolve_independently() -> None:
    google = {"apiVersion": "tpu.resource.google.com/v1alpha1", "kind": "TpuConfig", "logging": {"level": 1}}
    own = {"apiVersion": "tpu.google.com/v1alpha1", "kind": "TpuConfig", "iciResiliency": True}
    configs = parser.for_driver(
        driver=TPU,
        configs=[
            {"source": "FromClass", "opaque": {"driver": TPU, "parameters": google}},
            {"source": "FromClaim", "opaque": {"driver": TPU, "parameters": own}},
        ],
        where="claim ns/c",
    )
    g = effective_entry(configs, request="tpus", device_kind="tpu", group="tpu.resource.google.com")
    o = effective_entry(configs, request="tpus", device_kind="tpu", group="tpu.google.com")
    assert g is not None
    assert g.config == GoogleTpuConfig(logging=TpuLogging(level=1, stderr_level=1))
    assert g.where == "claim ns/c.config[0]"
    assert o is not None
    assert o.config == TpuConfig(ici_resiliency=True)
    # Without a group, the later (claim) entry wins outright.
    assert effective(configs, request="tpus", device_kind="tpu") == TpuConfig(ici_resiliency=True)


# --- NVIDIA's compute-domain driver ------------------------------------------------------------

CD_UID = "0f5e0c1a-2b3c-4d5e-8f90-a1b2c3d4e5f6"


def test_compute_domain_configs_are_read_for_their_driver() -> None:
    parser = OpaqueConfigParser()
    channel = parser.parse(
        driver="compute-domain.nvidia.com",
        parameters={
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomainChannelConfig",
            "domainID": CD_UID,
            "allocationMode": "All",
        },
    )
    assert channel == ComputeDomainChannelConfig(domain_id=CD_UID, allocation_mode="All")
    daemon = parser.parse(
        driver="compute-domain.nvidia.com",
        parameters={
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomainDaemonConfig",
            "domainID": CD_UID,
        },
    )
    assert daemon == ComputeDomainDaemonConfig(domain_id=CD_UID)
    default = parser.parse(
        driver="compute-domain.nvidia.com",
        parameters={
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomainChannelConfig",
            "domainID": CD_UID,
        },
    )
    assert default == ComputeDomainChannelConfig(domain_id=CD_UID, allocation_mode="Single")


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"kind": "ComputeDomainChannelConfig"}, "parameters.domainID: domainID cannot be empty"),
        (
            {"kind": "ComputeDomainChannelConfig", "domainID": "/".join(("..", "x"))},
            "is not a ComputeDomain's UID",
        ),
        (
            {"kind": "ComputeDomainChannelConfig", "domainID": CD_UID, "allocationMode": "Most"},
            "unknown allocation mode",
        ),
        (
            {"kind": "ComputeDomainDaemonConfig", "domainID": CD_UID, "allocationMode": "All"},
            'unknown field "allocationMode"',
        ),
        ({"kind": "GpuConfig"}, 'no kind "GpuConfig" is registered'),
    ],
)
def test_compute_domain_configs_are_strict(parameters: dict[str, Any], message: str) -> None:
    with pytest.raises(OpaqueConfigError, match=re.escape(message)):
        OpaqueConfigParser().parse(
            driver="compute-domain.nvidia.com",
            parameters={"apiVersion": "resource.nvidia.com/v1beta1", **parameters},
        )
