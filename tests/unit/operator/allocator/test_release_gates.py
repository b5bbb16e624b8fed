"""The allocation gates the operator takes from the cluster's Kubernetes release."""

from __future__ import annotations

import pytest

from dra_operator.allocator import FeatureGates
from dra_operator.allocator.gates import RELEASE_DEFAULTS, kubernetes_minor

OFF_BEFORE_1_36 = {
    "DRAPartitionableDevices",
    "DRADeviceTaints",
    "DRAConsumableCapacity",
    "DRADeviceBindingConditions",
    "DRAListTypeAttributes",
    "DRADeviceCompatibilityGroups",
    "DRAOptionalNodeOperations",
    "DRADerivedAttributes",
    "DRAFractionalCapacityRange",
}
ALPHA_FROM_1_36 = ["DRAListTypeAttributes", "DRADeviceCompatibilityGroups", "DRAOptionalNodeOperations"]
OFF_IN_1_37 = [*ALPHA_FROM_1_36, "DRADerivedAttributes", "DRAFractionalCapacityRange"]


@pytest.mark.parametrize("version", ["v1.34.12", "v1.35.8", "1.35.0-eks-113cf36"])
def test_before_1_36_the_alpha_allocation_gates_are_off(version: str) -> None:
    chosen = FeatureGates.for_kubernetes(version)
    assert chosen.known
    off = {name for name, on in chosen.gates.to_mapping().items() if not on}
    assert off == OFF_BEFORE_1_36
    assert chosen.describe() == f"Kubernetes {version.removeprefix('v')[:4]} defaults"


@pytest.mark.parametrize("version", ["v1.36.3", "v1.37.2", "v1.37.0-gke.1200"])
def test_from_1_36_every_allocation_gate_but_the_alpha_ones_is_on(version: str) -> None:
    chosen = FeatureGates.for_kubernetes(version)
    assert chosen.gates == FeatureGates()
    assert [name for name, on in chosen.gates.to_mapping().items() if not on] == OFF_IN_1_37


def test_1_38_turns_fractional_capacity_ranges_on() -> None:
    """Read in 1.38's development branch (v1.38.0-beta.0): DRAFractionalCapacityRange is GA and on,
    the alpha allocation gates are still alpha."""
    chosen = FeatureGates.for_kubernetes("v1.38.0")
    assert chosen.known
    assert chosen.gates == FeatureGates(fractional_capacity_range=True)
    assert [name for name, on in chosen.gates.to_mapping().items() if not on] == [
        *ALPHA_FROM_1_36,
        "DRADerivedAttributes",
    ]


def test_an_unknown_release_takes_the_nearest_known_defaults_and_says_so() -> None:
    newer = FeatureGates.for_kubernetes("v1.39.0")
    assert not newer.known
    assert newer.used == max(RELEASE_DEFAULTS)
    assert newer.gates == RELEASE_DEFAULTS[max(RELEASE_DEFAULTS)]
    assert newer.describe() == "Kubernetes 1.39 (not known to this release; 1.38 defaults)"
    older = FeatureGates.for_kubernetes("v1.33.5")
    assert not older.known
    assert older.gates == RELEASE_DEFAULTS[(1, 34)]


def test_the_flag_changes_the_releases_defaults() -> None:
    base = FeatureGates.for_kubernetes("v1.34.12").gates
    gates = FeatureGates.from_flag("DRAPartitionableDevices=true", base=base)
    assert gates.partitionable_devices
    assert not gates.device_taints


@pytest.mark.parametrize("text", ["", "latest", "one.two"])
def test_text_that_names_no_release_is_refused(text: str) -> None:
    assert kubernetes_minor(text) is None
    with pytest.raises(ValueError, match="not a Kubernetes version"):
        FeatureGates.for_kubernetes(text)
