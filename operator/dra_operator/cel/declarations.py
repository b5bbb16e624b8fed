"""How a CEL function is declared: its overloads beside its implementation, in one record.

The ``library`` package declares every function of the environment once, as a
:class:`Declaration`; the checker reads the overloads from it (what it accepts) and the compiler the
implementation (what a compiled program calls), so neither keeps a table of its own that could
drift from the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["ANY_RECEIVER", "DYN", "OPTIONAL", "Declaration", "Overload", "function", "member"]

# Type names shared by the checker and the declarations (the rest are CEL's own, e.g. "int").
DYN: Final = "dyn"
OPTIONAL: Final = "optional"
ANY_RECEIVER: Final = "*"


@dataclass(frozen=True, slots=True)
class Overload:
    """One way to call a function, as the checker sees it."""

    receivers: frozenset[str] | None  # None: a global function; ANY_RECEIVER: any receiver type
    arities: frozenset[int]  # numbers of arguments, the receiver not counted
    result: str


def member(receivers: str, arities: Sequence[int], result: str) -> Overload:
    """``x.f(...)`` on a receiver of one of the space-separated types."""
    return Overload(frozenset(receivers.split()), frozenset(arities), result)


def function(arities: Sequence[int], result: str) -> Overload:
    """``f(...)``, a global function."""
    return Overload(None, frozenset(arities), result)


@dataclass(frozen=True, slots=True)
class Declaration:
    """A CEL function: its overloads and the one implementation that serves them all.

    The implementation takes the receiver, if any, as its first argument (cel-python's convention)
    and dispatches on the argument types itself.
    """

    name: str
    overloads: tuple[Overload, ...]
    implementation: Callable[..., Any]
    # The result depends on the arguments alone: a call with constant arguments is evaluated once,
    # at compile time (quantity("40Gi"), semver("1.2.0")).
    pure: bool = False
