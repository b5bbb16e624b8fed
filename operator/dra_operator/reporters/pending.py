"""Explanations for the claims kube-scheduler owns and has left pending.

The operator explains its own unallocatable claims with an Event and a condition (see
:mod:`dra_operator.claims.coordinator`). Claims it does not own (with the default ownership, the
claims generated for pods from templates) are kube-scheduler's, and kube-scheduler says only, on
the pod, that it "cannot allocate all claims". For a claim of the operator's classes that has
stayed unallocated for ``Settings.scheduler_pending_explain_after_s`` while the pod that uses it
exists unscheduled (and not gated), the operator runs its allocator's explanation on its model and
posts it as a Warning ``NotAllocatableYet`` Event on the claim. The reason differs from the
operator's own (``NoFit``, ``InvalidSelector``, ...), so that Events about claims it allocates and
advice about kube-scheduler's claims can be told apart; the operator's reason is in the message.

Nothing else is written: no condition, no finalizer, no patch of any kind, since the claim is
kube-scheduler's. When the operator's allocator finds room for the claim alone, nothing is posted:
the pod waits for something else (its other claims, CPU, affinity), which kube-scheduler's own
Events on the pod tell.

Cost: each pass looks at pending claims only, and a claim's explanation is worked out at most once
per ``Settings.scheduler_pending_explain_interval_s`` (at most :data:`MAX_PER_SWEEP` per pass,
oldest first), so a large cluster with many waiting pods does not hold the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from dra_operator.base.settings import Ownership
from dra_operator.claims.coordinator import ClaimReconciler
from dra_operator.claims.status import involved
from dra_operator.model.cluster import ClaimKey, ClusterModel, PodInfo, parse_time
from dra_operator.model.ownership import is_ours, request_classes
from dra_operator.planner import truncate
from dra_operator.planner.placement import OutOfBudget, Unallocatable

logger = logging.getLogger(__name__)

REASON = "NotAllocatableYet"
REPEAT_UNCHANGED_S = 1800.0
"""An unchanged explanation is posted again after this long: the API server keeps Events for an
hour by default, so a claim that waits for hours keeps one in view without an Event every interval."""
MAX_PER_SWEEP = 20


@dataclass(frozen=True, slots=True)
class Waiting:
    """A claim kube-scheduler owns, unallocated past the grace period, and the unscheduled pod
    that uses it."""

    key: ClaimKey
    uid: str
    pod: str
    created_at: float


def waiting_for_scheduler(pod: PodInfo) -> bool:
    """Whether kube-scheduler should be placing this pod and has not (:meth:`PodInfo.awaits_scheduler`)."""
    return pod.awaits_scheduler()


def waiting_claims(
    model: ClusterModel, *, ownership: Ownership, classes: Collection[str], now: float, after: float
) -> list[Waiting]:
    """Claims of ``classes`` the operator does not own, created more than ``after`` seconds before
    ``now`` (wall-clock seconds), still unallocated, with a pod that uses them waiting unscheduled.
    Oldest first."""
    wanted = set(classes)
    out: list[Waiting] = []
    users: dict[tuple[str, str], str] | None = None  # (namespace, claim) -> pod, built when needed
    for claim in model.pending_claims():
        if not request_classes(claim) & wanted or is_ours(claim, ownership=ownership, classes=wanted):
            continue
        key = ClaimKey(claim.namespace, claim.name)
        created = parse_time(model.claim_created.get(key, ""))
        if created is None or now - created < after:
            continue
        pod: str | None = None
        for owner in claim.metadata.owner_references:
            info = model.pods.get((claim.namespace, owner.name)) if owner.kind == "Pod" else None
            if info is not None and (not owner.uid or info.uid == owner.uid):
                pod = owner.name
                break
        if pod is None:
            # A claim no pod owns (ownership 'none'): the pods that name it. The map costs a pass
            # over the pods, once per call, and only when such a claim is waiting.
            if users is None:
                users = {(ns, c): name for (ns, name), info in model.pods.items() for c in info.claims}
            pod = users.get((claim.namespace, claim.name))
        if pod is None or not waiting_for_scheduler(model.pods[(claim.namespace, pod)]):
            continue
        out.append(Waiting(key=key, uid=claim.metadata.uid, pod=pod, created_at=created))
    out.sort(key=lambda w: (w.created_at, w.key))
    return out


@dataclass(slots=True)
class _Said:
    uid: str
    checked_at: float
    message: str | None = None
    posted_at: float | None = None


class ExplanationLimiter:
    """Which waiting claims are due for an explanation, and whether an explanation gets posted.

    A claim is due when it has not been looked at for ``interval`` seconds (a new claim of the same
    name, with another UID, counts as new). An explanation is posted when it differs from the last
    one posted for the claim, or when that one is ``repeat`` seconds old. Times are the caller's
    clock, so tests pass their own."""

    def __init__(self, *, interval: float, repeat: float = REPEAT_UNCHANGED_S) -> None:
        self.interval = interval
        self.repeat = max(repeat, interval)
        self._said: dict[ClaimKey, _Said] = {}

    def due(self, waiting: Iterable[Waiting], *, now: float, limit: int = MAX_PER_SWEEP) -> list[Waiting]:
        out = []
        for w in waiting:
            said = self._said.get(w.key)
            if said is None or said.uid != w.uid or now - said.checked_at >= self.interval:
                out.append(w)
                if len(out) >= limit:
                    break
        return out

    def checked(self, w: Waiting, *, message: str | None, now: float) -> bool:
        """Record that ``w`` was looked at (``message``: the explanation, None when the claim fits);
        whether to post ``message``."""
        said = self._said.get(w.key)
        if said is None or said.uid != w.uid:
            said = self._said[w.key] = _Said(uid=w.uid, checked_at=now)
        said.checked_at = now
        if message is None:
            return False
        if message == said.message and said.posted_at is not None and now - said.posted_at < self.repeat:
            return False
        said.message, said.posted_at = message, now
        return True

    def keep_only(self, keys: Collection[ClaimKey]) -> None:
        """Forget claims no longer waiting (allocated, deleted, their pod scheduled)."""
        for key in [k for k in self._said if k not in keys]:
            del self._said[key]

    def __len__(self) -> int:
        return len(self._said)


def message_for(*, pod: str, namespace: str, why: Unallocatable) -> str:
    return truncate(
        f"kube-scheduler owns this claim and has not scheduled pod {namespace}/{pod}, which uses it; "
        f"the operator's allocator cannot place the claim either ({why.reason}): {why.message}"
    )


class SchedulerClaimExplainer:
    """Posts the explanations; :meth:`sweep` is called periodically on the active instance."""

    def __init__(self, *, claims: ClaimReconciler) -> None:
        self.claims = claims
        settings = claims.settings
        self.after = settings.scheduler_pending_explain_after_s
        self.limiter = ExplanationLimiter(interval=settings.scheduler_pending_explain_interval_s)

    @property
    def enabled(self) -> bool:
        return self.after > 0

    async def sweep(self, *, now: float) -> int:
        """Explain the claims that are due; how many Events were queued. A claim whose placement
        outgrows the event loop's slice is searched in a worker thread, as the operator's own are."""
        claims = self.claims
        waiting = waiting_claims(
            claims.model,
            ownership=claims.settings.ownership,
            classes=claims.classes,
            now=now,
            after=self.after,
        )
        self.limiter.keep_only({w.key for w in waiting})
        posted = 0
        for w in self.limiter.due(waiting, now=now):
            claim = claims.model.claims.get(w.key)
            if claim is None:
                continue  # deleted while an earlier claim was searched
            try:
                outcome = await claims.assess_fully(claim)
            except Exception:
                logger.exception("explaining claim %s failed", w.key)
                claims.metrics.reconcile_errors.labels("ResourceClaim").inc()
                outcome = None
            if isinstance(outcome, OutOfBudget):
                outcome = Unallocatable(reason="SearchBudgetExhausted", message=outcome.message)
            message = (
                message_for(pod=w.pod, namespace=claim.namespace, why=outcome)
                if isinstance(outcome, Unallocatable)
                else None
            )
            if not self.limiter.checked(w, message=message, now=now):
                continue
            assert message is not None
            logger.info("claim %s (kube-scheduler's, pod %s): %s", w.key, w.pod, message)
            claims.events.post(
                involved=involved(claim, api_version=claims.api.api_version),
                type_="Warning",
                reason=REASON,
                message=message,
            )
            claims.metrics.scheduler_claim_explanations.inc()
            posted += 1
        return posted
