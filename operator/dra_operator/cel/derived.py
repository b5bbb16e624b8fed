"""Derived attributes (DRADerivedAttributes, KEP-6080): a request's CEL expression evaluated on a
device to an attribute value that the claim's constraints compare for that request.

The environment is the selectors' (``device.driver``, ``.attributes``, ``.capacity``,
``.allowMultipleAllocations``); the result is a scalar (bool, int, string, semver) or a list of one
of them, as upstream's ``EvaluateDerivedAttribute`` converts it, with upstream's words for a result
it cannot convert. Compiled expressions are cached beside the selectors (by kind and text) and
remember their values per device projection, as selectors do.
"""

from __future__ import annotations

from typing import Any, Final

from celpy import celtypes

from dra_api.attributes import AttributeScalar, AttributeValue

from .checker import infer
from .declarations import DYN
from .errors import CelCompileError, CelRuntimeError
from .selector import DeviceInput, MemoizedExpression, compile_cached, parse_checked
from .values import CelSemver, cel_kind

__all__ = ["CompiledDerived", "compile_derived"]

# Result types a derived attribute may have (upstream: bool, int, string, any, dyn, semver, or a
# list of those; the element type of a list is checked when it is evaluated).
_RESULT_TYPES: Final = frozenset({"bool", "int", "string", DYN, "Semver", "list"})


def _check_result(tree: Any, text: str) -> str:
    kind = infer(tree, text)
    if kind not in _RESULT_TYPES:
        raise CelCompileError(
            "must evaluate to a primitive scalar (string, integer, boolean, semver) or a list of these "
            f"scalars, not {kind}"
        )
    return kind


def _scalar(value: Any) -> AttributeScalar | None:
    if isinstance(value, bool | celtypes.BoolType):  # before int: both are ints in Python
        return bool(value)
    if isinstance(value, celtypes.UintType):
        return None  # no attribute type holds a uint
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, CelSemver):
        return value.version
    return None


def _same_type(a: AttributeScalar, b: AttributeScalar) -> bool:
    # bool is an int in Python: compare the exact types.
    return type(a) is type(b)


def _to_attribute(result: Any) -> AttributeValue | CelRuntimeError:
    scalar = _scalar(result)
    if scalar is not None:
        return scalar
    if not isinstance(result, list | tuple):
        return CelRuntimeError(f"unsupported CEL return type: {cel_kind(result)}")
    if not result:
        return ()  # upstream: an empty list of strings
    first = _scalar(result[0])
    if first is None:
        return CelRuntimeError(f"unsupported list element type: {cel_kind(result[0])}")
    values: list[AttributeScalar] = []
    for i, element in enumerate(result):
        value = _scalar(element)
        if value is None or not _same_type(value, first):
            return CelRuntimeError(
                f"expected list element at index {i} to be {cel_kind(result[0])}, got {cel_kind(element)}"
            )
        values.append(value)
    return tuple(values)


class CompiledDerived(MemoizedExpression[AttributeValue]):
    """A compiled derived-attribute expression; ``value`` is safe to call from several threads."""

    _hint = False  # upstream reports the evaluation error as it is

    def value(self, device: DeviceInput) -> AttributeValue:
        """The attribute the expression derives from the device; CelRuntimeError if evaluation
        fails or gives a value no attribute can hold."""
        return self._value(device)

    def _convert(self, result: Any) -> AttributeValue | CelRuntimeError:
        return _to_attribute(result)


def _compile(expression: str) -> CompiledDerived:
    _, reads, program = parse_checked(expression, kinds=_check_result)
    return CompiledDerived(expression=expression, program=program, reads=reads)


def compile_derived(expression: str) -> CompiledDerived:
    """Compile a derived attribute's expression (cached by text, errors too); CelCompileError says
    what is wrong with it. Long expressions compile off the event loop, as selectors do."""
    return compile_cached("derived", expression, _compile, CompiledDerived)
