"""kubectl-style output: tables (upper-case headers, columns 3 spaces apart, ``<none>`` for an empty
cell), ``List`` objects for ``-o json|yaml``, and kubectl's short ages."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

NONE = "<none>"
OUTPUTS = ("table", "wide", "json", "yaml")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Rows under an upper-case header, each column as wide as its widest cell, 3 spaces between."""
    cells = [[h.upper() for h in header]] + [[cell or NONE for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines) + "\n"


def as_list(items: Sequence[Mapping[str, Any]], **extra: Any) -> dict[str, Any]:
    """A ``List`` of rows, as ``kubectl get -o json`` prints several objects (``extra``: more fields)."""
    return {"apiVersion": "v1", "kind": "List", "items": list(items), **extra}


def dump(obj: Any, output: str) -> str:
    if output == "json":
        return json.dumps(obj, indent=4) + "\n"
    return str(yaml.safe_dump(obj, sort_keys=False, default_flow_style=False))


def joined(values: Sequence[str]) -> str:
    """Several values in one cell, as kubectl does (comma-separated, no spaces)."""
    return ",".join(values)


def human_age(seconds: float) -> str:
    """kubectl's age: 45s, 3m12s, 42m, 5h3m, 20h, 3d4h, 12d, 2y30d (after duration.HumanDuration)."""
    s = int(max(0.0, seconds))
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    years = days // 365
    if years < 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"
