"""Every CEL selector in the allocator conformance file compiles, or fails where expected."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dra_operator.cel import CelCompileError, compile_selector
from tests.unit.operator.allocator.conformance_loader import CASES_FILE


def _selectors(node: Any) -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        if isinstance(node.get("cel"), str):
            found.append(node["cel"])
        for value in node.values():
            found.extend(_selectors(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_selectors(item))
    return found


def _load() -> list[tuple[str, str, str | None]]:
    data = yaml.safe_load(CASES_FILE.read_text())
    out: list[tuple[str, str, str | None]] = []
    for case in data["cases"]:
        expect = case.get("expect", {})
        message = str(expect.get("upstreamErrorMessage", ""))
        for expression in dict.fromkeys(_selectors(case)):
            # Upstream quotes the failing expression under the compile error.
            failing = "CEL compile error" in message and f"| {expression}\n" in message
            out.append((case["name"], expression, expect.get("errorContains") if failing else None))
    return out


CASES = _load()


def test_the_conformance_file_has_selectors() -> None:
    assert len(CASES) >= 100
    assert any(error for _, _, error in CASES)


@pytest.mark.parametrize(
    ("case", "expression", "compile_error"), CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES]
)
def test_selector_compiles_as_expected(case: str, expression: str, compile_error: str | None) -> None:
    if compile_error is None:
        assert compile_selector(expression).expression == expression
    else:
        with pytest.raises(CelCompileError, match=compile_error):
            compile_selector(expression)
