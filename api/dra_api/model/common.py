"""Pieces shared by several kinds: metadata, selectors, tolerations, taints, opaque config."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_api.model._json import Ctx, drop_empty, empty_map, parameters_text


@dataclass(frozen=True, slots=True)
class OwnerReference:
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
        }
        if self.controller:
            out["controller"] = True
        return out


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """The metadata fields the driver reads; everything else is not kept."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    labels: Mapping[str, str] = field(default_factory=empty_map)
    annotations: Mapping[str, str] = field(default_factory=empty_map)
    finalizers: tuple[str, ...] = ()
    deletion_timestamp: str | None = None
    owner_references: tuple[OwnerReference, ...] = ()

    @classmethod
    def parse(cls, ctx: Ctx, obj: Mapping[str, Any]) -> ObjectMeta:
        meta = ctx.get_obj(obj.get("metadata"), "metadata")
        p = "metadata"
        return cls(
            name=ctx.get_str(meta, "name", p),
            namespace=ctx.get_str(meta, "namespace", p),
            uid=ctx.get_str(meta, "uid", p),
            resource_version=ctx.get_str(meta, "resourceVersion", p),
            generation=ctx.get_int(meta, "generation", p, default=0),
            labels=ctx.str_map(meta, "labels", p),
            annotations=ctx.str_map(meta, "annotations", p),
            finalizers=ctx.str_list(meta, "finalizers", p),
            deletion_timestamp=ctx.get_opt_str(meta, "deletionTimestamp", p),
            owner_references=ctx.items(
                meta,
                "ownerReferences",
                p,
                lambda o, q: OwnerReference(
                    api_version=ctx.get_str(o, "apiVersion", q),
                    kind=ctx.get_str(o, "kind", q),
                    name=ctx.get_str(o, "name", q),
                    uid=ctx.get_str(o, "uid", q),
                    controller=ctx.get_bool(o, "controller", q),
                ),
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return drop_empty(
            {
                "name": self.name or None,
                "namespace": self.namespace or None,
                "uid": self.uid or None,
                "resourceVersion": self.resource_version or None,
                "generation": self.generation or None,
                "labels": dict(self.labels),
                "annotations": dict(self.annotations),
                "finalizers": list(self.finalizers),
                "deletionTimestamp": self.deletion_timestamp,
                "ownerReferences": [o.to_json() for o in self.owner_references],
            }
        )

    @property
    def ref(self) -> str:
        """``namespace/name`` (or ``name`` when cluster-scoped), as klog.KObj prints it."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True, slots=True)
class DeviceSelector:
    """A device selector; ``cel`` is None for a selector of a type this code does not know."""

    cel: str | None

    @classmethod
    def parse(cls, ctx: Ctx, obj: Mapping[str, Any], path: str) -> DeviceSelector:
        cel = obj.get("cel")
        if cel is None:
            return cls(cel=None)
        cel_obj = ctx.get_obj(cel, f"{path}.cel")
        return cls(cel=ctx.get_str(cel_obj, "expression", f"{path}.cel", required=True))

    def to_json(self) -> dict[str, Any]:
        return {} if self.cel is None else {"cel": {"expression": self.cel}}


_TOLERATION_OPERATORS = ("Exists", "Equal")
_EFFECTS = ("NoSchedule", "NoExecute", "None")


@dataclass(frozen=True, slots=True)
class DeviceToleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None

    @classmethod
    def parse(cls, ctx: Ctx, obj: Mapping[str, Any], path: str) -> DeviceToleration:
        op = ctx.get_str(obj, "operator", path) or "Equal"
        if op not in _TOLERATION_OPERATORS:
            ctx.fail(f"{path}.operator", f"unsupported operator {op!r}; expected Exists or Equal")
        effect = ctx.get_str(obj, "effect", path)
        if effect and effect not in _EFFECTS:
            ctx.fail(
                f"{path}.effect", f"unsupported effect {effect!r}; expected one of {', '.join(_EFFECTS)}"
            )
        return cls(
            key=ctx.get_str(obj, "key", path),
            operator=op,
            value=ctx.get_str(obj, "value", path),
            effect=effect,
            toleration_seconds=ctx.get_opt_int(obj, "tolerationSeconds", path),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out

    def tolerates(self, taint: DeviceTaint) -> bool:
        """core/v1 toleration semantics: empty key matches all keys, empty effect all effects."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"
    time_added: str | None = None

    @classmethod
    def parse(cls, ctx: Ctx, obj: Mapping[str, Any], path: str) -> DeviceTaint:
        effect = ctx.get_str(obj, "effect", path, required=True)
        if effect not in _EFFECTS:
            ctx.fail(
                f"{path}.effect", f"unsupported effect {effect!r}; expected one of {', '.join(_EFFECTS)}"
            )
        return cls(
            key=ctx.get_str(obj, "key", path, required=True),
            value=ctx.get_str(obj, "value", path),
            effect=effect,
            time_added=ctx.get_opt_str(obj, "timeAdded", path),
        )

    def to_json(self) -> dict[str, Any]:
        return drop_empty(
            {
                "key": self.key,
                "value": self.value or None,
                "effect": self.effect,
                "timeAdded": self.time_added,
            }
        )

    @property
    def blocks_scheduling(self) -> bool:
        return self.effect in ("NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class OpaqueConfig:
    """``opaque: {driver, parameters}``; parameters kept as JSON text (immutable)."""

    driver: str
    parameters_json: str

    @property
    def parameters(self) -> Any:
        return json.loads(self.parameters_json)

    @classmethod
    def parse(cls, ctx: Ctx, obj: Mapping[str, Any], path: str) -> OpaqueConfig | None:
        raw = obj.get("opaque")
        if raw is None:
            return None  # a configuration type this code does not know
        opaque = ctx.get_obj(raw, f"{path}.opaque")
        return cls(
            driver=ctx.get_str(opaque, "driver", f"{path}.opaque", required=True),
            parameters_json=parameters_text(ctx, opaque.get("parameters"), f"{path}.opaque.parameters"),
        )

    def to_json(self) -> dict[str, Any]:
        return {"driver": self.driver, "parameters": self.parameters}


@dataclass(frozen=True, slots=True)
class ClassConfig:
    """A DeviceClass config entry."""

    opaque: OpaqueConfig | None

    def to_json(self) -> dict[str, Any]:
        return {"opaque": self.opaque.to_json()} if self.opaque else {}


@dataclass(frozen=True, slots=True)
class ClaimConfig:
    """A claim config entry: applies to ``requests`` (empty = all requests)."""

    requests: tuple[str, ...]
    opaque: OpaqueConfig | None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.requests:
            out["requests"] = list(self.requests)
        if self.opaque:
            out["opaque"] = self.opaque.to_json()
        return out
