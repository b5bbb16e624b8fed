"""A run's claims checked and prepared for the search: the gates their requests need, their
classes, the 32-device limit, count modes (the devices of an All request listed up front), derived
attributes and constraints. Errors are fatal and worded as upstream's."""

from __future__ import annotations

from collections.abc import Mapping

from dra_api.model import ALL, EXACT_COUNT, DeviceClass, ExactDeviceRequest, ResourceClaim
from dra_operator.allocator.accounting import Accounting
from dra_operator.allocator.candidates import Candidates
from dra_operator.allocator.constraints import Lookup, Value, claim_constraints, lookup_attribute
from dra_operator.allocator.errors import AllocationError
from dra_operator.allocator.gates import FeatureGates
from dra_operator.allocator.pools import DeviceEntry, Pool
from dra_operator.allocator.specs import PreparedClaim, PreparedRequest, Spec
from dra_operator.allocator.state import DeviceID, device_id_text
from dra_operator.cel import CelCompileError, CelRuntimeError, compile_derived

# AllocationResultsMaxSize: devices per claim.
MAX_DEVICES_PER_CLAIM = 32


class Preparation:
    """Prepares one run's claims, in order (each spec gets the next key)."""

    __slots__ = ("_next_key", "accounting", "candidates", "classes", "derived_values", "gates", "pools")

    def __init__(
        self,
        *,
        gates: FeatureGates,
        classes: Mapping[str, DeviceClass],
        pools: tuple[Pool, ...],
        candidates: Candidates,
        accounting: Accounting,
    ) -> None:
        self.gates = gates
        self.classes = classes
        self.pools = pools
        self.candidates = candidates
        self.accounting = accounting
        # DRADerivedAttributes: (device, expression) -> the value derived in this run.
        self.derived_values: dict[tuple[DeviceID, str], Value] = {}
        self._next_key = 0

    def claim(self, *, index: int, claim: ResourceClaim) -> PreparedClaim:
        """The claim (the run's ``index``-th) checked, each request prepared as a spec."""
        ci = index
        ref = claim.ref
        requests: list[PreparedRequest] = []
        # Devices the claim needs at least (a prioritized list counts its smallest alternative),
        # checked request by request, so the error names the request that goes over the limit.
        min_devices = 0
        cc = self.gates.consumable_capacity
        for request in claim.spec.requests:
            if request.first_available:
                if not self.gates.prioritized_list:
                    raise AllocationError(
                        f"claim {ref}, request {request.name}: has subrequests, but the DRAPrioritizedList "
                        "feature is disabled"
                    )
                if not cc:
                    for s in request.first_available:
                        if s.spec.capacity is not None:
                            raise AllocationError(
                                f"claim {ref}, subrequest {s.name}: has capacity requests, but the "
                                "DRAConsumableCapacity feature is disabled"
                            )
                subs = tuple(
                    self._spec(ci, ref, request.name, f"{request.name}/{s.name}", s.spec)
                    for s in request.first_available
                )
                requests.append(PreparedRequest(name=request.name, single=None, subs=subs))
                needed = min(s.num_devices for s in subs)
            else:
                exact = request.exactly
                assert exact is not None  # the model guarantees exactly one of the two
                if not cc and exact.capacity is not None:
                    raise AllocationError(
                        f"claim {ref}, request {request.name}: has capacity requests, but the "
                        "DRAConsumableCapacity feature is disabled"
                    )
                spec = self._spec(ci, ref, request.name, request.name, exact)
                requests.append(PreparedRequest(name=request.name, single=spec, subs=()))
                needed = spec.num_devices
            if needed > MAX_DEVICES_PER_CLAIM - min_devices:
                raise AllocationError(
                    f"claim {ref}, request {request.name}: adding {needed} devices exceeds the claim limit "
                    f"of {MAX_DEVICES_PER_CLAIM}, with {min_devices} already accounted for"
                )
            min_devices += needed
        constraints = claim_constraints(claim, ref=ref, lists=self.gates.list_type_attributes)
        return PreparedClaim(claim=claim, ref=ref, requests=requests, constraints=constraints)

    def _spec(self, ci: int, ref: str, parent: str, full: str, request: ExactDeviceRequest) -> Spec:
        where = f"claim {ref}, request {full}"
        device_class = self._check(where, request)
        self._next_key += 1
        spec = Spec(
            key=self._next_key,
            claim_index=ci,
            parent=parent,
            full=full,
            request=request,
            device_class=device_class,
        )
        if request.derived_attributes and self.gates.derived_attributes:
            spec.derived = {d.name: d.expression for d in request.derived_attributes}
            spec.lookup = self._derived_lookup(spec.derived)
        if spec.mode == EXACT_COUNT:
            spec.num_devices = request.effective_count
        elif spec.mode == ALL:
            self._all_devices(where, spec)
        else:
            raise AllocationError(f"{where}: unsupported count mode {spec.mode}")
        return spec

    def _check(self, where: str, request: ExactDeviceRequest) -> DeviceClass:
        """What a request asks for that the gates or the classes refuse; else its class."""
        if request.derived_attributes and not self.gates.derived_attributes:
            # Refused rather than ignored (what constraints need), as every upstream variant does.
            raise AllocationError(
                f"{where}: cannot handle request with derived attributes, the feature is disabled"
            )
        for i, selector in enumerate(request.selectors):
            if selector.cel is None:
                raise AllocationError(
                    f"{where}, selector #{i}: CEL expression empty (unsupported selector type?)"
                )
        if request.admin_access is not None and not self.gates.admin_access:
            raise AllocationError(f"{where}: admin access is requested, but the feature is disabled")
        if not request.device_class_name:
            raise AllocationError(f"{where}: missing device class name (unsupported request type?)")
        device_class = self.classes.get(request.device_class_name)
        if device_class is None:
            raise AllocationError(
                f"{where}: could not retrieve device class {request.device_class_name}: "
                f'deviceclass.resource.k8s.io "{request.device_class_name}" not found'
            )
        return device_class

    def _all_devices(self, where: str, spec: Spec) -> None:
        """allocationMode All: every device of the node's pools the request may take."""
        cc = self.gates.consumable_capacity
        for pool in self.pools:
            if pool.incomplete:
                raise AllocationError(
                    f"{where}: asks for all devices, but resource pool {pool.text} is currently being updated"
                )
            if pool.invalid:
                raise AllocationError(
                    f"{where}: asks for all devices, but resource pool {pool.text} is currently invalid"
                )
            for se in pool.slices:
                for i, entry in enumerate(se.entries):
                    # Static capacity only: a device whose capacity other claims have used up
                    # stays in the set, so "all" fails rather than quietly taking fewer devices.
                    if self.candidates.is_selectable(spec, se, i) and (
                        not cc or self.accounting.capacity_fits(spec, entry, static=True)
                    ):
                        spec.all_devices.append((pool, se, i))
        spec.num_devices = len(spec.all_devices)

    def _derived_lookup(self, derived: Mapping[str, str]) -> Lookup:
        """A request's view of devices' attributes: its derived ones, evaluated once per device and
        expression in this run (errors are fatal, in upstream's words), else the device's own."""
        values = self.derived_values

        def lookup(entry: DeviceEntry, name: str) -> Value:
            expression = derived.get(name)
            if expression is None:
                return lookup_attribute(entry, name)
            key = (entry.id, expression)
            found = values.get(key)
            if found is None:
                try:
                    compiled = compile_derived(expression)
                except CelCompileError as exc:
                    raise AllocationError(f"compile derived attribute {name} failed: {exc}") from exc
                try:
                    found = values[key] = compiled.value(entry.cel_input)
                except CelRuntimeError as exc:
                    device = device_id_text(entry.id)
                    raise AllocationError(
                        f"evaluate derived attribute {name} on device {device} failed: {exc}"
                    ) from exc
            return found

        return lookup
