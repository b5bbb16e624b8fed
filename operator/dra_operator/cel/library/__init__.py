"""The functions of the Kubernetes DRA CEL environment, each declared once with its overloads.

Each function carries its declaration (``@declare``: name, overloads, purity; ``registry.py``): the
checker accepts exactly those overloads and the compiler calls the function beneath. Functions
cel-python already implements are declared in ``core.py``, with cel-python's implementation. The
others are grouped by what they work on: ``quantity_semver.py``, ``strings.py``, ``lists.py``,
``optionals.py``.

cel-python calls a function ``f`` the same way for ``f(x, y)`` and ``x.f(y)``: with the receiver as
first argument. Several names are shared by different libraries (``indexOf`` for strings and lists,
``compareTo`` for quantities and semvers), so each function dispatches on the argument types; the
overloads only tell the checker which call styles and arities to allow.

Errors are returned as ``CELEvalError`` values with a clear message (cel-python would turn a raised
ValueError into a misleading "return error for overflow").
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType, ModuleType
from typing import Final

from ..declarations import Declaration
from . import core, lists, optionals, quantity_semver, strings
from .registry import DECLARED

__all__ = ["DECLARATIONS", "MODULES"]

DECLARATIONS: Final[Mapping[str, Declaration]] = MappingProxyType(DECLARED)

# The modules whose public functions are the library's (each one declared as a CEL function).
MODULES: Final[tuple[ModuleType, ...]] = (core, quantity_semver, strings, lists, optionals)
