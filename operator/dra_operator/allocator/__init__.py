"""The structured DRA allocator (upstream "incubating" semantics), for one node at a time.

Public API::

    gates = FeatureGates()                       # Kubernetes 1.36 defaults
    gates = FeatureGates.from_mapping({"DRAConsumableCapacity": False})
    gates = FeatureGates.only(["DRAPrioritizedList"])   # everything else off
    index = SliceIndex(slices)                   # build once per slice set; reuse across allocators
    index = SliceIndex(new_slices, previous=index)   # unchanged devices keep their CEL results
    state = AllocatedState.from_claims(allocated_claims)
    alloc = Allocator(classes=classes, slices=index, allocated=state, gates=gates)
    results = alloc.allocate(node=node, claims=[claim, ...])
    # -> list[AllocationResult] (one per claim, in order), or None when they do not fit on node.
    # raises AllocationError (fatal: bad input, CEL error, disabled feature, > 32 devices, ...)
    #     or FailedAllocationOnNode (node-local: nothing fits and the node has invalid pools)
    #     or AllocationTimeout (allocate(..., timeout=seconds) ran out of time)
    #     or cel.BudgetExhausted (allocate(..., budget=WorkBudget(...)) ran out, CEL included).
    alloc.last_invocations                      # search effort (upstream allocateOne calls)
    alloc.last_shortfall                        # why the feasibility check refused (search skipped)
    alloc.note_allocated(results[0])            # keep using alloc; do not mutate alloc.allocated directly

Semantics follow upstream ``k8s.io/dynamic-resource-allocation/structured`` of Kubernetes 1.37.2
(incubating variant, plus the experimental variant's handling of the gates modelled here):
pools gathered per node (generations, completeness across the cluster, invalid pools), sorted by
(driver, pool) with binding-condition pools last and slices by name; ExactCount and All;
adminAccess; matchAttribute/distinctAttribute (set semantics with DRAListTypeAttributes);
firstAvailable; partitionable devices (shared counters, compatibility groups); consumable capacity
with share IDs (stepped ranges in whole units, or milli-units with DRAFractionalCapacityRange); taints and
tolerations; binding conditions; optional node operations (``Node.declared_features``);
class-then-claim config; the result node selector; the 32-device claim limit, request by request;
a depth-first, combination-only search, after a polynomial feasibility check that upstream does
not have (``feasibility.py``: it refuses what cannot fit without searching); derived attributes
(DRADerivedAttributes: a request's CEL per device, shadowing device attributes in its constraints;
with the gate off such a request is refused, as upstream).

Hooks for placement and explanations: :meth:`Allocator.pools` (the node's pools in search order),
:attr:`SliceIndex.on_node` / ``shared`` / ``by_pool`` and :meth:`SliceIndex.all_entries`,
:class:`DeviceEntry` (``cel_input`` built once; class-selector results cached on it, see
:func:`class_matches`), :meth:`Allocator.funnel` (per-request device counts through each check),
``Allocator.last_constraint_rejections`` and ``last_invocations``, and
:meth:`Allocator.note_allocated` / ``note_released`` to keep one allocator across many claims.
"""

from __future__ import annotations

from dra_operator.allocator.allocator import Allocator
from dra_operator.allocator.candidates import class_matches, evaluate_selector
from dra_operator.allocator.constraints import constraint_text
from dra_operator.allocator.errors import (
    AllocationError,
    AllocationTimeout,
    FailedAllocationOnNode,
    SelectorFailed,
)
from dra_operator.allocator.feasibility import Shortfall
from dra_operator.allocator.funnel import MatchValues, RequestFunnel
from dra_operator.allocator.gates import GATE_FIELDS, FeatureGates, KubernetesGates
from dra_operator.allocator.pools import DeviceEntry, Pool, PoolID, SliceEntry, SliceIndex
from dra_operator.allocator.preparation import MAX_DEVICES_PER_CLAIM
from dra_operator.allocator.state import (
    AllocatedState,
    DeviceID,
    SharedDeviceID,
    device_id_text,
    parse_device_id,
)

__all__ = [
    "GATE_FIELDS",
    "MAX_DEVICES_PER_CLAIM",
    "AllocatedState",
    "AllocationError",
    "AllocationTimeout",
    "Allocator",
    "DeviceEntry",
    "DeviceID",
    "FailedAllocationOnNode",
    "FeatureGates",
    "KubernetesGates",
    "MatchValues",
    "Pool",
    "PoolID",
    "RequestFunnel",
    "SelectorFailed",
    "SharedDeviceID",
    "Shortfall",
    "SliceEntry",
    "SliceIndex",
    "class_matches",
    "constraint_text",
    "device_id_text",
    "evaluate_selector",
    "parse_device_id",
]
