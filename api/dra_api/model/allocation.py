"""AllocationResult (``status.allocation``) and the rest of ResourceClaim status."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_api.model._json import Ctx, drop_empty, empty_map, parameters_text, shared_map
from dra_api.model.common import DeviceToleration, OpaqueConfig
from dra_api.model.nodes import NodeSelector
from dra_api.quantity import Quantity

FROM_CLASS = "FromClass"
FROM_CLAIM = "FromClaim"


@dataclass(frozen=True, slots=True)
class DeviceRequestAllocationResult:
    """One allocated device: ``request`` is ``<request>`` or ``<request>/<subrequest>``.
    ``skip_node_operations`` is copied from the device's slice (DRAOptionalNodeOperations)."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool | None = None
    tolerations: tuple[DeviceToleration, ...] = ()
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    share_id: str | None = None
    consumed_capacity: Mapping[str, Quantity] = field(default_factory=empty_map)
    skip_node_operations: tuple[str, ...] = ()

    @property
    def device_id(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)

    @property
    def parent_request(self) -> str:
        return self.request.split("/", 1)[0]

    def to_json(self) -> dict[str, Any]:
        return drop_empty(
            {
                "request": self.request,
                "driver": self.driver,
                "pool": self.pool,
                "device": self.device,
                "adminAccess": self.admin_access,
                "tolerations": [t.to_json() for t in self.tolerations],
                "bindingConditions": list(self.binding_conditions),
                "bindingFailureConditions": list(self.binding_failure_conditions),
                "shareID": self.share_id,
                "consumedCapacity": {k: str(v) for k, v in self.consumed_capacity.items()},
                "skipNodeOperations": list(self.skip_node_operations),
            }
        )

    @classmethod
    def parse(cls, ctx: Ctx, obj: Mapping[str, Any], path: str) -> DeviceRequestAllocationResult:
        consumed = {
            k: ctx.quantity(v, f"{path}.consumedCapacity[{k}]")
            for k, v in ctx.get_obj(obj.get("consumedCapacity"), f"{path}.consumedCapacity").items()
        }
        return cls(
            request=ctx.get_str(obj, "request", path, required=True),
            driver=ctx.get_str(obj, "driver", path, required=True),
            pool=ctx.get_str(obj, "pool", path, required=True),
            device=ctx.get_str(obj, "device", path, required=True),
            admin_access=ctx.get_opt_bool(obj, "adminAccess", path),
            tolerations=ctx.items(obj, "tolerations", path, lambda t, p: DeviceToleration.parse(ctx, t, p)),
            binding_conditions=ctx.str_list(obj, "bindingConditions", path),
            binding_failure_conditions=ctx.str_list(obj, "bindingFailureConditions", path),
            share_id=ctx.get_opt_str(obj, "shareID", path),
            consumed_capacity=shared_map(consumed),
            skip_node_operations=ctx.str_list(obj, "skipNodeOperations", path),
        )


@dataclass(frozen=True, slots=True)
class DeviceAllocationConfiguration:
    """A config entry of an allocation: ``source`` is FromClass or FromClaim; empty requests = all."""

    source: str
    requests: tuple[str, ...]
    opaque: OpaqueConfig | None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source}
        if self.requests:
            out["requests"] = list(self.requests)
        if self.opaque is not None:
            out["opaque"] = self.opaque.to_json()
        return out

    @classmethod
    def parse(cls, ctx: Ctx, obj: Mapping[str, Any], path: str) -> DeviceAllocationConfiguration:
        source = ctx.get_str(obj, "source", path, required=True)
        if source not in (FROM_CLASS, FROM_CLAIM):
            ctx.fail(f"{path}.source", f"must be {FROM_CLASS} or {FROM_CLAIM}, not {source!r}")
        return cls(
            source=source,
            requests=ctx.str_list(obj, "requests", path),
            opaque=OpaqueConfig.parse(ctx, obj, path),
        )


@dataclass(frozen=True, slots=True)
class AllocationResult:
    devices: tuple[DeviceRequestAllocationResult, ...] = ()
    config: tuple[DeviceAllocationConfiguration, ...] = ()
    node_selector: NodeSelector | None = None
    allocation_timestamp: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The v1 JSON (identical in v1beta1 and v1beta2)."""
        devices: dict[str, Any] = {"results": [d.to_json() for d in self.devices]}
        if self.config:
            devices["config"] = [c.to_json() for c in self.config]
        out: dict[str, Any] = {"devices": devices}
        if self.node_selector is not None:
            out["nodeSelector"] = self.node_selector.to_json()
        if self.allocation_timestamp is not None:
            out["allocationTimestamp"] = self.allocation_timestamp
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, what: str = "AllocationResult") -> AllocationResult:
        return cls.parse(Ctx(what=what, api_version="resource.k8s.io/v1"), obj, "")

    @classmethod
    def parse(cls, ctx: Ctx, obj: Mapping[str, Any], path: str) -> AllocationResult:
        p = f"{path}.devices" if path else "devices"
        devices = ctx.get_obj(obj.get("devices"), p)
        selector = obj.get("nodeSelector")
        sp = f"{path}.nodeSelector" if path else "nodeSelector"
        return cls(
            devices=ctx.items(
                devices, "results", p, lambda d, q: DeviceRequestAllocationResult.parse(ctx, d, q)
            ),
            config=ctx.items(
                devices, "config", p, lambda c, q: DeviceAllocationConfiguration.parse(ctx, c, q)
            ),
            node_selector=None
            if selector is None
            else NodeSelector.parse(ctx, ctx.get_obj(selector, sp), sp),
            allocation_timestamp=ctx.get_opt_str(obj, "allocationTimestamp", path),
        )


@dataclass(frozen=True, slots=True)
class ConsumerReference:
    """``status.reservedFor[]``: who uses the claim (normally a Pod)."""

    resource: str
    name: str
    uid: str
    api_group: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"resource": self.resource, "name": self.name, "uid": self.uid}
        if self.api_group:
            out["apiGroup"] = self.api_group
        return out

    @classmethod
    def parse(cls, ctx: Ctx, obj: Mapping[str, Any], path: str) -> ConsumerReference:
        return cls(
            resource=ctx.get_str(obj, "resource", path, required=True),
            name=ctx.get_str(obj, "name", path, required=True),
            uid=ctx.get_str(obj, "uid", path, required=True),
            api_group=ctx.get_str(obj, "apiGroup", path),
        )


@dataclass(frozen=True, slots=True)
class AllocatedDeviceStatus:
    """``status.devices[]``, written by drivers. Conditions, data and networkData are kept as JSON
    text, as the operator only copies them."""

    driver: str
    pool: str
    device: str
    share_id: str | None = None
    conditions_json: str = "[]"
    data_json: str | None = None
    network_data_json: str | None = None

    def to_json(self) -> dict[str, Any]:
        return drop_empty(
            {
                "driver": self.driver,
                "pool": self.pool,
                "device": self.device,
                "shareID": self.share_id,
                "conditions": json.loads(self.conditions_json),
                "data": None if self.data_json is None else json.loads(self.data_json),
                "networkData": None if self.network_data_json is None else json.loads(self.network_data_json),
            }
        )

    @classmethod
    def parse(cls, ctx: Ctx, obj: Mapping[str, Any], path: str) -> AllocatedDeviceStatus:
        conditions = ctx.get_list(obj.get("conditions"), f"{path}.conditions")
        data = obj.get("data")
        network = obj.get("networkData")
        return cls(
            driver=ctx.get_str(obj, "driver", path, required=True),
            pool=ctx.get_str(obj, "pool", path, required=True),
            device=ctx.get_str(obj, "device", path, required=True),
            share_id=ctx.get_opt_str(obj, "shareID", path),
            conditions_json=json.dumps(list(conditions), separators=(",", ":")),
            data_json=None if data is None else parameters_text(ctx, data, f"{path}.data"),
            network_data_json=None
            if network is None
            else parameters_text(ctx, network, f"{path}.networkData"),
        )


@dataclass(frozen=True, slots=True)
class ResourceClaimStatus:
    allocation: AllocationResult | None = None
    reserved_for: tuple[ConsumerReference, ...] = ()
    devices: tuple[AllocatedDeviceStatus, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The status as the operator writes it (``allocation`` omitted when None)."""
        out: dict[str, Any] = {}
        if self.allocation is not None:
            out["allocation"] = self.allocation.to_json()
        if self.reserved_for:
            out["reservedFor"] = [r.to_json() for r in self.reserved_for]
        if self.devices:
            out["devices"] = [d.to_json() for d in self.devices]
        return out

    @classmethod
    def parse(
        cls,
        ctx: Ctx,
        obj: Mapping[str, Any],
        path: str,
        *,
        known_allocation: AllocationResult | None = None,
    ) -> ResourceClaimStatus:
        """With ``known_allocation`` whose JSON is exactly ``allocation``, that object is the
        allocation: parsing the JSON would give an equal one (JSON round trips), and serialising is
        several times cheaper than parsing. Keeping the same object also tells the operator's model
        that the claim holds the same devices as before."""
        allocation = obj.get("allocation")
        if allocation is None:
            parsed = None
        elif known_allocation is not None and allocation == known_allocation.to_json():
            parsed = known_allocation
        else:
            parsed = AllocationResult.parse(
                ctx, ctx.get_obj(allocation, f"{path}.allocation"), f"{path}.allocation"
            )
        return cls(
            allocation=parsed,
            reserved_for=ctx.items(obj, "reservedFor", path, lambda r, p: ConsumerReference.parse(ctx, r, p)),
            devices=ctx.items(obj, "devices", path, lambda d, p: AllocatedDeviceStatus.parse(ctx, d, p)),
        )
