"""A run's claims as the feasibility check (``feasibility.py``) reads them: per request, how many
devices it needs and which of the node's devices could serve it on its own, and what the claims'
constraints allow of those devices' values."""

from __future__ import annotations

from collections.abc import Callable

from dra_api.model import ALL
from dra_operator.allocator.accounting import Accounting, counters_fit
from dra_operator.allocator.candidates import Candidates
from dra_operator.allocator.constraints import Constraint, MatchAttribute, constraint_text, lookup_attribute
from dra_operator.allocator.errors import AllocationError
from dra_operator.allocator.feasibility import DistinctValues, Need, SameValue, Shortfall, shortfall
from dra_operator.allocator.pools import DeviceEntry, Pool, SliceEntry
from dra_operator.allocator.specs import PreparedClaim, PreparedRequest, Spec, all_specs
from dra_operator.allocator.state import DeviceID

Position = tuple[Pool, SliceEntry, int]


class Needs:
    """One check of a run's prepared claims against the node's pools."""

    __slots__ = ("_serve_errors", "accounting", "candidates", "claims", "pools")

    def __init__(
        self,
        *,
        claims: list[PreparedClaim],
        pools: tuple[Pool, ...],
        candidates: Candidates,
        accounting: Accounting,
    ) -> None:
        self.claims = claims
        self.pools = pools
        self.candidates = candidates
        self.accounting = accounting
        self._serve_errors = False

    def shortfall(self, *, check: Callable[[], None] | None) -> Shortfall | None:
        """What the feasibility check finds missing before any search; None when the claims may
        fit, or when there is nothing to combine (one device at most). ``check`` is the work
        budget's, which the check calls as it goes."""
        specs = list(all_specs(self.claims))
        if sum(s.num_devices for s in specs if not s.admin) <= 1:
            return None
        # In mode All a device a constraint turns away is an error, which the search reports where
        # it meets it: such claims are left to the search (All leaves it nothing to combine anyway).
        if any(
            s.mode == ALL and any(k.covers(s.parent, s.full) for k in self.claims[s.claim_index].constraints)
            for s in specs
        ):
            return None
        self._serve_errors = False
        if self._derived_errors(specs):
            return None  # an error the search reports as upstream does, if it gets there
        served = self._serving(specs)
        if served is None:
            return None  # an error the search reports as upstream does, if it gets there
        entries, serving, shared = served
        needs: list[Need] = []
        needs_of: list[tuple[PreparedClaim, PreparedRequest, int]] = []
        for claim in self.claims:
            for request in claim.requests:
                options = request.subs or ((request.single,) if request.single else ())
                if not options or any(s.admin for s in options):
                    continue  # admin access takes nothing from others
                # The fewest devices any option needs beyond the shareable ones it can use.
                count = min(max(0, s.num_devices - shared.get(s.key, 0)) for s in options)
                if count <= 0:
                    continue
                devices = sorted({d for s in options for d in serving[s.key]})
                label = f"request {request.name}"
                if len(self.claims) > 1:
                    label = f"claim {claim.ref} {label}"
                needs_of.append((claim, request, len(needs)))
                needs.append(Need(label=label, count=count, devices=tuple(devices)))
        same, distinct = self._constraint_bounds(needs_of, entries)
        return shortfall(needs=needs, same=same, distinct=distinct, check=check)

    def _serving(
        self, specs: list[Spec]
    ) -> tuple[list[DeviceEntry], dict[int, list[int]], dict[int, int]] | None:
        """The devices some spec could take (numbered), the numbers each spec could take (spec
        key -> devices; multi-allocatable ones apart) and how many multi-allocatable devices each
        could share; None when a check met an error."""
        devices: dict[DeviceID, int] = {}
        entries: list[DeviceEntry] = []
        serving: dict[int, list[int]] = {}
        shared: dict[int, int] = {}
        cc = self.candidates.gates.consumable_capacity
        for spec in specs:
            if spec.admin:
                continue
            candidates = spec.all_devices if spec.mode == ALL else self._all_positions()
            own = serving[spec.key] = []
            for pool, se, i in candidates:
                entry = se.entries[i]
                if not self._can_serve(spec, pool, se, i):
                    continue
                if self._serve_errors:
                    return None
                if cc and entry.device.allow_multiple_allocations:
                    shared[spec.key] = shared.get(spec.key, 0) + 1
                    continue
                index = devices.get(entry.id)
                if index is None:
                    index = devices[entry.id] = len(entries)
                    entries.append(entry)
                own.append(index)
        return entries, serving, shared

    def _derived_errors(self, specs: list[Spec]) -> bool:
        """Whether a derived attribute that a constraint reads fails to evaluate on a device its
        request could take (admin access included). The search would stop with that error if it
        met it, so the check must not answer first; evaluated values are kept for the search."""
        for spec in specs:
            names = {
                k.attribute
                for k in self.claims[spec.claim_index].constraints
                if k.attribute in spec.derived and k.covers(spec.parent, spec.full)
            }
            if not names:
                continue
            candidates = spec.all_devices if spec.mode == ALL else self._all_positions()
            for pool, se, i in candidates:
                if not self._can_serve(spec, pool, se, i):
                    continue
                for name in names:
                    try:
                        spec.lookup(se.entries[i], name)
                    except AllocationError:
                        return True
        return False

    def _all_positions(self) -> list[Position]:
        return [
            (pool, se, i)
            for pool in self.pools
            if not pool.unusable
            for se in pool.slices
            for i in range(len(se.entries))
        ]

    def _can_serve(self, spec: Spec, pool: Pool, se: SliceEntry, index: int) -> bool:
        """Whether ``spec`` could take this device on its own (the search's checks, without the
        other devices of the claim). Errors count as yes: the search reports them where it meets them."""
        entry = se.entries[index]
        device = entry.device
        accounting = self.accounting
        cc = self.candidates.gates.consumable_capacity
        # In the search's order: a device it would evaluate (and fail on) comes before the others.
        if entry.id in accounting.allocated.devices:
            return False
        try:
            if not self.candidates.is_selectable(spec, se, index):
                return False
            # Not the search's own picks so far: the check may run in the middle of a search.
            if cc and not accounting.capacity_fits(spec, entry, in_flight=False):
                return False
        except AllocationError:
            self._serve_errors = True
            return True
        if not self.candidates.admits(spec, entry):
            return False
        multi = cc and device.allow_multiple_allocations
        if device.consumes_counters and not (multi and entry.id in accounting.usage.in_use):
            return counters_fit(accounting.usage.available_counters(pool), entry)
        return True

    def _constraint_bounds(
        self, needs_of: list[tuple[PreparedClaim, PreparedRequest, int]], entries: list[DeviceEntry]
    ) -> tuple[list[SameValue], list[DistinctValues]]:
        same: list[SameValue] = []
        distinct: list[DistinctValues] = []
        by_claim: dict[int, list[tuple[PreparedRequest, int]]] = {}
        for claim, request, n in needs_of:
            by_claim.setdefault(id(claim), []).append((request, n))
        for claim in self.claims:
            mine = by_claim.get(id(claim), [])
            for k in claim.constraints:
                if _derives(claim, k):
                    continue  # the value depends on the request as well as the device: no bound
                # A request counts as covered only when all of its subrequests are.
                covered = tuple(
                    n
                    for request, n in mine
                    if all(k.covers(s.parent, s.full) for s in (request.subs or (request.single,)) if s)
                )
                if not covered:
                    continue
                values: dict[int, frozenset[object]] = {}
                for d, entry in enumerate(entries):
                    found = k.check_values(lookup_attribute(entry, k.attribute))
                    if found is not None:
                        values[d] = found
                written = claim.claim.spec.constraints[k.index]
                label = constraint_text(written.match_attribute, written.distinct_attribute, written.requests)
                if isinstance(k, MatchAttribute):
                    same.append(SameValue(label=label, needs=covered, values=values))
                else:
                    distinct.append(DistinctValues(label=label, needs=covered, values=values))
        return same, distinct


def _derives(claim: PreparedClaim, constraint: Constraint) -> bool:
    """Whether a request the constraint covers derives the constraint's attribute."""
    return any(
        constraint.attribute in s.derived
        for r in claim.requests
        for s in (r.subs or (r.single,))
        if s is not None and constraint.covers(s.parent, s.full)
    )
