"""DeviceClass, ResourceClaim and ResourceClaimTemplate, in v1 / v1beta2 / v1beta1 JSON."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_api.model._json import (
    V1,
    V1BETA1,
    Ctx,
    check_version,
    drop_empty,
    empty_map,
    intern,
    shared_map,
)
from dra_api.model.allocation import AllocationResult, ResourceClaimStatus
from dra_api.model.common import (
    ClaimConfig,
    ClassConfig,
    DeviceSelector,
    DeviceToleration,
    ObjectMeta,
    OpaqueConfig,
)
from dra_api.quantity import Quantity

EXACT_COUNT = "ExactCount"
ALL = "All"

# Request-level fields that v1beta1 has directly on the request and v1/v1beta2 under ``exactly``.
_EXACT_FIELDS = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)


@dataclass(frozen=True, slots=True)
class DeviceClass:
    metadata: ObjectMeta
    selectors: tuple[DeviceSelector, ...] = ()
    config: tuple[ClassConfig, ...] = ()
    extended_resource_name: str | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> DeviceClass:
        ctx = check_version(obj, "DeviceClass")
        spec = ctx.get_obj(obj.get("spec"), "spec")
        return cls(
            metadata=ObjectMeta.parse(ctx, obj),
            selectors=ctx.items(spec, "selectors", "spec", lambda s, p: DeviceSelector.parse(ctx, s, p)),
            config=ctx.items(
                spec, "config", "spec", lambda c, p: ClassConfig(opaque=OpaqueConfig.parse(ctx, c, p))
            ),
            extended_resource_name=ctx.get_opt_str(spec, "extendedResourceName", "spec"),
        )

    def to_json(self, api_version: str = V1) -> dict[str, Any]:
        spec = drop_empty(
            {
                "selectors": [s.to_json() for s in self.selectors],
                "config": [c.to_json() for c in self.config],
                "extendedResourceName": self.extended_resource_name,
            }
        )
        return {
            "apiVersion": api_version,
            "kind": "DeviceClass",
            "metadata": self.metadata.to_json(),
            "spec": spec,
        }


@dataclass(frozen=True, slots=True)
class DerivedAttribute:
    """``derivedAttributes[]`` (DRADerivedAttributes, 1.37): an attribute computed per device by a
    CEL expression, visible to the claim's constraints for this request only."""

    name: str
    expression: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "expression": self.expression}


@dataclass(frozen=True, slots=True)
class ExactDeviceRequest:
    """What to allocate for a request (``exactly``), or for one subrequest of ``firstAvailable``.

    ``allocation_mode`` is kept as written ("" means ExactCount); ``count`` None means unset.
    """

    device_class_name: str
    selectors: tuple[DeviceSelector, ...] = ()
    allocation_mode: str = ""
    count: int | None = None
    admin_access: bool | None = None
    tolerations: tuple[DeviceToleration, ...] = ()
    capacity: Mapping[str, Quantity] | None = None
    derived_attributes: tuple[DerivedAttribute, ...] = ()

    @property
    def mode(self) -> str:
        return self.allocation_mode or EXACT_COUNT

    @property
    def effective_count(self) -> int:
        return 1 if self.count is None else self.count

    def fields_json(self) -> dict[str, Any]:
        return drop_empty(
            {
                "deviceClassName": self.device_class_name or None,
                "selectors": [s.to_json() for s in self.selectors],
                "allocationMode": self.allocation_mode or None,
                "count": self.count,
                "adminAccess": self.admin_access,
                "tolerations": [t.to_json() for t in self.tolerations],
                "derivedAttributes": [d.to_json() for d in self.derived_attributes],
            }
        ) | (
            {}
            if self.capacity is None
            else {"capacity": {"requests": {k: str(v) for k, v in self.capacity.items()}}}
        )


@dataclass(frozen=True, slots=True)
class DeviceSubRequest:
    """A ``firstAvailable`` alternative; ``spec.admin_access`` is always None."""

    name: str
    spec: ExactDeviceRequest

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **self.spec.fields_json()}


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """Exactly one of ``exactly`` and ``first_available`` is set."""

    name: str
    exactly: ExactDeviceRequest | None = None
    first_available: tuple[DeviceSubRequest, ...] = ()

    def to_json(self, api_version: str = V1) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.exactly is not None:
            if api_version == V1BETA1:
                out.update(self.exactly.fields_json())
            else:
                out["exactly"] = self.exactly.fields_json()
        if self.first_available:
            out["firstAvailable"] = [s.to_json() for s in self.first_available]
        return out


@dataclass(frozen=True, slots=True)
class DeviceConstraint:
    """``matchAttribute`` or ``distinctAttribute`` (neither set = a type this code does not know)."""

    requests: tuple[str, ...] = ()
    match_attribute: str | None = None
    distinct_attribute: str | None = None

    def to_json(self) -> dict[str, Any]:
        return drop_empty(
            {
                "requests": list(self.requests),
                "matchAttribute": self.match_attribute,
                "distinctAttribute": self.distinct_attribute,
            }
        )


@dataclass(frozen=True, slots=True)
class ResourceClaimSpec:
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[DeviceConstraint, ...] = ()
    config: tuple[ClaimConfig, ...] = ()

    def to_json(self, api_version: str = V1) -> dict[str, Any]:
        devices = drop_empty(
            {
                "requests": [r.to_json(api_version) for r in self.requests],
                "constraints": [c.to_json() for c in self.constraints],
                "config": [c.to_json() for c in self.config],
            }
        )
        return {"devices": devices} if devices else {}

    @classmethod
    def parse(cls, ctx: Ctx, obj: Mapping[str, Any], path: str) -> ResourceClaimSpec:
        dp = f"{path}.devices"
        devices = ctx.get_obj(obj.get("devices"), dp)
        return cls(
            requests=ctx.items(devices, "requests", dp, lambda r, p: _parse_request(ctx, r, p)),
            constraints=ctx.items(
                devices,
                "constraints",
                dp,
                lambda c, p: DeviceConstraint(
                    requests=ctx.str_list(c, "requests", p),
                    match_attribute=ctx.get_opt_str(c, "matchAttribute", p),
                    distinct_attribute=ctx.get_opt_str(c, "distinctAttribute", p),
                ),
            ),
            config=ctx.items(
                devices,
                "config",
                dp,
                lambda c, p: ClaimConfig(
                    requests=ctx.str_list(c, "requests", p), opaque=OpaqueConfig.parse(ctx, c, p)
                ),
            ),
        )


def _parse_exact(ctx: Ctx, obj: Mapping[str, Any], path: str, *, sub: bool) -> ExactDeviceRequest:
    capacity: dict[str, Quantity] | None = None
    raw_capacity = obj.get("capacity")
    if raw_capacity is not None:
        cp = f"{path}.capacity"
        requests = ctx.get_obj(ctx.get_obj(raw_capacity, cp).get("requests"), f"{cp}.requests")
        capacity = {intern(k): ctx.quantity(v, f"{cp}.requests[{k}]") for k, v in requests.items()}
    count = ctx.get_opt_int(obj, "count", path)
    if (
        count is not None
        and count <= 0
        and (ctx.get_str(obj, "allocationMode", path) or EXACT_COUNT) == EXACT_COUNT
    ):
        ctx.fail(f"{path}.count", f"must be greater than zero, not {count}")
    if sub and "adminAccess" in obj:
        ctx.fail(f"{path}.adminAccess", "is not supported in a subrequest")
    return ExactDeviceRequest(
        device_class_name=ctx.get_str(obj, "deviceClassName", path),
        selectors=ctx.items(obj, "selectors", path, lambda s, p: DeviceSelector.parse(ctx, s, p)),
        allocation_mode=ctx.get_str(obj, "allocationMode", path),
        count=count,
        admin_access=None if sub else ctx.get_opt_bool(obj, "adminAccess", path),
        tolerations=ctx.items(obj, "tolerations", path, lambda t, p: DeviceToleration.parse(ctx, t, p)),
        capacity=None if capacity is None else shared_map(capacity),
        derived_attributes=ctx.items(
            obj,
            "derivedAttributes",
            path,
            lambda d, p: DerivedAttribute(
                name=ctx.get_str(d, "name", p, required=True),
                expression=ctx.get_str(d, "expression", p, required=True),
            ),
        ),
    )


def _parse_request(ctx: Ctx, obj: Mapping[str, Any], path: str) -> DeviceRequest:
    name = ctx.get_str(obj, "name", path, required=True)
    subs = ctx.items(
        obj,
        "firstAvailable",
        path,
        lambda s, p: DeviceSubRequest(
            name=ctx.get_str(s, "name", p, required=True), spec=_parse_exact(ctx, s, p, sub=True)
        ),
    )
    if ctx.beta1:
        if "exactly" in obj:
            ctx.fail_raw(
                f"{path}.exactly is a resource.k8s.io/v1 field; in {ctx.api_version} the request fields"
                " are directly on the request",
            )
        if subs:
            for key in _EXACT_FIELDS:
                if obj.get(key) is not None:
                    ctx.fail(f"{path}.{key}", "must not be set together with firstAvailable")
            return DeviceRequest(name=name, first_available=subs)
        if not obj.get("deviceClassName"):
            ctx.fail(f"{path}.deviceClassName", "is required unless firstAvailable is set")
        return DeviceRequest(name=name, exactly=_parse_exact(ctx, obj, path, sub=False))
    for key in _EXACT_FIELDS:
        if key in obj:
            ctx.fail_raw(f"{path}.{key} is a v1beta1 field; in {ctx.api_version} it belongs under exactly")
    raw_exact = obj.get("exactly")
    if raw_exact is not None and subs:
        ctx.fail(path, "must set exactly one of exactly or firstAvailable, not both")
    if raw_exact is None and not subs:
        ctx.fail(path, "must set exactly one of exactly or firstAvailable")
    if raw_exact is None:
        return DeviceRequest(name=name, first_available=subs)
    ep = f"{path}.exactly"
    exact = ctx.get_obj(raw_exact, ep)
    if not exact.get("deviceClassName"):
        ctx.fail(f"{ep}.deviceClassName", "is required")
    return DeviceRequest(name=name, exactly=_parse_exact(ctx, exact, ep, sub=False))


# Parsed claim specs by the repr of their JSON: claims made from one template, or one claim seen
# again (its creation, the reply to the operator's write, later updates), have the same spec, and
# parsing it is most of the work of parsing a claim. The spec is immutable and parsing is a pure
# function of the JSON and the API version, so a cached spec cannot go out of date. The repr tells
# apart what parsing tells apart (1, 1.0, True and "1"; str and int keys), and costs a fifth of
# json.dumps. Only specs that parse are kept (errors name the claim).
_SPEC_CACHE_LIMIT = 4096
_specs: dict[tuple[str, str], ResourceClaimSpec] = {}


def _claim_spec(ctx: Ctx, raw: Mapping[str, Any]) -> ResourceClaimSpec:
    if type(raw) is not dict:  # not decoded JSON (an empty spec, a test's mapping): just parse
        return ResourceClaimSpec.parse(ctx, raw, "spec")
    key = (ctx.api_version, repr(raw))
    spec = _specs.get(key)
    if spec is None:
        spec = ResourceClaimSpec.parse(ctx, raw, "spec")
        if len(_specs) >= _SPEC_CACHE_LIMIT:
            _specs.clear()
        _specs[key] = spec
    return spec


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    metadata: ObjectMeta
    spec: ResourceClaimSpec
    status: ResourceClaimStatus = field(default_factory=ResourceClaimStatus)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def ref(self) -> str:
        return self.metadata.ref

    @classmethod
    def from_json(
        cls, obj: Mapping[str, Any], *, known_allocation: AllocationResult | None = None
    ) -> ResourceClaim:
        """``known_allocation``: an allocation this claim probably has (the one just written, or
        the one it had): when ``status.allocation`` is exactly its JSON, that object is taken
        instead of parsing the same again (see :meth:`ResourceClaimStatus.parse`)."""
        ctx = check_version(obj, "ResourceClaim")
        return cls(
            metadata=ObjectMeta.parse(ctx, obj),
            spec=_claim_spec(ctx, ctx.get_obj(obj.get("spec"), "spec")),
            status=ResourceClaimStatus.parse(
                ctx, ctx.get_obj(obj.get("status"), "status"), "status", known_allocation=known_allocation
            ),
        )

    def to_json(self, api_version: str = V1) -> dict[str, Any]:
        out: dict[str, Any] = {
            "apiVersion": api_version,
            "kind": "ResourceClaim",
            "metadata": self.metadata.to_json(),
            "spec": self.spec.to_json(api_version),
        }
        status = self.status.to_json()
        if status:
            out["status"] = status
        return out


@dataclass(frozen=True, slots=True)
class ResourceClaimTemplate:
    """``spec.metadata`` (labels and annotations copied to generated claims) and ``spec.spec``."""

    metadata: ObjectMeta
    spec: ResourceClaimSpec
    claim_labels: Mapping[str, str] = field(default_factory=empty_map)
    claim_annotations: Mapping[str, str] = field(default_factory=empty_map)

    @property
    def name(self) -> str:
        return self.metadata.name

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ResourceClaimTemplate:
        ctx = check_version(obj, "ResourceClaimTemplate")
        outer = ctx.get_obj(obj.get("spec"), "spec")
        meta = ctx.get_obj(outer.get("metadata"), "spec.metadata")
        return cls(
            metadata=ObjectMeta.parse(ctx, obj),
            spec=ResourceClaimSpec.parse(ctx, ctx.get_obj(outer.get("spec"), "spec.spec"), "spec.spec"),
            claim_labels=ctx.str_map(meta, "labels", "spec.metadata"),
            claim_annotations=ctx.str_map(meta, "annotations", "spec.metadata"),
        )

    def to_json(self, api_version: str = V1) -> dict[str, Any]:
        inner_meta = drop_empty(
            {"labels": dict(self.claim_labels), "annotations": dict(self.claim_annotations)}
        )
        spec: dict[str, Any] = {"spec": self.spec.to_json(api_version)}
        if inner_meta:
            spec["metadata"] = inner_meta
        return {
            "apiVersion": api_version,
            "kind": "ResourceClaimTemplate",
            "metadata": self.metadata.to_json(),
            "spec": spec,
        }
