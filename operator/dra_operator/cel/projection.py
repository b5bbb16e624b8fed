"""What part of a device a selector reads, so results can be shared between devices.

Walking the parse tree finds every use of ``device`` and the longest constant access path behind
it: ``device.driver``, ``device.attributes["dom"].name``, ``device.capacity["dom"]["name"]``,
``"name" in device.attributes["dom"]``... A path that stops early (a whole domain map passed to
``cel.bind`` or iterated by a macro, an index computed at run time, ``device`` itself) widens the read
to everything below that point. Two devices with the same values at every read point give the same
result, so the selector is evaluated once for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import lark

from .checker import Tree, bare_ident, literal_string, unwrap

__all__ = ["DeviceReads", "analyse"]

_KINDS: Final = ("attributes", "capacity")


@dataclass(slots=True)
class DeviceReads:
    """The parts of ``device`` an expression reads."""

    whole_device: bool = False
    driver: bool = False
    allow_multiple: bool = False
    # Per kind ("attributes"/"capacity"): the whole map, whole domains, single entries.
    whole_kind: set[str] = field(default_factory=set)
    domains: set[tuple[str, str]] = field(default_factory=set)
    entries: set[tuple[str, str, str]] = field(default_factory=set)

    def record(self, steps: list[str]) -> None:
        if not steps:
            self.whole_device = True
            return
        head = steps[0]
        if head == "driver":
            self.driver = True
        elif head == "allowMultipleAllocations":
            self.allow_multiple = True
        elif head in _KINDS:
            if len(steps) == 1:
                self.whole_kind.add(head)
            elif len(steps) == 2:
                self.domains.add((head, steps[1]))
            else:
                self.entries.add((head, steps[1], steps[2]))
        else:
            # Unknown fields are compile errors; be safe anyway.
            self.whole_device = True

    def normalised(self) -> DeviceReads:
        """Drop reads covered by wider ones, so the projection stays small and canonical."""
        out = DeviceReads(
            whole_device=self.whole_device, driver=self.driver, allow_multiple=self.allow_multiple
        )
        out.whole_kind = set(self.whole_kind)
        out.domains = {d for d in self.domains if d[0] not in self.whole_kind}
        out.entries = {
            e for e in self.entries if e[0] not in self.whole_kind and (e[0], e[1]) not in out.domains
        }
        return out


def _chain(node: Tree) -> tuple[str, list[str | None], list[Tree]] | None:
    """Return (root identifier, access steps, index expressions) for a pure access chain.

    A step is a field name or a constant string index; ``None`` marks an index computed at run time.
    """
    steps: list[str | None] = []
    indexes: list[Tree] = []
    current = node
    while True:
        if current.data in ("member", "primary") and len(current.children) == 1:
            child = current.children[0]
            if not isinstance(child, lark.Tree):
                return None
            current = child
        elif current.data in ("member_dot", "member_dot_opt"):
            target, name = current.children
            assert isinstance(target, lark.Tree)
            steps.append(str(name))
            current = target
        elif current.data in ("member_index", "member_index_opt"):
            target, index = current.children
            assert isinstance(target, lark.Tree)
            assert isinstance(index, lark.Tree)
            steps.append(literal_string(index))
            indexes.append(index)
            current = target
        elif current.data == "ident":
            steps.reverse()
            return str(current.children[0]), steps, indexes
        else:
            return None


def _constant_prefix(steps: list[str | None]) -> list[str]:
    prefix: list[str] = []
    for step in steps:
        if step is None:
            break
        prefix.append(step)
    return prefix


class _Walker:
    def __init__(self) -> None:
        self.reads = DeviceReads()
        self.shadowed = False

    def visit(self, node: Tree) -> None:
        if node.data in ("member_dot", "member_index", "member_dot_opt", "member_index_opt", "ident"):
            chain = _chain(node)
            if chain is not None and chain[0] == "device":
                self.reads.record(_constant_prefix(chain[1]))
                for index in chain[2]:
                    self.visit(index)
                return
        if node.data == "relation" and len(node.children) == 2 and self._presence_test(node):
            return
        if node.data in ("member_dot_arg", "ident_arg"):
            self._note_bound_names(node)
        for child in node.children:
            if isinstance(child, lark.Tree):
                self.visit(child)

    def _presence_test(self, node: Tree) -> bool:
        """``"name" in device.attributes["dom"]`` reads one entry, not the whole domain."""
        op_node, right = node.children
        if not (
            isinstance(op_node, lark.Tree) and op_node.data == "relation_in" and isinstance(right, lark.Tree)
        ):
            return False
        left = op_node.children[0]
        assert isinstance(left, lark.Tree)
        name = literal_string(left)
        chain = _chain(unwrap(right))
        if name is None or chain is None or chain[0] != "device":
            return False
        steps = chain[1]
        if len(steps) != 2 or steps[0] not in _KINDS or steps[1] is None:
            return False
        self.reads.entries.add((steps[0], steps[1], name))
        return True

    def _note_bound_names(self, node: Tree) -> None:
        # A macro or cel.bind variable named "device" would hide the real one: be conservative.
        exprlist = node.children[-1]
        if isinstance(exprlist, lark.Tree) and exprlist.data == "exprlist":
            for arg in exprlist.children:
                if isinstance(arg, lark.Tree) and bare_ident(arg) == "device" and len(exprlist.children) > 1:
                    self.shadowed = True


def analyse(tree: Tree) -> DeviceReads:
    """Find what a parsed selector reads from ``device``."""
    walker = _Walker()
    walker.visit(tree)
    if walker.shadowed:
        return DeviceReads(whole_device=True)
    return walker.reads.normalised()
