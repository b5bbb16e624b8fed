"""Nodes and core/v1 node selectors, with the matching rules the scheduler applies."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_api.model._json import Ctx, drop_empty, empty_map, shared_map
from dra_api.model.errors import ModelError

_LABEL_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
_FIELD_OPERATORS = frozenset({"In", "NotIn"})


@dataclass(frozen=True, slots=True)
class Node:
    """What allocation needs of a Node: its name, labels and ``status.declaredFeatures`` (the node
    features the kubelet declares, e.g. ``DRAOptionalNodeOperations``)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=empty_map)
    declared_features: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Node:
        ctx = Ctx(what="Node", api_version="v1")
        meta = ctx.get_obj(obj.get("metadata"), "metadata")
        ctx.what = f"Node {meta.get('name', '<unnamed>')}"
        status = ctx.get_obj(obj.get("status"), "status")
        return cls(
            name=ctx.get_str(meta, "name", "metadata", required=True),
            labels=ctx.str_map(meta, "labels", "metadata"),
            declared_features=ctx.str_list(status, "declaredFeatures", "status"),
        )

    @classmethod
    def make(
        cls, name: str, labels: Mapping[str, str] | None = None, *, declared_features: Iterable[str] = ()
    ) -> Node:
        return cls(
            name=name, labels=shared_map(dict(labels or {})), declared_features=tuple(declared_features)
        )

    def cache_key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """A hashable identity (name and labels) for per-node caches."""
        return (self.name, tuple(sorted(self.labels.items())))


@dataclass(frozen=True, slots=True)
class NodeSelectorRequirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.values:
            out["values"] = list(self.values)
        return out

    def matches_label(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op == "Exists":
            return self.key in labels
        if op == "DoesNotExist":
            return self.key not in labels
        value = labels.get(self.key)
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        # Gt / Lt compare integers; a non-integer label never matches.
        if value is None:
            return False
        try:
            have, want = int(value), int(self.values[0])
        except (ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want

    def matches_field(self, node: Node) -> bool:
        # Only metadata.name is a supported node field (as in nodeaffinity).
        value = node.name if self.key == "metadata.name" else None
        if self.operator == "In":
            return value is not None and value in self.values
        return value is None or value not in self.values


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    match_expressions: tuple[NodeSelectorRequirement, ...] = ()
    match_fields: tuple[NodeSelectorRequirement, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return drop_empty(
            {
                "matchExpressions": [r.to_json() for r in self.match_expressions],
                "matchFields": [r.to_json() for r in self.match_fields],
            }
        )

    def matches(self, node: Node) -> bool:
        # An empty term selects nothing (core/v1 semantics).
        if not self.match_expressions and not self.match_fields:
            return False
        return all(r.matches_label(node.labels) for r in self.match_expressions) and all(
            r.matches_field(node) for r in self.match_fields
        )


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """core/v1 NodeSelector: terms are ORed, requirements within a term ANDed."""

    terms: tuple[NodeSelectorTerm, ...] = ()

    def matches(self, node: Node) -> bool:
        return any(t.matches(node) for t in self.terms)

    def to_json(self) -> dict[str, Any]:
        return {"nodeSelectorTerms": [t.to_json() for t in self.terms]}

    @classmethod
    def for_node(cls, node_name: str) -> NodeSelector:
        """The selector that pins to one node by name (as the allocator writes it)."""
        req = NodeSelectorRequirement(key="metadata.name", operator="In", values=(node_name,))
        return cls(terms=(NodeSelectorTerm(match_fields=(req,)),))

    @classmethod
    def parse(cls, ctx: Ctx, obj: Mapping[str, Any], path: str) -> NodeSelector:
        terms = ctx.items(obj, "nodeSelectorTerms", path, lambda t, p: _parse_term(ctx, t, p))
        return cls(terms=terms)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> NodeSelector:
        return cls.parse(Ctx(what="NodeSelector", api_version="v1"), obj, "")


def _parse_term(ctx: Ctx, obj: Mapping[str, Any], path: str) -> NodeSelectorTerm:
    return NodeSelectorTerm(
        match_expressions=ctx.items(
            obj, "matchExpressions", path, lambda r, p: _parse_requirement(ctx, r, p, _LABEL_OPERATORS)
        ),
        match_fields=ctx.items(
            obj, "matchFields", path, lambda r, p: _parse_requirement(ctx, r, p, _FIELD_OPERATORS)
        ),
    )


def _parse_requirement(
    ctx: Ctx, obj: Mapping[str, Any], path: str, operators: frozenset[str]
) -> NodeSelectorRequirement:
    key = ctx.get_str(obj, "key", path, required=True)
    op = ctx.get_str(obj, "operator", path, required=True)
    if op not in operators:
        ctx.fail(
            f"{path}.operator", f"unsupported operator {op!r}; expected one of {', '.join(sorted(operators))}"
        )
    values = ctx.str_list(obj, "values", path)
    if op in ("In", "NotIn") and not values:
        ctx.fail(f"{path}.values", f"must be non-empty for operator {op}")
    if op in ("Exists", "DoesNotExist") and values:
        ctx.fail(f"{path}.values", f"must be empty for operator {op}")
    if op in ("Gt", "Lt") and len(values) != 1:
        ctx.fail(f"{path}.values", f"must have exactly one value for operator {op}")
    return NodeSelectorRequirement(key=key, operator=op, values=values)


__all__ = ["ModelError", "Node", "NodeSelector", "NodeSelectorRequirement", "NodeSelectorTerm"]
