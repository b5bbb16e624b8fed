from __future__ import annotations

from dra_api.model import ResourceClaim
from dra_operator.base.settings import Ownership
from dra_operator.model.ownership import generated_from_template, is_ours
from tests.unit.operator.helpers import claim

CLASSES = ("gpu.nvidia.com", "tpu.google.com")


def test_standalone_mode_takes_claims_no_pod_owns() -> None:
    standalone = ResourceClaim.from_json(claim("a"))
    templated = ResourceClaim.from_json(claim("b", owner_pod=True))
    assert is_ours(standalone, ownership=Ownership.STANDALONE, classes=CLASSES)
    assert not is_ours(templated, ownership=Ownership.STANDALONE, classes=CLASSES)
    assert generated_from_template(templated)


def test_all_and_none_modes() -> None:
    templated = ResourceClaim.from_json(claim("b", owner_pod=True))
    assert is_ours(templated, ownership=Ownership.ALL, classes=CLASSES)
    assert not is_ours(ResourceClaim.from_json(claim("a")), ownership=Ownership.NONE, classes=CLASSES)


def test_claims_of_other_classes_are_left_alone() -> None:
    other = ResourceClaim.from_json(claim("c", cls="example.com-fpga"))
    assert not is_ours(other, ownership=Ownership.ALL, classes=CLASSES)
