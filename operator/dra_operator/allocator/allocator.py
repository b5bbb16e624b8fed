"""The structured allocator: one node, a list of claims, first solution wins (incubating variant).

:class:`Allocator` keeps what runs share (the slice index, what other claims hold, per-pool usage);
each ``allocate`` call is one :class:`_Run`, a depth-first search over the claims' prepared requests
(``preparation.py``) that asks, for every device it tries, the run's candidates
(``candidates.py``), its accounting of counters and capacity (``accounting.py``) and the claim's
constraints (``constraints.py``), and builds the results (``results.py``) from what it picked. The
feasibility check before the search reads the run through ``needs.py``, explanations through
``funnel.py``.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

from dra_api.model import ALL, AllocationResult, DeviceClass, Node, ResourceClaim, ResourceSlice
from dra_api.quantity import Quantity
from dra_operator.allocator.accounting import Accounting, PoolUsage
from dra_operator.allocator.candidates import Candidates, tolerated
from dra_operator.allocator.constraints import Constraint
from dra_operator.allocator.errors import AllocationError, AllocationTimeout, FailedAllocationOnNode
from dra_operator.allocator.feasibility import Shortfall
from dra_operator.allocator.funnel import RequestFunnel, request_funnel
from dra_operator.allocator.gates import FeatureGates
from dra_operator.allocator.needs import Needs
from dra_operator.allocator.pools import DeviceEntry, Pool, SliceIndex
from dra_operator.allocator.preparation import MAX_DEVICES_PER_CLAIM, Preparation
from dra_operator.allocator.results import allocation_result
from dra_operator.allocator.specs import Pick, PreparedClaim, PreparedRequest, Spec, all_specs
from dra_operator.allocator.state import AllocatedState, DeviceID, device_id_text
from dra_operator.cel import BudgetExhausted, WorkBudget, charged_to

logger = logging.getLogger(__name__)


class _MaxSizeExceeded(Exception):
    """Internal: this branch would put more than 32 devices into one claim."""


class _Infeasible(Exception):
    """Internal: the feasibility check, run once the search outgrew its easy start, refused."""


class Allocator:
    """Allocates claims on one node at a time, like upstream ``Allocator.Allocate``.

    Build it once per allocated state (cheap when ``slices`` is a prebuilt :class:`SliceIndex`) and
    call :meth:`allocate` for as many nodes as needed; class-selector results and available
    counters are cached across calls.
    """

    def __init__(
        self,
        *,
        classes: Mapping[str, DeviceClass] | Iterable[DeviceClass],
        slices: SliceIndex | Iterable[ResourceSlice],
        allocated: AllocatedState | None = None,
        gates: FeatureGates | None = None,
        feasibility: bool = True,
    ) -> None:
        self.gates = gates or FeatureGates()
        # The polynomial check before the search (feasibility.py); off only to measure the search
        # as upstream runs it.
        self.feasibility = feasibility
        self.classes: Mapping[str, DeviceClass] = (
            classes if isinstance(classes, Mapping) else {c.name: c for c in classes}
        )
        self.index = slices if isinstance(slices, SliceIndex) else SliceIndex(slices)
        self.allocated = allocated or AllocatedState()
        # What other claims hold, and what that leaves of each pool's counters.
        self.usage = PoolUsage(self.allocated.in_use_ids())
        #: ``allocateOne`` invocations of the last :meth:`allocate` call (search effort).
        self.last_invocations = 0
        #: (claim ref, constraint index) -> devices that constraint turned away in the last call.
        self.last_constraint_rejections: dict[tuple[str, int], int] = {}
        #: Why the last call's claims cannot fit, found before any search (feasibility.py).
        self.last_shortfall: Shortfall | None = None

    def note_allocated(self, allocation: AllocationResult) -> None:
        """Record an allocation made with this allocator's results (keeps its caches coherent)."""
        self.allocated.add_allocation(allocation)
        for result in allocation.devices:
            if not result.admin_access:
                self.usage.in_use.add(result.device_id)
        self.usage.changed()

    def note_released(self, allocation: AllocationResult) -> None:
        """Forget an allocation (the claim was deallocated)."""
        self.allocated.remove_allocation(allocation)
        self.usage.changed(self.allocated.in_use_ids())

    def pools(self, node: Node) -> tuple[Pool, ...]:
        """The node's pools in search order (hook for explanations and placement)."""
        return self.index.pools_for(
            node,
            partitionable=self.gates.partitionable_devices,
            compatibility_groups=self.gates.compatibility_groups,
        )

    def allocate(
        self,
        *,
        node: Node,
        claims: Sequence[ResourceClaim],
        timeout: float | None = None,
        budget: WorkBudget | None = None,
    ) -> list[AllocationResult] | None:
        """One result per claim (in order; no claims: no results), None if the claims do not fit on
        ``node`` together (:attr:`last_shortfall` says why when the feasibility check, not the search,
        found it).

        Raises :class:`AllocationError` for errors (unknown class, CEL errors, disabled features,
        too many devices, ...), :class:`FailedAllocationOnNode` when nothing fits and the node has
        invalid pools, :class:`~dra_operator.cel.BudgetExhausted` when ``budget`` runs out first
        (CEL evaluation included), and :class:`AllocationTimeout` when ``timeout`` seconds pass
        first (upstream's per-node limit, in upstream's words).
        """
        run = _Run(self, node, claims)
        if timeout is not None and budget is None:
            run.budget = WorkBudget(timeout)
        elif budget is not None:
            run.budget = budget
        self.last_shortfall = None
        try:
            with charged_to(run.budget):
                return run.run()
        except BudgetExhausted:
            if budget is None:
                raise AllocationTimeout(
                    f"filter operation aborted: allocation on node {node.name} took longer than the timeout"
                ) from None
            raise
        finally:
            self.last_invocations = run.invocations
            self.last_shortfall = run.shortfall
            self.last_constraint_rejections = {
                (c.ref, k.index): k.rejections for c in run.claims for k in c.constraints if k.rejections
            }

    def funnel(self, *, node: Node, claims: Sequence[ResourceClaim]) -> list[RequestFunnel]:
        """Per request and subrequest, how many devices of ``node`` survive each check (for
        explaining why claims do not fit). Raises the same errors as :meth:`allocate`."""
        run = _Run(self, node, claims)
        if not claims:
            return []
        run.prepare()
        return run.funnels()

    def shortfall(self, *, node: Node, claims: Sequence[ResourceClaim]) -> Shortfall | None:
        """What the feasibility check finds missing for ``claims`` on ``node``, without a search
        (for explanations: the search may have given up before the check ran). None when the check
        is off or finds nothing. Raises the same errors as :meth:`allocate`'s preparation."""
        if not self.feasibility or not claims:
            return None
        run = _Run(self, node, claims)
        run.prepare()
        return run.check()


class _Run:
    """One ``allocate`` call: a depth-first search over the prepared claims, which asks the run's
    candidates, accounting and the claims' constraints about every device it tries."""

    def __init__(self, alloc: Allocator, node: Node, claims: Sequence[ResourceClaim]) -> None:
        self.alloc = alloc
        self.gates = gates = alloc.gates
        self.node = node
        self.input_claims = claims
        self.cc = gates.consumable_capacity
        self.invocations = 0
        self.budget: WorkBudget | None = None
        self.shortfall: Shortfall | None = None
        self.check_at = -1  # the search step at which the feasibility check runs (-1: never)
        self.pools: tuple[Pool, ...] = ()
        self.claims: list[PreparedClaim] = []
        self.results: list[list[Pick]] = []  # per claim, the devices picked so far, in order
        self.selected: list[list[Spec | None]] = []  # per claim and request, the spec chosen
        # Devices picked so far, other than further shares of multi-allocatable ones: the claims
        # (by index) they were picked for.
        self.allocating: dict[DeviceID, list[int]] = {}
        self.candidates = Candidates(gates=gates, node=node, claims=claims)
        self.accounting = Accounting(usage=alloc.usage, allocated=alloc.allocated, gates=gates, claims=claims)
        # Bound once: the search asks them about every device it tries.
        self.is_selectable = self.candidates.is_selectable
        self.capacity_fits = self.accounting.capacity_fits

    # ---- entry points --------------------------------------------------------------------------

    def prepare(self) -> None:
        """Validate the claims and compute request data (the part of ``run`` before the search)."""
        self.pools = self.alloc.pools(self.node)
        preparation = Preparation(
            gates=self.gates,
            classes=self.alloc.classes,
            pools=self.pools,
            candidates=self.candidates,
            accounting=self.accounting,
        )
        for ci, claim in enumerate(self.input_claims):
            self.claims.append(preparation.claim(index=ci, claim=claim))
        self.results = [[] for _ in self.claims]
        self.selected = [[None] * len(c.requests) for c in self.claims]

    def run(self) -> list[AllocationResult] | None:
        if not self.input_claims:
            return []  # as upstream: nothing to allocate is a (trivial) success
        self.prepare()
        # One Python frame per device slot and request: make room for claims with many devices.
        depth = sum(MAX_DEVICES_PER_CLAIM + 2 * len(c.requests) + 2 for c in self.claims) + 200
        if depth > sys.getrecursionlimit():
            sys.setrecursionlimit(depth)
        # Claims of several requests, or with constraints, are checked before the search: that is
        # where requests compete for devices. Otherwise the check costs more than an easy search, so
        # it runs once the search has taken more steps than placing every device straight away
        # would (a search that will succeed mostly does).
        needed = sum(s.num_devices for s in all_specs(self.claims))
        competing = sum(len(c.requests) for c in self.claims) > 1 or any(c.constraints for c in self.claims)
        self.check_at = -1 if not self.alloc.feasibility else 1 if competing else 2 * needed + 8
        try:
            done = self._one(0, 0, 0, 0, False, None)
        except (_MaxSizeExceeded, _Infeasible):
            done = False
        if not done:
            invalid = [p for p in self.pools if p.invalid]
            if invalid:
                logger.debug(
                    "invalid pools on node %s: %s", self.node.name, [p.invalid_reason for p in invalid]
                )
                # Upstream's words first (callers match on them), then which pools and why.
                named = tuple(f"{p.text} ({p.invalid_reason})" for p in invalid)
                raise FailedAllocationOnNode(
                    f"invalid resource pools were encountered: {'; '.join(named)}", invalid_pools=named
                )
            return None
        return [
            allocation_result(
                claim=c.claim,
                picks=self.results[ci],
                selected=self.selected[ci],
                classes=self.alloc.classes,
                gates=self.gates,
                node_name=self.node.name,
            )
            for ci, c in enumerate(self.claims)
        ]

    def funnels(self) -> list[RequestFunnel]:
        """Per request and subrequest of the prepared claims, the node's devices through each check."""
        return [
            request_funnel(
                spec=spec,
                claim=self.claims[spec.claim_index],
                pools=self.pools,
                candidates=self.candidates,
                accounting=self.accounting,
            )
            for spec in all_specs(self.claims)
        ]

    def check(self) -> Shortfall | None:
        """What the feasibility check (feasibility.py) finds missing before any search; None when
        the claims may fit, or when there is nothing to combine (one device at most)."""
        needs = Needs(
            claims=self.claims, pools=self.pools, candidates=self.candidates, accounting=self.accounting
        )
        return needs.shortfall(check=self.budget.check if self.budget is not None else None)

    # ---- the search ----------------------------------------------------------------------------

    def _one(
        self, ci: int, ri: int, si: int, di: int, in_sub: bool, start: tuple[int, int, int] | None
    ) -> bool:
        """Upstream's allocateOne: device ``di`` of request ``ri`` (or of its subrequest ``si``) on."""
        self.invocations += 1
        if self.invocations == self.check_at:
            self.shortfall = self.check()
            if self.shortfall is not None:
                raise _Infeasible
        budget = self.budget
        if budget is not None and not self.invocations & 255 and budget.clock() > budget.deadline:
            raise BudgetExhausted(budget)
        if ci >= len(self.claims):
            return True
        claim = self.claims[ci]
        if ri >= len(claim.requests):
            try:
                return self._one(ci + 1, 0, 0, 0, False, None)
            except _MaxSizeExceeded:
                return False
        request = claim.requests[ri]
        if request.subs and not in_sub:
            return self._first_available(ci, ri, request)
        spec = request.subs[si] if request.subs else request.single
        assert spec is not None
        self.selected[ci][ri] = spec
        if spec.mode == ALL and not spec.all_devices:
            return False
        if di >= spec.num_devices:
            return self._one(ci, ri + 1, 0, 0, False, None)
        if len(self.results[ci]) + spec.num_devices - di > MAX_DEVICES_PER_CLAIM:
            raise _MaxSizeExceeded
        if spec.mode == ALL:
            pool, se, index = spec.all_devices[di]
            undo = self._allocate_device(spec, pool, se.entries[index], must=True)
            if undo is None:
                return False
            try:
                if self._one(ci, ri, si, di + 1, in_sub, None):
                    return True
            except _MaxSizeExceeded:
                undo()
                raise
            undo()
            return False
        allocated_devices = self.alloc.allocated.devices
        allocating = self.allocating
        p0, s0, d0 = start or (0, 0, 0)
        pools = self.pools
        for pi in range(p0, len(pools)):
            pool = pools[pi]
            if pool.unusable:
                continue
            slices = pool.slices
            for sli in range(s0 if pi == p0 else 0, len(slices)):
                se = slices[sli]
                entries = se.entries
                for dvi in range(d0 if pi == p0 and sli == s0 else 0, len(entries)):
                    entry = entries[dvi]
                    did = entry.id
                    if spec.admin:
                        if ci in allocating.get(did, ()):
                            continue
                    elif did in allocated_devices or did in allocating:
                        continue
                    if not self.is_selectable(spec, se, dvi):
                        continue
                    if self.cc and not self.capacity_fits(spec, entry):
                        continue
                    undo = self._allocate_device(spec, pool, entry, must=False)
                    if undo is None:
                        continue
                    try:
                        if self._one(ci, ri, si, di + 1, in_sub, (pi, sli, dvi + 1)):
                            return True
                    except _MaxSizeExceeded:
                        undo()  # the caller may try another subrequest: leave no trace
                        raise
                    undo()
        return False

    def _first_available(self, ci: int, ri: int, request: PreparedRequest) -> bool:
        """A request with subrequests: the first that can be placed (with all after it) wins."""
        only_max_size = True
        for s in range(len(request.subs)):
            try:
                if self._one(ci, ri, s, 0, True, None):
                    return True
            except _MaxSizeExceeded:
                continue
            only_max_size = False
        if only_max_size:
            raise _MaxSizeExceeded
        return False

    def _allocate_device(
        self, spec: Spec, pool: Pool, entry: DeviceEntry, *, must: bool
    ) -> Callable[[], None] | None:
        """Check and record one device; returns the undo function, or None if it cannot be used."""
        device = entry.device
        did = entry.id
        ci = spec.claim_index
        gates = self.gates
        multi = self.cc and device.allow_multiple_allocations
        if spec.admin:
            if not multi and ci in self.allocating.get(did, ()):
                return None
        elif did in self.alloc.allocated.devices or (not multi and did in self.allocating):
            return None
        if entry.slice.skip_node_operations and not self.candidates.node_operations:
            return None
        if device.consumes_counters and not gates.partitionable_devices:
            return None
        if gates.device_taints and device.taints and not tolerated(device.taints, spec.tolerations):
            return None
        accounting = self.accounting
        release: Callable[[], None] | None = None
        if device.consumes_counters:
            release = accounting.take_counters(pool, entry, multi)
            if release is None:
                return None
        claim = self.claims[ci]
        # The constraints keep their own state: the run only adds the device to them in turn.
        added: list[Constraint] = []
        for constraint in claim.constraints:
            try:
                taken = constraint.add(spec.parent, spec.full, entry, spec.lookup)
            except AllocationError:
                _unwind(added, spec, entry, release)
                raise
            if taken:
                added.append(constraint)
                continue
            constraint.rejections += 1
            _unwind(added, spec, entry, release)
            if must:
                raise _constraint_error(claim=claim, spec=spec, entry=entry)
            return None
        consumed: dict[str, Quantity] | None = None
        if self.cc and (device.capacity or spec.capacity):
            try:
                fits = self.capacity_fits(spec, entry)
                if fits and multi:
                    consumed = accounting.consume_capacity(spec, entry)
            except AllocationError:
                _unwind(added, spec, entry, release)
                raise
            if not fits:
                _unwind(added, spec, entry, release)
                return None
        # Each allocation of a multi-allocatable device is a share (its consumption worked out above).
        share_id = str(uuid.uuid4()) if multi else None
        if not multi:
            self.allocating.setdefault(did, []).append(ci)
        results = self.results[ci]
        results.append(Pick(spec=spec, entry=entry, share_id=share_id, consumed=consumed))
        size = len(results) - 1

        def undo() -> None:
            del results[size:]
            if not multi:
                holders = self.allocating[did]
                holders.pop()
                if not holders:
                    del self.allocating[did]
            if consumed:
                accounting.return_capacity(did, consumed)
            if added or release is not None:
                _unwind(added, spec, entry, release)

        return undo


def _constraint_error(*, claim: PreparedClaim, spec: Spec, entry: DeviceEntry) -> AllocationError:
    """allocationMode All: a device of the request that a constraint turns away (upstream's words)."""
    return AllocationError(
        f"claim {claim.ref}, request {spec.full}: cannot add device {device_id_text(entry.id)} "
        "because a claim constraint would not be satisfied"
    )


def _unwind(
    added: list[Constraint], spec: Spec, entry: DeviceEntry, release: Callable[[], None] | None
) -> None:
    """Take a device back out of the constraints that took it (last first) and of the counters.
    Positional: the search calls it for every device it turns away or backs out of."""
    for constraint in reversed(added):
        constraint.remove(spec.parent, spec.full, entry)
    if release is not None:
        release()
