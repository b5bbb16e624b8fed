"""Every validator of a name, number or version matches the whole string: a pattern anchored with
``$`` and tried with ``re.match`` also accepts the string with one trailing newline, which then
reaches a file name, an environment variable or a log line (security review L1)."""

from __future__ import annotations

from typing import Any

import pytest

from dra_api.attributes import Version
from dra_node_agent.cdi import build_claim_spec
from dra_node_agent.devices import DiscoveredInventory, validate_slice_device
from dra_node_agent.opaqueconfig import OpaqueConfigError, OpaqueConfigParser
from dra_node_agent.pci import split_address
from dra_node_agent.simulated.nic import valid_if_name
from dra_node_agent.tpu.discovery import validate_topology
from dra_node_agent.tpu.workers import job_of_pod
from dra_operator.cel.library.quantity_semver import isSemver

PARSER = OpaqueConfigParser()


def _tpu(**fields: Any) -> Any:
    return {"apiVersion": "tpu.google.com/v1alpha1", "kind": "TpuConfig", **fields}


def _mps(limit: str) -> Any:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": limit}},
    }


def test_a_worker_hostname_or_a_quantity_with_a_newline_is_refused() -> None:
    assert PARSER.parse(driver="tpu.google.com", parameters=_tpu(workerHostnames=["w-0"]))
    with pytest.raises(OpaqueConfigError, match=r'"evil\\n" is not a hostname'):
        PARSER.parse(driver="tpu.google.com", parameters=_tpu(workerHostnames=["evil\n"]))
    assert PARSER.parse(driver="gpu.nvidia.com", parameters=_mps("1Gi"))
    with pytest.raises(OpaqueConfigError, match="is not a non-negative quantity"):
        PARSER.parse(driver="gpu.nvidia.com", parameters=_mps("1Gi\n"))


def test_a_claim_uid_with_a_newline_names_no_cdi_file() -> None:
    with pytest.raises(ValueError, match="not a lower-case RFC 4122 UID"):
        build_claim_spec(claim_uid="0a1b\n", devices=[], inventory=DiscoveredInventory(driver="d"))


@pytest.mark.parametrize(
    ("check", "good", "bad"),
    [
        (lambda v: not validate_slice_device({"name": v}, driver="d"), "gpu-0", "gpu-0\n"),
        (
            lambda v: not validate_slice_device({"name": "x", "attributes": {v: {"int": 1}}}, driver="d"),
            "index",
            "index\n",
        ),
        (
            lambda v: (
                not validate_slice_device({"name": "x", "attributes": {"a": {"version": v}}}, driver="d")
            ),
            "1.2.3",
            "1.2.3\n",
        ),
        (lambda v: _ok(validate_topology, v), "2x4", "2x4\n"),
        (lambda v: _ok(split_address, v), "0000:3b:00.0", "0000:3b:00.0\n"),
        (valid_if_name, "eth0", "eth0\n"),
        (lambda v: _ok(Version, v), "1.2.3", "1.2.3\n"),
        (lambda v: bool(isSemver(v, True)), "v1.2", "v1.2\n"),
    ],
)
def test_validators_refuse_a_trailing_newline(check: Any, good: str, bad: str) -> None:
    assert check(good)
    assert not check(bad)


def test_a_completion_index_with_a_newline_is_no_index() -> None:
    def pod(index: str) -> dict[str, Any]:
        meta = {"namespace": "ns", "labels": {"job-name": "train"}, "annotations": {}}
        meta["annotations"]["batch.kubernetes.io/job-completion-index"] = index
        return {"metadata": meta}

    assert job_of_pod(pod("3")) is not None
    assert job_of_pod(pod("3\n")) is None


def _ok(call: Any, value: str) -> bool:
    try:
        call(value)
    except ValueError:
        return False
    return True
