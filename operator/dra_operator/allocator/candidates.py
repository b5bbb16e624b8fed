"""Which of the node's devices a request may take, before counting what others hold: the class's
and the request's selectors (cached on the device and per run), binding conditions, per-device
node selection, skipped node operations and taints."""

from __future__ import annotations

from collections.abc import Sequence

from dra_api.model import DeviceClass, DeviceTaint, DeviceToleration, Node, ResourceClaim
from dra_operator.allocator.errors import AllocationError, SelectorFailed
from dra_operator.allocator.gates import FeatureGates
from dra_operator.allocator.pools import DeviceEntry, SliceEntry
from dra_operator.allocator.specs import Spec
from dra_operator.allocator.state import DeviceID, device_id_text
from dra_operator.cel import CelCompileError, CelRuntimeError, compile_selector

# The node feature (status.declaredFeatures) that devices of slices with skipNodeOperations need.
OPTIONAL_NODE_OPERATIONS = "DRAOptionalNodeOperations"


def evaluate_selector(
    *, prefix: str, index: int, expression: str | None, entry: DeviceEntry, class_name: str | None = None
) -> bool:
    """Evaluate one selector on a device; errors are fatal, worded as upstream's (those on the
    device are :class:`SelectorFailed`, naming ``class_name`` for a class's selector)."""
    if expression is None:
        raise AllocationError(
            f"{prefix}: selector #{index}: CEL expression empty (unsupported selector type?)"
        )
    try:
        compiled = compile_selector(expression)
    except CelCompileError as exc:
        raise AllocationError(f"{prefix}: selector #{index}: CEL compile error: {exc}") from exc
    where = f"{prefix}: selector #{index} on device {device_id_text(entry.id)}: CEL runtime error"
    if entry.unsupported_attribute is not None:
        detail = f"CEL runtime error: attribute {entry.unsupported_attribute}: unsupported attribute value"
        raise SelectorFailed(
            f"{where}: {detail[len('CEL runtime error: ') :]}",
            class_name=class_name,
            index=index,
            detail=detail,
        )
    try:
        return bool(compiled.matches(entry.cel_input))
    except CelRuntimeError as exc:
        raise SelectorFailed(
            f"{where}: {exc}", class_name=class_name, index=index, detail=f"CEL runtime error: {exc}"
        ) from exc


def class_matches(device_class: DeviceClass, entry: DeviceEntry) -> bool:
    """Whether the device satisfies all of the class's selectors; cached on the entry (a hook for
    placement: count matching devices per node without running the allocator everywhere)."""
    cache = entry.class_matches
    found = cache.get(device_class.selectors) if cache is not None else None
    if found is None:
        found = True
        for i, selector in enumerate(device_class.selectors):
            if not evaluate_selector(
                prefix=f"class {device_class.name}",
                index=i,
                expression=selector.cel,
                entry=entry,
                class_name=device_class.name,
            ):
                found = False
                break
        entry.remember(device_class.selectors, found)
    return found


def tolerated(taints: tuple[DeviceTaint, ...], tolerations: tuple[DeviceToleration, ...]) -> bool:
    for taint in taints:
        if taint.blocks_scheduling and not any(t.tolerates(taint) for t in tolerations):
            return False
    return True


class Candidates:
    """One run's answers to "may this spec take this device?", selectors first (cached per run)."""

    __slots__ = ("_claims", "gates", "node_operations", "selectable")

    def __init__(self, *, gates: FeatureGates, node: Node, claims: Sequence[ResourceClaim]) -> None:
        self.gates = gates
        self._claims = claims
        # With the gate on, devices of slices with skipNodeOperations are allocatable only on a node
        # that declares the feature (upstream's experimental variant). With it off, the field is
        # ignored, as kube-scheduler's default (incubating) variant does: the operator allocates as
        # the scheduler beside it would.
        self.node_operations = (
            not gates.optional_node_operations or OPTIONAL_NODE_OPERATIONS in node.declared_features
        )
        self.selectable: dict[tuple[DeviceID, int], bool] = {}

    def is_selectable(self, spec: Spec, se: SliceEntry, index: int) -> bool:
        """The class's selectors, the request's, binding conditions and per-device node selection."""
        entry = se.entries[index]
        if entry.device.binding_conditions and not self.gates.device_binding_and_status:
            return False
        key = (entry.id, spec.key)
        found = self.selectable.get(key)
        if found is not None:
            return found
        found = class_matches(spec.device_class, entry)
        selectors = spec.request.selectors
        if found and selectors:
            # Cached on the device beside its classes' results (a pure function of the device and
            # the selectors): a claim placed on node after node, or again later, evaluates once.
            cache = entry.class_matches
            cached = cache.get(selectors) if cache is not None else None
            if cached is None:
                prefix = f"claim {self._claims[spec.claim_index].ref}"
                cached = all(
                    evaluate_selector(prefix=prefix, index=i, expression=selector.cel, entry=entry)
                    for i, selector in enumerate(selectors)
                )
                entry.remember(selectors, cached)
            found = cached
        if found and se.node_ok is not None:
            found = se.node_ok[index]
        self.selectable[key] = found
        return found

    def admits(self, spec: Spec, entry: DeviceEntry) -> bool:
        """The checks after the selectors that need no accounting: skipped node operations, counters
        while partitionable devices are off, and taints the request does not tolerate."""
        device = entry.device
        if entry.slice.skip_node_operations and not self.node_operations:
            return False
        gates = self.gates
        if device.consumes_counters and not gates.partitionable_devices:
            return False
        return not (gates.device_taints and device.taints and not tolerated(device.taints, spec.tolerations))
