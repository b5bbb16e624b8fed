from __future__ import annotations

from dra_operator.cel import compile_selector
from dra_operator.deviceclasses import desired_classes, drifted, invalid_selectors, is_managed
from dra_operator.settings import Settings


def test_desired_classes_follow_settings_and_are_labelled() -> None:
    classes = desired_classes(Settings(gpu_class="gpus", mig_enabled=True))
    assert set(classes) == {"gpus", "tpu.google.com", "mig.nvidia.com"}
    assert all(is_managed(c) for c in classes.values())
    assert set(desired_classes(Settings())) == {"gpu.nvidia.com", "tpu.google.com"}


def test_desired_selectors_compile() -> None:
    for cls in desired_classes(Settings(mig_enabled=True)).values():
        assert invalid_selectors(cls, compiler=compile_selector) == []


def test_drift_is_selectors_only() -> None:
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
