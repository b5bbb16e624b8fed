#!/usr/bin/env python3
"""Report product modules, classes and functions over the size limits.

The limits (issue 39): no module over 700 lines, no class over 400, no function over 80. A
module counts its lines; a class or a function counts from its first decorator to its last line,
docstring and comments included, and a method counts in its class as well as on its own. Generated
protobuf code (``*_pb2.py``, ``*_pb2_grpc.py`` and their stubs) is left out.

Every violation under the checked folders is printed; only those under an enforced folder fail the
run. The product (dra_api, the operator, the node agent) is enforced; the local cluster, a test tool,
is reported until it keeps the limits and moves from ``REPORTED`` to ``ENFORCED``.

Usage: ``python .ci/check_sizes.py [ROOT]``; exits 1 if an enforced folder has a violation.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 80

# Folders that fail the run, and folders whose violations are only reported.
ENFORCED = ("api", "operator", "node_agent")
REPORTED = ("devcluster",)

_GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi", "_pb2_grpc.pyi")


_Sized = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def _span(node: _Sized) -> int:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    last = node.end_lineno if node.end_lineno is not None else node.lineno
    return last - first + 1


def _qualified(tree: ast.Module) -> Iterator[tuple[str, _Sized]]:
    """Every class and function in ``tree``, named by its dotted path within the module."""
    stack: list[tuple[str, ast.AST]] = [("", tree)]
    while stack:
        prefix, parent = stack.pop()
        for child in ast.iter_child_nodes(parent):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, child
                stack.append((f"{name}.", child))
            else:
                stack.append((prefix, child))


def violations(path: Path, *, shown_as: str) -> list[str]:
    """One line per limit ``path`` goes over."""
    text = path.read_text(encoding="utf-8")
    out: list[str] = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        out.append(f"{shown_as}: module has {lines} lines (limit {MAX_MODULE_LINES})")
    for name, node in _qualified(ast.parse(text, filename=str(path))):
        size = _span(node)
        kind, limit = (
            ("class", MAX_CLASS_LINES) if isinstance(node, ast.ClassDef) else ("function", MAX_FUNCTION_LINES)
        )
        if size > limit:
            out.append(f"{shown_as}:{node.lineno}: {kind} {name} has {size} lines (limit {limit})")
    return out


def product_files(root: Path, folder: str) -> list[Path]:
    base = root / folder
    return sorted(
        p
        for p in base.rglob("*.py")
        if not p.name.endswith(_GENERATED_SUFFIXES) and not any(part.startswith(".") for part in p.parts)
    )


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(".")
    failing = 0
    for folder in (*ENFORCED, *REPORTED):
        enforced = folder in ENFORCED
        for path in product_files(root, folder):
            for line in violations(path, shown_as=path.relative_to(root).as_posix()):
                print(f"{line}{'' if enforced else ' [reported only]'}")
                failing += enforced
    if failing:
        print(f"{failing} size limit violations in {', '.join(ENFORCED)}", file=sys.stderr)
    return 1 if failing else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
