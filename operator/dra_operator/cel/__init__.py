"""The Kubernetes DRA CEL environment for device selectors, on cel-python.

``compile_selector(text)`` returns a :class:`CompiledSelector` whose ``matches(DeviceInput)`` says
whether a device satisfies the selector. The environment follows Kubernetes' (``device.driver``,
``device.attributes``, ``device.capacity``, ``device.allowMultipleAllocations``, the quantity and
semver libraries, string, list and set extensions, optional selection ``.?``, ``cel.bind`` and
``includes``). ``compile_derived(text)`` compiles a derived attribute's expression
(DRADerivedAttributes), whose :class:`CompiledDerived` gives an attribute value per device.
Expressions are parsed with cel-python's grammar, checked statically (undeclared names, device
fields, overloads, result type) and compiled to closures over cel-python's value types; results are
memoized per projection of the device onto what the expression reads.
"""

from __future__ import annotations

from .budget import BudgetExhausted, WorkBudget, charged_to
from .derived import CompiledDerived, compile_derived
from .errors import CelCompileError, CelRuntimeError
from .selector import (
    MAX_EXPRESSION_LENGTH,
    CompiledSelector,
    DeviceInput,
    compile_selector,
    evaluation_count,
)

__all__ = [
    "MAX_EXPRESSION_LENGTH",
    "BudgetExhausted",
    "CelCompileError",
    "CelRuntimeError",
    "CompiledDerived",
    "CompiledSelector",
    "DeviceInput",
    "WorkBudget",
    "charged_to",
    "compile_derived",
    "compile_selector",
    "evaluation_count",
]
