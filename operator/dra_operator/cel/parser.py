"""Parsing selectors with cel-python's grammar, extended with CEL optional field selection.

Kubernetes enables CEL optional types, and its own "no such key" error message recommends
``device.attributes["dom"].?name.orValue(default)``. cel-python 0.5.0's grammar has no ``.?`` or
``[?``, so this module builds a parser from cel-python's ``cel.lark`` with two extra member rules
(``member_dot_opt``, ``member_index_opt``) and otherwise the same options as ``celpy.CELParser``.
"""

from __future__ import annotations

import io
import re
import threading
from pathlib import Path
from typing import Final

import celpy
import lark
from celpy.celparser import CELParser

from .checker import Tree
from .errors import CelCompileError

__all__ = ["parse"]

_MEMBER_RULE: Final = "member         : member_dot | member_dot_arg | member_index | member_object | primary"
_EXTENSION: Final = """
member         : member_dot | member_dot_arg | member_index | member_object
               | member_dot_opt | member_index_opt | primary
member_dot_opt   : member ".?" IDENT
member_index_opt : member "[?" expr "]"
"""

# One parser per thread: lark parsers are not documented as thread-safe, and a lock would make the
# event loop wait while a worker thread parses a long selector. The grammar's LALR analysis (about a
# quarter of a CPU second) is done once per process; each thread loads its parser from that (a few
# milliseconds), so a new search or compile thread does not hold the interpreter for the analysis.
_local = threading.local()
_analysed: bytes | None = None
_analysed_lock = threading.Lock()


def _build() -> lark.Lark:
    grammar = (Path(celpy.__file__).parent / "cel.lark").read_text()
    if _MEMBER_RULE not in grammar:
        raise RuntimeError("cel-python's grammar changed: the optional-selection extension needs updating")
    grammar = grammar.replace(_MEMBER_RULE, _EXTENSION.strip())
    return lark.Lark(
        grammar,
        parser="lalr",
        start="expr",
        g_regex_flags=re.M,
        lexer_callbacks={"IDENT": CELParser.ambiguous_literals},
        propagate_positions=True,
        maybe_placeholders=False,
        priority="invert",
    )


def _thread_parser() -> lark.Lark:
    """This thread's parser, loaded from the process's one analysis of the grammar."""
    global _analysed
    with _analysed_lock:
        if _analysed is None:
            saved = io.BytesIO()
            _build().save(saved)
            _analysed = saved.getvalue()
    return lark.Lark.load(io.BytesIO(_analysed))


def parse(expression: str) -> Tree:
    """Parse a selector; CelCompileError with the position of a syntax error."""
    parser: lark.Lark | None = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = _thread_parser()
    try:
        tree: Tree = parser.parse(expression)
    except lark.exceptions.UnexpectedInput as exc:
        line, column = exc.line, exc.column
        lines = expression.splitlines() or [""]
        rest = lines[line - 1][column - 1 :] if 0 < line <= len(lines) and column > 0 else ""
        near = f"near {rest[:20]!r}" if rest.strip() else "at end of input"
        raise CelCompileError(
            f"compilation failed: ERROR: <input>:{line}:{column}: Syntax error: unexpected input {near}"
        ) from None
    except lark.exceptions.LarkError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CelCompileError(f"compilation failed: ERROR: <input>: Syntax error: {first}") from None
    return tree
