"""How the library's modules declare their functions, and the helpers they share.

``@declare`` records the function below as a CEL function with its overloads (``builtin`` does so
for a function cel-python implements); the package gathers the records as ``DECLARATIONS``. A
declared function is wrapped so that an argument that is already an error passes through, and a
:class:`Fail` (or a ``ValueError``) it raises becomes a ``CELEvalError`` value with a clear message
(cel-python would turn a raised ValueError into a misleading "return error for overflow").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from celpy import celtypes
from celpy.evaluation import CELEvalError, base_functions

from ..declarations import Declaration, Overload
from ..values import cel_kind

CelFunction = Callable[..., Any]
_F = TypeVar("_F", bound=CelFunction)

# Every declaration, by name, in the order the library's modules make them.
DECLARED: dict[str, Declaration] = {}


def _add(declaration: Declaration) -> None:
    if declaration.name in DECLARED:
        raise RuntimeError(f"CEL function {declaration.name!r} is declared twice")
    DECLARED[declaration.name] = declaration


def declare(name: str, *overloads: Overload, pure: bool = False) -> Callable[[_F], _F]:
    """Declare the function below as the CEL function ``name`` with these overloads."""

    def register(fn: _F) -> _F:
        _add(Declaration(name, overloads, _cel_function(fn), pure))
        return fn

    return register


def builtin(name: str, *overloads: Overload) -> None:
    # cel-python's own implementation; a name it lacks fails here, at import, not in a selector.
    _add(Declaration(name, overloads, base_functions[name]))


class Fail(Exception):
    """Raised inside a library function; becomes a CEL evaluation error with this message."""


def _cel_function(fn: CelFunction) -> CelFunction:
    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        for arg in args:
            if isinstance(arg, CELEvalError):
                return arg
        try:
            return fn(*args)
        except Fail as exc:
            return CELEvalError(str(exc))
        except (ValueError, OverflowError) as exc:
            return CELEvalError(f"{fn.__name__.rstrip('_')}: {exc}")

    return wrapper


def overload_error(name: str, *args: Any) -> Fail:
    kinds = ", ".join(cel_kind(a) for a in args)
    return Fail(f"no such overload: {name}({kinds})")


def cel_bool(value: bool) -> celtypes.BoolType:
    return celtypes.BoolType(value)


def cel_int(value: int) -> celtypes.IntType:
    return celtypes.IntType(value)


def require_str(name: str, *args: Any) -> None:
    if not all(isinstance(a, str) for a in args):
        raise overload_error(name, *args)


def require_int(name: str, *args: Any) -> None:
    if not all(isinstance(a, int) and not isinstance(a, celtypes.BoolType | bool) for a in args):
        raise overload_error(name, *args)
