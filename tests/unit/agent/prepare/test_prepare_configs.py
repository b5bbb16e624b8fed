"""Opaque configs at prepare: what is carried out, and what is refused as not implemented yet.

A valid config whose effect this driver does not implement fails the prepare with a message that
says so (the kubelet shows it in the pod's events) and leaves nothing behind: no checkpoint entry,
no CDI spec. The vendors' own kinds are the ones read here (see opaqueconfig's unit tests for their
schemas).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent import prepare_tools
from dra_node_agent.claim_reader import ClaimAllocation, ClaimGone, driver_allocation
from dra_node_agent.prepare import PrepareHandler
from dra_node_agent.simulated.discovery import SimulatedBackend

GPU = "gpu.nvidia.com"
TPU = "tpu.google.com"
NODE = "node-a"
NVIDIA = "resource.nvidia.com/v1beta1"
GOOGLE_TPU = "tpu.resource.google.com/v1alpha1"
OWN_TPU = "tpu.google.com/v1alpha1"


class Claims:
    def __init__(self, driver: str) -> None:
        self.driver = driver
        self.objects: dict[str, dict[str, Any]] = {}

    async def read(self, ref: ClaimRef) -> ClaimAllocation:
        obj = self.objects.get(ref.name)
        if obj is None:
            raise ClaimGone(f"ResourceClaim {ref.namespace}/{ref.name}: not found")
        return driver_allocation(ref=ref, obj=obj, driver=self.driver)


def entry(
    driver: str, parameters: dict[str, Any], *, requests: list[str] | None = None, source: str = "FromClaim"
) -> dict[str, Any]:
    out: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        out["requests"] = requests
    return out


def claim(driver: str, results: list[tuple[str, str]], config: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": request, "driver": driver, "pool": NODE, "device": device}
                        for request, device in results
                    ],
                    "config": config,
                }
            }
        },
    }


REF = ClaimRef(namespace="ns", name="c", uid="uid-1")


async def make(tmp_path: Path, *, driver: str, profile: str) -> tuple[PrepareHandler, Claims]:
    backend = SimulatedBackend(profile=profile, node_name=NODE, state_dir=tmp_path / "hw", driver=driver)
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("boot-1\n")
    claims = Claims(driver)
    handler = PrepareHandler(
        driver=driver,
        node_name=NODE,
        inventory=await backend.discover(),
        claims=claims,
        state_dir=tmp_path / "state",
        cdi_dir=tmp_path / "cdi",
        proc_root=tmp_path / "proc",
        gpu_sharing=prepare_tools.gpu_sharing(backend),
        vendor_env=prepare_tools.vendor_env(backend),
    )
    await handler.start()
    return handler, claims


@pytest.fixture
async def gpu(tmp_path: Path) -> tuple[PrepareHandler, Claims]:
    return await make(tmp_path, driver=GPU, profile="a100-40gb-mig")


@pytest.fixture
async def tpu(tmp_path: Path) -> tuple[PrepareHandler, Claims]:
    return await make(tmp_path, driver=TPU, profile="tpu-v4-2x2x1")


async def refused(handler: PrepareHandler) -> str:
    result = (await handler.prepare([REF]))["uid-1"]
    assert result.error, "prepare should have failed"
    assert handler.store.load() == []
    assert not handler.cdi.spec_path("uid-1").exists()
    return result.error


def spec_env(handler: PrepareHandler) -> list[str]:
    spec = json.loads(handler.cdi.spec_path("uid-1").read_text())
    env: list[str] = list(spec.get("containerEdits", {}).get("env", []))
    for device in spec["devices"]:
        env.extend(device["containerEdits"].get("env", []))
    return env


def first_gpu(handler: PrepareHandler, kind: str) -> str:
    return next(d.name for d in handler.inventory.devices if d.kind == kind)


@pytest.mark.parametrize(
    "sharing", [{"strategy": "MPS"}, {"strategy": "MPS", "mpsConfig": {"multiUser": True}}]
)
async def test_mps_on_a_mig_device_without_mps_on_the_node_is_refused_saying_so(
    gpu: tuple[PrepareHandler, Claims], sharing: dict[str, Any]
) -> None:
    handler, claims = gpu  # a handler without the MPS tool, as with --mps-support=false
    device = first_gpu(handler, "mig")
    claims.objects["c"] = claim(
        GPU,
        [("r", device)],
        [entry(GPU, {"apiVersion": NVIDIA, "kind": "MigDeviceConfig", "sharing": sharing})],
    )
    error = await refused(handler)
    assert "status.allocation.devices.config[0]: MigDeviceConfig sharing.strategy MPS: MPS is off" in error
    assert f"device {device}" in error


async def test_time_slicing_on_a_mig_device_is_refused_as_not_applying(
    gpu: tuple[PrepareHandler, Claims],
) -> None:
    handler, claims = gpu
    device = first_gpu(handler, "mig")
    sharing = {"strategy": "TimeSlicing"}
    claims.objects["c"] = claim(
        GPU,
        [("r", device)],
        [entry(GPU, {"apiVersion": NVIDIA, "kind": "MigDeviceConfig", "sharing": sharing})],
    )
    error = await refused(handler)
    assert (
        "config[0]: MigDeviceConfig sharing.strategy TimeSlicing: time-slicing does not apply to MIG" in error
    )
    assert f"request r, device {device}" in error


async def test_a_vfio_config_naming_a_gpus_request_is_refused(gpu: tuple[PrepareHandler, Claims]) -> None:
    handler, claims = gpu
    # A GPU for containers is no GPU for passthrough: the config cannot apply (as NVIDIA's driver says).
    device = first_gpu(handler, "gpu")
    claims.objects["c"] = claim(
        GPU, [("r", device)], [entry(GPU, {"apiVersion": NVIDIA, "kind": "VfioDeviceConfig"}, requests=["r"])]
    )
    error = await refused(handler)
    assert (
        f"config[0]: cannot apply VfioDeviceConfig to device '{device}' of type 'gpu' (request: r)" in error
    )


async def test_compute_domain_config_names_its_driver(gpu: tuple[PrepareHandler, Claims]) -> None:
    handler, claims = gpu
    parameters = {"apiVersion": NVIDIA, "kind": "ComputeDomainChannelConfig", "domainID": "d"}
    claims.objects["c"] = claim(GPU, [("r", first_gpu(handler, "gpu"))], [entry(GPU, parameters)])
    assert "compute-domain driver (compute-domain.nvidia.com)" in await refused(handler)


async def test_a_config_naming_the_request_for_another_device_kind_is_refused(
    gpu: tuple[PrepareHandler, Claims],
) -> None:
    handler, claims = gpu
    device = first_gpu(handler, "gpu")
    claims.objects["c"] = claim(
        GPU, [("r", device)], [entry(GPU, {"apiVersion": NVIDIA, "kind": "MigDeviceConfig"}, requests=["r"])]
    )
    assert f"cannot apply MigDeviceConfig to device '{device}' of type 'gpu' (request: r)" in await refused(
        handler
    )


async def test_a_claim_config_without_sharing_overrides_a_class_asking_for_it(
    gpu: tuple[PrepareHandler, Claims],
) -> None:
    handler, claims = gpu
    class_sharing = {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
    claims.objects["c"] = claim(
        GPU,
        [("r", first_gpu(handler, "gpu")), ("m", first_gpu(handler, "mig"))],
        [
            entry(GPU, class_sharing, source="FromClass"),
            entry(GPU, {"apiVersion": NVIDIA, "kind": "GpuConfig"}),
            entry(GPU, {"apiVersion": "gpu.nvidia.com/v1beta1", "kind": "MigDeviceConfig"}, requests=["m"]),
        ],
    )
    result = (await handler.prepare([REF]))["uid-1"]
    assert result.error == ""
    assert len(result.devices) == 2


async def test_google_tpu_logging_reaches_the_containers_environment(
    tpu: tuple[PrepareHandler, Claims],
) -> None:
    handler, claims = tpu
    claims.objects["c"] = claim(
        TPU,
        [("tpus", f"accel{i}") for i in range(4)],
        [
            entry(
                TPU,
                {"apiVersion": GOOGLE_TPU, "kind": "TpuConfig", "logging": {"level": 0}},
                source="FromClass",
            ),
            entry(TPU, {"apiVersion": GOOGLE_TPU, "kind": "TpuConfig", "logging": {"level": 2}}),
        ],
    )
    assert (await handler.prepare([REF]))["uid-1"].error == ""
    env = spec_env(handler)
    # The claim's entry wins over the class's; stderrLevel follows level.
    assert "TPU_MIN_LOG_LEVEL=2" in env
    assert "TPU_STDERR_LOG_LEVEL=2" in env
    assert "TPU_MIN_LOG_LEVEL=0" not in env


async def test_conflicting_tpu_logging_across_requests_is_refused(tpu: tuple[PrepareHandler, Claims]) -> None:
    handler, claims = tpu
    claims.objects["c"] = claim(
        TPU,
        [("a", "accel0"), ("a", "accel1"), ("b", "accel2"), ("b", "accel3")],
        [
            entry(
                TPU, {"apiVersion": GOOGLE_TPU, "kind": "TpuConfig", "logging": {"level": 1}}, requests=["a"]
            ),
            entry(
                TPU, {"apiVersion": GOOGLE_TPU, "kind": "TpuConfig", "logging": {"level": 2}}, requests=["b"]
            ),
        ],
    )
    error = await refused(handler)
    assert "conflicting TPU configs within the claim: TPU_MIN_LOG_LEVEL is set to both '1' and '2'" in error


async def test_own_tpu_config_shapes_the_claims_environment(tpu: tuple[PrepareHandler, Claims]) -> None:
    handler, claims = tpu
    claims.objects["c"] = claim(
        TPU,
        [("tpus", f"accel{i}") for i in range(4)],
        [entry(TPU, {"apiVersion": OWN_TPU, "kind": "TpuConfig", "iciResiliency": True})],
    )
    assert (await handler.prepare([REF]))["uid-1"].error == ""
    assert "ENABLE_ICI_RESILIENCY=true" in spec_env(handler)


async def test_conflicting_own_tpu_configs_are_refused(tpu: tuple[PrepareHandler, Claims]) -> None:
    handler, claims = tpu
    claims.objects["c"] = claim(
        TPU,
        [("a", "accel0"), ("a", "accel1"), ("b", "accel2"), ("b", "accel3")],
        [
            entry(TPU, {"apiVersion": OWN_TPU, "kind": "TpuConfig", "iciResiliency": True}, requests=["a"]),
            entry(TPU, {"apiVersion": OWN_TPU, "kind": "TpuConfig", "iciResiliency": False}, requests=["b"]),
        ],
    )
    assert "conflicting TPU configs within the claim" in await refused(handler)
