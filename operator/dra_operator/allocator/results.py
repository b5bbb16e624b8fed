"""A claim's ``AllocationResult`` from the devices the search picked: one result per device, the
class's and the claim's configuration for the requests that were chosen, and the node selector."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType

from dra_api.model import (
    FROM_CLAIM,
    FROM_CLASS,
    AllocationResult,
    DeviceAllocationConfiguration,
    DeviceClass,
    DeviceRequestAllocationResult,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceClaim,
)
from dra_operator.allocator.errors import AllocationError
from dra_operator.allocator.gates import FeatureGates
from dra_operator.allocator.specs import Pick, Spec


def allocation_result(
    *,
    claim: ResourceClaim,
    picks: Sequence[Pick],
    selected: Sequence[Spec | None],
    classes: Mapping[str, DeviceClass],
    gates: FeatureGates,
    node_name: str,
) -> AllocationResult:
    """``picks`` in the order placed; ``selected``: per request, the spec the search chose."""
    binding = gates.device_binding_and_status
    devices = []
    for pick in picks:
        device = pick.entry.device
        driver, pool, name = pick.entry.id
        devices.append(
            DeviceRequestAllocationResult(
                request=pick.spec.full,
                driver=driver,
                pool=pool,
                device=name,
                admin_access=True if pick.spec.admin else None,
                tolerations=pick.spec.tolerations,
                binding_conditions=device.binding_conditions if binding else (),
                binding_failure_conditions=device.binding_failure_conditions if binding else (),
                share_id=pick.share_id,
                consumed_capacity=MappingProxyType(pick.consumed) if pick.consumed else MappingProxyType({}),
                skip_node_operations=pick.entry.slice.skip_node_operations
                if gates.optional_node_operations
                else (),
            )
        )
    return AllocationResult(
        devices=tuple(devices),
        config=_config(claim=claim, selected=[s for s in selected if s is not None], classes=classes),
        node_selector=_node_selector(picks, binding=binding, node_name=node_name),
    )


def _config(
    *, claim: ResourceClaim, selected: list[Spec], classes: Mapping[str, DeviceClass]
) -> tuple[DeviceAllocationConfiguration, ...]:
    by_class: dict[str, list[str]] = {}
    for spec in selected:
        by_class.setdefault(spec.device_class.name, []).append(spec.full)
    config: list[DeviceAllocationConfiguration] = []
    for class_name, names in by_class.items():
        for class_entry in classes[class_name].config:
            if class_entry.opaque is None:
                continue  # a configuration type this code does not know: nothing to pass on
            config.append(
                DeviceAllocationConfiguration(
                    source=FROM_CLASS, requests=tuple(names), opaque=class_entry.opaque
                )
            )
    known = {s.parent for s in selected} | {s.full for s in selected}
    for claim_entry in claim.spec.config:
        if claim_entry.opaque is None:
            continue
        if not claim_entry.requests or any(r in known for r in claim_entry.requests):
            config.append(
                DeviceAllocationConfiguration(
                    source=FROM_CLAIM, requests=claim_entry.requests, opaque=claim_entry.opaque
                )
            )
    out: list[DeviceAllocationConfiguration] = []
    for item in config:
        if item.requests and all(s.parent in item.requests or s.full in item.requests for s in selected):
            item = replace(item, requests=())
        out.append(item)
    return tuple(out)


def _node_selector(picks: Sequence[Pick], *, binding: bool, node_name: str) -> NodeSelector | None:
    fields: list[NodeSelectorRequirement] = []
    expressions: list[NodeSelectorRequirement] = []
    for pick in picks:
        s = pick.entry.slice
        d = pick.entry.device
        per_device = s.per_device_node_selection
        if s.node_name or (per_device and d.node_name) or (binding and d.binds_to_node):
            return _node_selector_for(node_name)
        selector = (
            s.node_selector if s.node_selector is not None else (d.node_selector if per_device else None)
        )
        if selector is None:
            continue
        if len(selector.terms) != 1:
            raise AllocationError(f"unsupported ResourceSlice.NodeSelector with {len(selector.terms)} terms")
        term = selector.terms[0]
        _merge(fields, term.match_fields)
        _merge(expressions, term.match_expressions)
    if not fields and not expressions:
        return None
    return NodeSelector(
        terms=(NodeSelectorTerm(match_expressions=tuple(expressions), match_fields=tuple(fields)),)
    )


@functools.lru_cache(maxsize=4096)
def _node_selector_for(node_name: str) -> NodeSelector:
    return NodeSelector.for_node(node_name)


def _merge(into: list[NodeSelectorRequirement], requirements: Iterable[NodeSelectorRequirement]) -> None:
    for r in requirements:
        if not any(
            x.key == r.key and x.operator == r.operator and set(x.values) == set(r.values) for x in into
        ):
            into.append(r)
