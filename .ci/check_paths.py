#!/usr/bin/env python3
"""Fail on any path in the repository that leads out of it.

A plain clone has nothing beside it, so a test, build step or doc that reads a folder beside it works
only on the machine it was written on. Two kinds of path are checked in every tracked file:

- relative path strings that climb with ``..``: resolved against the repository root for code and
  build files (they run from there) and against the file's own folder for documents and
  manifests (links and kustomize paths are relative to the file);
- in Python, ``Path(__file__)`` climbed with ``.parent`` / ``.parents[N]`` (or ``os.path.dirname``)
  further up than the repository root.

Usage: ``python .ci/check_paths.py [ROOT]``; prints one line per finding and exits 1 if any.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

# Files whose relative paths are taken from the repository root (where they run).
_RUN_FROM_ROOT = {".py", ".sh", ".ini", ".toml", ".cfg", ".mk", ""}
# A relative path: one or more "../" followed by a name, not part of a longer token or URL.
_UP_PATH = re.compile(r"(?<![\w./-])((?:\.\./)+[\w.@+-][\w./@+-]*)")


def tracked_files(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z"], check=True, capture_output=True, text=True
    ).stdout
    return [name for name in out.split("\0") if name]


def _escapes(base: PurePosixPath, relative: str) -> bool:
    """Whether ``relative`` taken from ``base`` (a folder inside the root, root = '.') leaves the root."""
    depth = len([p for p in base.parts if p not in ("", ".")])
    for part in PurePosixPath(relative).parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part != ".":
            depth += 1
    return False


def text_findings(name: str, text: str) -> Iterator[str]:
    path = PurePosixPath(name)
    base = PurePosixPath(".") if path.suffix in _RUN_FROM_ROOT or name == "Makefile" else path.parent
    for lineno, line in enumerate(text.splitlines(), start=1):
        for match in _UP_PATH.finditer(line):
            if _escapes(base, match.group(1)):
                yield f"{name}:{lineno}: {match.group(1)} leads out of the repository"


def _levels_up(node: ast.expr) -> int | None:
    """How many folders above ``__file__`` the expression climbs, or None if it is not such a chain."""
    if isinstance(node, ast.Name) and node.id == "__file__":
        return 0
    if isinstance(node, ast.Call):
        func = node.func
        # Path(__file__), pathlib.Path(__file__)
        if (isinstance(func, ast.Name) and func.id == "Path") or (
            isinstance(func, ast.Attribute) and func.attr == "Path"
        ):
            return _levels_up(node.args[0]) if len(node.args) == 1 else None
        if isinstance(func, ast.Attribute) and func.attr in ("resolve", "absolute"):
            return _levels_up(func.value)
        # os.path.dirname(x), os.path.abspath(x), os.path.realpath(x)
        if isinstance(func, ast.Attribute) and func.attr in ("dirname", "abspath", "realpath"):
            inner = _levels_up(node.args[0]) if len(node.args) == 1 else None
            return None if inner is None else inner + (func.attr == "dirname")
        return None
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _levels_up(node.value)
        return None if inner is None else inner + 1
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "parents"
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, int)
    ):
        inner = _levels_up(node.value.value)
        return None if inner is None else inner + node.slice.value + 1
    return None


def python_findings(name: str, source: str) -> Iterator[str]:
    try:
        tree = ast.parse(source, filename=name)
    except SyntaxError:
        return  # ruff reports it
    # From the file, one level up is its folder; the root is as many levels up as the file is deep.
    root_level = len(PurePosixPath(name).parts)
    reported: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.expr) or node.lineno in reported:
            continue
        levels = _levels_up(node)
        if levels is not None and levels > root_level:
            reported.add(node.lineno)
            yield (
                f"{name}:{node.lineno}: climbs {levels} folders from the file, "
                f"{levels - root_level} above the repository root"
            )


def findings(root: Path) -> list[str]:
    found: list[str] = []
    for name in tracked_files(root):
        file = root / name
        if file.is_symlink() or not file.is_file():
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary
        found.extend(text_findings(name, text))
        if name.endswith(".py"):
            found.extend(python_findings(name, text))
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parent.parent)
    found = findings(root)
    for line in found:
        print(line)
    if found:
        print(f"check_paths: {len(found)} path(s) lead out of the repository; a clone has nothing beside it")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
