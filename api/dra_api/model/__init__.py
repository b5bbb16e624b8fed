"""Typed, immutable views of the ``resource.k8s.io`` objects (v1, v1beta2 and v1beta1 JSON).

Every kind has ``Kind.from_json(obj)`` (accepting ``resource.k8s.io/v1``, ``v1beta2`` - identical to
v1 - and ``v1beta1`` with its ``basic`` device wrapper and flat requests) and ``to_json(api_version)``.
Bad input raises :class:`ModelError`, whose message names the object and the field path, e.g.
``ResourceClaim ns/c: spec.devices.requests[0].deviceClassName is a v1beta1 field; in
resource.k8s.io/v1 it belongs under exactly``.

Objects are frozen slots dataclasses holding tuples and read-only maps; strings are interned and
identical attribute/capacity maps are shared between devices so that large clusters stay small.
Quantities are :class:`dra_api.quantity.Quantity`; attribute values come from
:mod:`dra_api.attributes` (an unusable value is kept as ``UnsupportedAttribute``).
:func:`from_json` dispatches on ``kind``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_api.model._json import (
    API_VERSIONS,
    V1,
    V1BETA1,
    V1BETA2,
    KeyedTuple,
    empty_map,
    keyed_map,
    shared_map,
)
from dra_api.model.allocation import (
    FROM_CLAIM,
    FROM_CLASS,
    AllocatedDeviceStatus,
    AllocationResult,
    ConsumerReference,
    DeviceAllocationConfiguration,
    DeviceRequestAllocationResult,
    ResourceClaimStatus,
)
from dra_api.model.claims import (
    ALL,
    EXACT_COUNT,
    DerivedAttribute,
    DeviceClass,
    DeviceConstraint,
    DeviceRequest,
    DeviceSubRequest,
    ExactDeviceRequest,
    ResourceClaim,
    ResourceClaimSpec,
    ResourceClaimTemplate,
)
from dra_api.model.common import (
    ClaimConfig,
    ClassConfig,
    DeviceSelector,
    DeviceTaint,
    DeviceToleration,
    ObjectMeta,
    OpaqueConfig,
    OwnerReference,
)
from dra_api.model.errors import ModelError
from dra_api.model.nodes import Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm
from dra_api.model.slices import (
    CapacityRequestPolicy,
    CounterSet,
    Device,
    DeviceCapacity,
    DeviceCounterConsumption,
    ResourcePool,
    ResourceSlice,
    ValidRange,
)

Object = DeviceClass | ResourceClaim | ResourceClaimTemplate | ResourceSlice

_KINDS: dict[str, Any] = {
    "DeviceClass": DeviceClass,
    "ResourceClaim": ResourceClaim,
    "ResourceClaimTemplate": ResourceClaimTemplate,
    "ResourceSlice": ResourceSlice,
}


def from_json(obj: Mapping[str, Any]) -> Object:
    """Parse any resource.k8s.io object by its ``kind``."""
    kind = obj.get("kind") if isinstance(obj, Mapping) else None
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ModelError(f"unsupported kind {kind!r}; expected one of {', '.join(_KINDS)}")
    result: Object = cls.from_json(obj)
    return result


__all__ = [
    "ALL",
    "API_VERSIONS",
    "EXACT_COUNT",
    "FROM_CLAIM",
    "FROM_CLASS",
    "V1",
    "V1BETA1",
    "V1BETA2",
    "AllocatedDeviceStatus",
    "AllocationResult",
    "CapacityRequestPolicy",
    "ClaimConfig",
    "ClassConfig",
    "ConsumerReference",
    "CounterSet",
    "DerivedAttribute",
    "Device",
    "DeviceAllocationConfiguration",
    "DeviceCapacity",
    "DeviceClass",
    "DeviceConstraint",
    "DeviceCounterConsumption",
    "DeviceRequest",
    "DeviceRequestAllocationResult",
    "DeviceSelector",
    "DeviceSubRequest",
    "DeviceTaint",
    "DeviceToleration",
    "ExactDeviceRequest",
    "KeyedTuple",
    "ModelError",
    "Node",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "Object",
    "ObjectMeta",
    "OpaqueConfig",
    "OwnerReference",
    "ResourceClaim",
    "ResourceClaimSpec",
    "ResourceClaimStatus",
    "ResourceClaimTemplate",
    "ResourcePool",
    "ResourceSlice",
    "ValidRange",
    "empty_map",
    "from_json",
    "keyed_map",
    "shared_map",
]
