"""TEMPORARY: a tiny evaluator for the selector shapes in the conformance file, used only while
the real ``dra_operator.cel`` does not exist yet. ``test_real_cel_is_used`` fails while it is in use."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_api.quantity import Quantity


class CelCompileError(ValueError):
    pass


class CelRuntimeError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class DeviceInput:
    driver: str
    attributes: Mapping[str, Any]
    capacity: Mapping[str, Quantity]
    allow_multiple_allocations: bool = False


def _lookup(values: Mapping[str, Any], driver: str, domain: str, name: str) -> Any:
    if f"{domain}/{name}" in values:
        return values[f"{domain}/{name}"]
    if domain == driver and name in values:
        return values[name]
    raise CelRuntimeError(f"no such key: {name}")


_PATTERNS: list[tuple[re.Pattern[str], Callable[[re.Match[str]], Callable[[DeviceInput], bool]]]] = [
    (re.compile(r'device\.driver == "([^"]*)"'), lambda m: lambda d: d.driver == m.group(1)),
    (
        re.compile(r"device\.allowMultipleAllocations == (true|false)"),
        lambda m: lambda d: d.allow_multiple_allocations == (m.group(1) == "true"),
    ),
    (
        re.compile(r'device\.attributes\["([^"]+)"\]\.(\w+) == "([^"]*)"'),
        lambda m: lambda d: _lookup(d.attributes, d.driver, m.group(1), m.group(2)) == m.group(3),
    ),
    (
        re.compile(
            r'device\.capacity\["([^"]+)"\](?:\.(\w+)|\["([^"]+)"\])\.compareTo\(quantity\("([^"]+)"\)\) >= 0'
        ),
        lambda m: (
            lambda d: (
                _lookup(d.capacity, d.driver, m.group(1), m.group(2) or m.group(3))
                >= Quantity.parse(m.group(4))
            )
        ),
    ),
]


class CompiledSelector:
    def __init__(self, expression: str) -> None:
        self.expression = expression
        self._parts: list[Callable[[DeviceInput], bool]] = []
        for part in expression.split(" && "):
            for pattern, build in _PATTERNS:
                match = pattern.fullmatch(part.strip())
                if match:
                    self._parts.append(build(match))
                    break
            else:
                raise CelCompileError(f"undeclared reference to {part.strip()!r} (stand-in)")

    def matches(self, device: DeviceInput) -> bool:
        return all(p(device) for p in self._parts)


def compile_selector(expression: str) -> CompiledSelector:
    return CompiledSelector(expression)


def install() -> bool:
    """Install the stand-in if the real module lacks the API; True if installed."""
    import dra_operator.cel as real

    if hasattr(real, "compile_selector"):
        return False
    real.CelCompileError = CelCompileError  # type: ignore[attr-defined]
    real.CelRuntimeError = CelRuntimeError  # type: ignore[attr-defined]
    real.DeviceInput = DeviceInput  # type: ignore[attr-defined]
    real.compile_selector = compile_selector  # type: ignore[attr-defined]
    real.STANDIN = True  # type: ignore[attr-defined]
    return True
