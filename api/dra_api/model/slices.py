"""ResourceSlice: a pool's devices (attributes, capacity, counters, taints) and shared counters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_api.attributes import (
    INT64_MAX,
    INT64_MIN,
    AttributeValue,
    UnsupportedAttribute,
    Version,
    attribute_to_json,
    device_attribute_from_json,
)
from dra_api.model._json import (
    V1,
    V1BETA1,
    Ctx,
    check_version,
    drop_empty,
    empty_map,
    intern,
    keyed_map,
    shared_map,
)
from dra_api.model.common import DeviceTaint, ObjectMeta
from dra_api.model.nodes import NodeSelector
from dra_api.quantity import Quantity

# Attribute values are interned so that equal values across devices share one object.
_values: dict[tuple[type, str], Any] = {}


def _intern_value(value: Any) -> Any:
    """Share equal versions and lists between devices; strings go through sys.intern."""
    if isinstance(value, str):
        return intern(value)
    if not isinstance(value, Version | tuple):
        return value  # bools and small ints are shared by Python already
    key = (type(value), repr(value))  # repr keeps (True,) and (1,) apart
    found = _values.get(key)
    if found is None:
        if len(_values) > 200_000:
            _values.clear()
        found = _values[key] = value
    return found


_NOT_PLAIN: Any = object()
_versions: dict[str, Version] = {}


def _plain_attribute(raw: Any) -> Any:
    """The value of an attribute in its common form (one valid scalar field), as the full decoding
    and :func:`_intern_value` would make it; :data:`_NOT_PLAIN` for any other form. A large
    cluster's slices hold about ten attributes per device: the full path was most of their parsing."""
    if type(raw) is not dict or len(raw) != 1:
        return _NOT_PLAIN
    ((name, value),) = raw.items()
    kind = type(value)
    if name == "string" and kind is str:
        return intern(value)
    if name == "int" and kind is int and INT64_MIN <= value <= INT64_MAX:
        return value
    if name == "bool" and kind is bool:
        return value
    if name == "version" and kind is str:
        found = _versions.get(value)
        if found is None:
            try:
                parsed = Version(value)
            except ValueError:
                return _NOT_PLAIN  # the full path makes it an UnsupportedAttribute
            if len(_versions) > 100_000:
                _versions.clear()
            found = _versions[value] = _intern_value(parsed)
        return found
    return _NOT_PLAIN


@dataclass(frozen=True, slots=True)
class ValidRange:
    min: Quantity
    max: Quantity | None = None
    step: Quantity | None = None

    def to_json(self) -> dict[str, Any]:
        return drop_empty(
            {
                "min": str(self.min),
                "max": None if self.max is None else str(self.max),
                "step": None if self.step is None else str(self.step),
            }
        )


@dataclass(frozen=True, slots=True)
class CapacityRequestPolicy:
    default: Quantity | None = None
    valid_values: tuple[Quantity, ...] = ()
    valid_range: ValidRange | None = None

    def to_json(self) -> dict[str, Any]:
        return drop_empty(
            {
                "default": None if self.default is None else str(self.default),
                "validValues": [str(v) for v in self.valid_values],
                "validRange": None if self.valid_range is None else self.valid_range.to_json(),
            }
        )


@dataclass(frozen=True, slots=True)
class DeviceCapacity:
    value: Quantity
    request_policy: CapacityRequestPolicy | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": str(self.value)}
        if self.request_policy is not None:
            out["requestPolicy"] = self.request_policy.to_json()
        return out


@dataclass(frozen=True, slots=True)
class CounterSet:
    """``sharedCounters[]``: a named set of counters that devices of the pool consume."""

    name: str
    counters: Mapping[str, Quantity]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "counters": {k: {"value": str(v)} for k, v in self.counters.items()}}


@dataclass(frozen=True, slots=True)
class DeviceCounterConsumption:
    """``consumesCounters[]``. ``compatibility_groups`` (DRADeviceCompatibilityGroups, 1.37): the
    device shares the counter set only with devices whose groups intersect its own."""

    counter_set: str
    counters: Mapping[str, Quantity]
    compatibility_groups: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "counterSet": self.counter_set,
            "counters": {k: {"value": str(v)} for k, v in self.counters.items()},
        }
        if self.compatibility_groups:
            out["compatibilityGroups"] = list(self.compatibility_groups)
        return out


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a slice. ``attributes`` may hold :class:`UnsupportedAttribute` for values
    that decode but cannot be used (upstream fails selector evaluation on them)."""

    name: str
    attributes: Mapping[str, AttributeValue | UnsupportedAttribute] = field(default_factory=empty_map)
    capacity: Mapping[str, DeviceCapacity] = field(default_factory=empty_map)
    consumes_counters: tuple[DeviceCounterConsumption, ...] = ()
    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool = False
    taints: tuple[DeviceTaint, ...] = ()
    binds_to_node: bool = False
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    allow_multiple_allocations: bool = False

    def body_json(self) -> dict[str, Any]:
        """The device's fields without ``name`` (v1 layout; v1beta1 wraps them in ``basic``)."""
        return drop_empty(
            {
                "attributes": {k: _attribute_json(v) for k, v in self.attributes.items()},
                "capacity": {k: v.to_json() for k, v in self.capacity.items()},
                "consumesCounters": [c.to_json() for c in self.consumes_counters],
                "nodeName": self.node_name,
                "nodeSelector": None if self.node_selector is None else self.node_selector.to_json(),
                "allNodes": True if self.all_nodes else None,
                "taints": [t.to_json() for t in self.taints],
                "bindsToNode": True if self.binds_to_node else None,
                "bindingConditions": list(self.binding_conditions),
                "bindingFailureConditions": list(self.binding_failure_conditions),
                "allowMultipleAllocations": True if self.allow_multiple_allocations else None,
            }
        )


def _attribute_json(value: AttributeValue | UnsupportedAttribute) -> dict[str, Any]:
    return {} if isinstance(value, UnsupportedAttribute) else attribute_to_json(value)


@dataclass(frozen=True, slots=True)
class ResourcePool:
    name: str
    generation: int
    resource_slice_count: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "generation": self.generation,
            "resourceSliceCount": self.resource_slice_count,
        }


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    """A ResourceSlice. Exactly one of node_name / node_selector / all_nodes /
    per_device_node_selection says which nodes can reach its devices. ``skip_node_operations``
    (DRAOptionalNodeOperations, 1.37): the node-local calls the kubelet skips for its devices."""

    metadata: ObjectMeta
    driver: str
    pool: ResourcePool
    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool = False
    per_device_node_selection: bool = False
    devices: tuple[Device, ...] = ()
    shared_counters: tuple[CounterSet, ...] = ()
    skip_node_operations: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.metadata.name

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ResourceSlice:
        ctx = check_version(obj, "ResourceSlice")
        meta = ObjectMeta.parse(ctx, obj)
        spec = ctx.get_obj(obj.get("spec"), "spec")
        pool = ctx.get_obj(spec.get("pool"), "spec.pool")
        if "pool" not in spec:
            ctx.fail("spec.pool", "is required")
        node_selector = spec.get("nodeSelector")
        return cls(
            metadata=meta,
            driver=ctx.get_str(spec, "driver", "spec", required=True),
            pool=ResourcePool(
                name=ctx.get_str(pool, "name", "spec.pool", required=True),
                generation=ctx.get_int(pool, "generation", "spec.pool", default=0),
                resource_slice_count=ctx.get_int(pool, "resourceSliceCount", "spec.pool", default=1),
            ),
            node_name=ctx.get_opt_str(spec, "nodeName", "spec") or None,
            node_selector=None
            if node_selector is None
            else NodeSelector.parse(
                ctx, ctx.get_obj(node_selector, "spec.nodeSelector"), "spec.nodeSelector"
            ),
            all_nodes=ctx.get_bool(spec, "allNodes", "spec"),
            per_device_node_selection=ctx.get_bool(spec, "perDeviceNodeSelection", "spec"),
            devices=ctx.items(spec, "devices", "spec", lambda d, p: _parse_device(ctx, d, p)),
            shared_counters=ctx.items(
                spec, "sharedCounters", "spec", lambda c, p: _parse_counter_set(ctx, c, p)
            ),
            skip_node_operations=ctx.str_list(spec, "skipNodeOperations", "spec"),
        )

    def to_json(self, api_version: str = V1) -> dict[str, Any]:
        devices = []
        for d in self.devices:
            body = d.body_json()
            devices.append(
                {"name": d.name, "basic": body} if api_version == V1BETA1 else {"name": d.name, **body}
            )
        spec = drop_empty(
            {
                "driver": self.driver,
                "pool": self.pool.to_json(),
                "nodeName": self.node_name,
                "nodeSelector": None if self.node_selector is None else self.node_selector.to_json(),
                "allNodes": True if self.all_nodes else None,
                "perDeviceNodeSelection": True if self.per_device_node_selection else None,
                "devices": devices,
                "sharedCounters": [c.to_json() for c in self.shared_counters],
                "skipNodeOperations": list(self.skip_node_operations),
            }
        )
        return {
            "apiVersion": api_version,
            "kind": "ResourceSlice",
            "metadata": self.metadata.to_json(),
            "spec": spec,
        }


_V1_DEVICE_FIELDS = (
    "attributes",
    "capacity",
    "consumesCounters",
    "nodeName",
    "nodeSelector",
    "allNodes",
    "taints",
    "bindsToNode",
    "bindingConditions",
    "bindingFailureConditions",
    "allowMultipleAllocations",
)


def _parse_device(ctx: Ctx, obj: Mapping[str, Any], path: str) -> Device:
    name = ctx.get_str(obj, "name", path, required=True)
    if ctx.beta1:
        for field in _V1_DEVICE_FIELDS:
            if field in obj:
                ctx.fail_raw(
                    f"{path}.{field} is a resource.k8s.io/v1 field; "
                    f"in {ctx.api_version} it belongs under basic",
                )
        body = ctx.get_obj(obj.get("basic"), f"{path}.basic")
        path = f"{path}.basic"
    else:
        if "basic" in obj:
            ctx.fail_raw(
                f"{path}.basic is a v1beta1 field; "
                f"in {ctx.api_version} the device fields are directly on the device",
            )
        body = obj
    attributes: dict[str, AttributeValue | UnsupportedAttribute] = {}
    for key, raw in ctx.get_obj(body.get("attributes"), f"{path}.attributes").items():
        fast = _plain_attribute(raw)
        if fast is not _NOT_PLAIN:
            attributes[intern(key)] = fast
            continue
        try:
            value = device_attribute_from_json(ctx.get_obj(raw, f"{path}.attributes[{key}]"))
        except ValueError as exc:
            ctx.fail(f"{path}.attributes[{key}]", str(exc))
        attributes[intern(key)] = _intern_value(value)
    capacity: dict[str, DeviceCapacity] = {}
    for key, raw in ctx.get_obj(body.get("capacity"), f"{path}.capacity").items():
        capacity[intern(key)] = _parse_capacity(
            ctx, ctx.get_obj(raw, f"{path}.capacity[{key}]"), f"{path}.capacity[{key}]"
        )
    selector = body.get("nodeSelector")
    return Device(
        name=name,
        # Siblings differ in a few values (UUID, PCI address): share the keys, not the whole map.
        attributes=keyed_map(attributes),
        capacity=shared_map(capacity),
        consumes_counters=ctx.items(
            body,
            "consumesCounters",
            path,
            lambda c, p: DeviceCounterConsumption(
                counter_set=ctx.get_str(c, "counterSet", p, required=True),
                counters=_parse_counters(ctx, c, p),
                compatibility_groups=ctx.str_list(c, "compatibilityGroups", p),
            ),
        ),
        node_name=ctx.get_opt_str(body, "nodeName", path) or None,
        node_selector=None
        if selector is None
        else NodeSelector.parse(ctx, ctx.get_obj(selector, f"{path}.nodeSelector"), f"{path}.nodeSelector"),
        all_nodes=ctx.get_bool(body, "allNodes", path),
        taints=ctx.items(body, "taints", path, lambda t, p: DeviceTaint.parse(ctx, t, p)),
        binds_to_node=ctx.get_bool(body, "bindsToNode", path),
        binding_conditions=ctx.str_list(body, "bindingConditions", path),
        binding_failure_conditions=ctx.str_list(body, "bindingFailureConditions", path),
        allow_multiple_allocations=ctx.get_bool(body, "allowMultipleAllocations", path),
    )


def _parse_capacity(ctx: Ctx, obj: Mapping[str, Any], path: str) -> DeviceCapacity:
    if obj.get("value") is None:
        ctx.fail(f"{path}.value", "is required")
    value = ctx.quantity(obj["value"], f"{path}.value")
    raw_policy = obj.get("requestPolicy")
    if raw_policy is None:
        return _shared_capacity(value)
    pp = f"{path}.requestPolicy"
    policy = ctx.get_obj(raw_policy, pp)
    raw_range = policy.get("validRange")
    valid_range = None
    if raw_range is not None:
        rp = f"{pp}.validRange"
        rng = ctx.get_obj(raw_range, rp)
        if rng.get("min") is None:
            ctx.fail(f"{rp}.min", "is required")
        valid_range = ValidRange(
            min=ctx.quantity(rng["min"], f"{rp}.min"),
            max=None if rng.get("max") is None else ctx.quantity(rng["max"], f"{rp}.max"),
            step=None if rng.get("step") is None else ctx.quantity(rng["step"], f"{rp}.step"),
        )
        if valid_range.step is not None and valid_range.step.sign() <= 0:
            ctx.fail(f"{rp}.step", "must be positive")
    values = tuple(
        ctx.quantity(v, f"{pp}.validValues[{i}]")
        for i, v in enumerate(ctx.get_list(policy.get("validValues"), pp))
    )
    default = None if policy.get("default") is None else ctx.quantity(policy["default"], f"{pp}.default")
    return DeviceCapacity(
        value=value,
        request_policy=CapacityRequestPolicy(default=default, valid_values=values, valid_range=valid_range),
    )


_capacities: dict[Quantity, DeviceCapacity] = {}


def _shared_capacity(value: Quantity) -> DeviceCapacity:
    found = _capacities.get(value)
    if found is None or str(found.value) != str(value):
        if len(_capacities) > 100_000:
            _capacities.clear()
        found = _capacities[value] = DeviceCapacity(value=value)
    return found


def _parse_counters(ctx: Ctx, obj: Mapping[str, Any], path: str) -> Mapping[str, Quantity]:
    out: dict[str, Quantity] = {}
    for key, raw in ctx.get_obj(obj.get("counters"), f"{path}.counters").items():
        counter = ctx.get_obj(raw, f"{path}.counters[{key}]")
        if counter.get("value") is None:
            ctx.fail(f"{path}.counters[{key}].value", "is required")
        out[intern(key)] = ctx.quantity(counter["value"], f"{path}.counters[{key}].value")
    return shared_map(out)


def _parse_counter_set(ctx: Ctx, obj: Mapping[str, Any], path: str) -> CounterSet:
    return CounterSet(
        name=ctx.get_str(obj, "name", path, required=True), counters=_parse_counters(ctx, obj, path)
    )
