"""The lint step that keeps product code in small pieces (``.ci/check_sizes.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_sizes", REPO / ".ci" / "check_sizes.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_sizes = _load_checker()


def test_the_enforced_folders_keep_the_limits() -> None:
    for folder in check_sizes.ENFORCED:
        found = [
            v
            for p in check_sizes.product_files(REPO, folder)
            for v in check_sizes.violations(p, shown_as=str(p))
        ]
        assert found == [], folder


def _body(lines: int, *, indent: int) -> str:
    return "".join(f"{' ' * indent}x{i} = {i}\n" for i in range(lines))


def test_a_long_function_a_long_method_and_a_big_class_are_named(tmp_path: Path) -> None:
    source = tmp_path / "big.py"
    # Lines 1-81: a decorated function of 81 lines. Lines 82-482: a class of 401 lines whose first
    # method (83-163) has 81 lines, then 79 methods of 4 lines and 3 lines of its own.
    source.write_text(
        "@decorated\ndef long():\n"
        + _body(79, indent=4)
        + "class Big:\n    def long_method(self):\n"
        + _body(80, indent=8)
        + "".join(f"    def m{i}(self):\n" + _body(3, indent=8) for i in range(79))
        + _body(3, indent=4)
    )
    assert check_sizes.violations(source, shown_as="big.py") == [
        "big.py:2: function long has 81 lines (limit 80)",
        "big.py:82: class Big has 401 lines (limit 400)",
        "big.py:83: function Big.long_method has 81 lines (limit 80)",
    ]
    # One line less each, and all are within the limits.
    source.write_text(
        "def long():\n"
        + _body(79, indent=4)
        + "class Big:\n    def long_method(self):\n"
        + _body(79, indent=8)
        + "".join(f"    def m{i}(self):\n" + _body(3, indent=8) for i in range(79))
        + _body(3, indent=4)
    )
    assert check_sizes.violations(source, shown_as="big.py") == []


@pytest.mark.parametrize(("lines", "over"), [(700, False), (701, True)])
def test_a_module_counts_its_lines(tmp_path: Path, lines: int, over: bool) -> None:
    source = tmp_path / "m.py"
    source.write_text("x = 1\n" * lines)
    assert bool(check_sizes.violations(source, shown_as="m.py")) is over


def test_generated_protobuf_code_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "api_pb2.py").write_text("x = 1\n" * 800)
    (tmp_path / "pkg" / "api.py").write_text("x = 1\n")
    assert [p.name for p in check_sizes.product_files(tmp_path, "pkg")] == ["api.py"]
