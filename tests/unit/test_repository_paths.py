"""The lint step that keeps every path inside the repository (``.ci/check_paths.py``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
# Built up, so that this file itself holds no path that climbs out (the checker reads it too).
UP = ".." + "/"


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_paths", REPO / ".ci" / "check_paths.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_paths = _load_checker()


def test_the_repository_has_no_path_that_leaves_it() -> None:
    assert check_paths.findings(REPO) == []


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("tests/unit/x/loader.py", f"CASES = 'cases.yaml'  # see {UP}shared/cases.yaml"),
        ("README.md", f"The cases are in `{UP}shared/conformance/allocator-cases.yaml`."),
        ("docs/testing.md", f"see [the cases]({UP * 2}shared/cases.yaml)"),
        ("manifests/overlays/gpu/kustomization.yaml", f"resources: [{UP * 4}outside]"),
        ("Makefile", f"\tcp {UP}shared/x ."),
    ],
)
def test_relative_paths_that_climb_out_are_found(name: str, line: str) -> None:
    assert list(check_paths.text_findings(name, line))


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("docs/testing.md", f"see [the README]({UP}README.md) and [bench]({UP}bench/RESULTS.md)"),
        ("manifests/overlays/gpu/kustomization.yaml", f"resources: [{UP * 2}base]"),
        ("README.md", f"an URL https://example.invalid/a/{UP}b and a plain ./path"),
    ],
)
def test_relative_paths_inside_are_accepted(name: str, line: str) -> None:
    assert list(check_paths.text_findings(name, line)) == []


@pytest.mark.parametrize(
    "expression",
    [
        'Path(__file__).resolve().parents[3].parent / "beside"',
        "Path(__file__).parents[4]",
        "Path(__file__).parent.parent.parent.parent.parent",
        "os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))",
    ],
)
def test_python_climbing_above_the_root_is_found(expression: str) -> None:
    # tests/unit/x/loader.py: parents[3] is the repository root.
    source = f"import os\nfrom pathlib import Path\nX = {expression}\n"
    found = list(check_paths.python_findings("tests/unit/x/loader.py", source))
    assert len(found) == 1
    assert "tests/unit/x/loader.py:3:" in found[0]


@pytest.mark.parametrize(
    "expression",
    [
        "Path(__file__).resolve().parents[3]",
        'Path(__file__).parents[2] / "fixtures"',
        "os.path.dirname(os.path.dirname(__file__))",
        "cache_dir().parent.parent.parent.parent.parent",
    ],
)
def test_python_staying_inside_is_accepted(expression: str) -> None:
    source = f"import os\nfrom pathlib import Path\nX = {expression}\n"
    assert list(check_paths.python_findings("tests/unit/x/loader.py", source)) == []


def test_the_script_names_the_paths_and_fails(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text(
        'from pathlib import Path\nP = Path(__file__).parents[2] / "x"\n'
    )
    (tmp_path / "notes.md").write_text(f"read {UP}elsewhere/file.txt first\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    result = subprocess.run(
        [sys.executable, str(REPO / ".ci" / "check_paths.py"), str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "tests/t.py:2:" in result.stdout
    assert f"notes.md:1: {UP}elsewhere/file.txt" in result.stdout
