"""Reserving devices for a claim that has waited too long for kube-scheduler.

Giving way (:mod:`dra_operator.scheduler.contention`) is enough while some free device lies out of
the waiting pods' reach. When pods ask for more devices than the cluster has, none does: every
device freed is taken by a waiting pod within milliseconds, and a standalone claim would wait for
as long as the pods keep coming. So a claim that has waited
:attr:`Settings.scheduler_reserve_after_s` gets devices reserved for it on one node, each by a
DeviceTaintRule with a ``NoSchedule`` taint: as many free ones as it asks for (kube-scheduler may be
giving them to a pod at this moment) and as many of those held longest (the likeliest to be freed
next); it takes the first that are free. kube-scheduler then allocates them to no pod; the pods
holding them keep them (``NoSchedule`` evicts nobody), so pods lose little more than the devices the
claim takes.

``RESERVATION_SETTLE_S`` after the rules were written, kube-scheduler has seen them and finished any
pod it was placing on them before; only then does the claim use the devices that were free. A device
another claim held when its rule was written cannot have been given to a pod at that moment, so it
only waits ``RULE_SEEN_S`` (kube-scheduler's watch delay): a pod holding it often ends within the
settle, and the device would otherwise stay idle until the settle ends. The rules on the devices it
takes are deleted ``RESERVATION_SETTLE_S`` after its allocation was written, so that kube-scheduler
has seen the allocation before the devices look untainted again; the others go at once. The
operator itself does not read DeviceTaintRules: the claim is placed on the reserved node as on any
other, and the reserved devices count as out of kube-scheduler's reach.

Which node: one where the claim fits once its devices are free, with the most matching devices free
now, then the one whose devices have been held longest. At most one node in
:data:`NODES_PER_RESERVATION` holds a reservation at a time. A reservation that brings nothing
within ``RESERVATION_TTL_S`` is given up and the claim may get another node.

DeviceTaintRule is served as ``resource.k8s.io/v1beta2`` from 1.36 behind DRADeviceTaintRules (off by
default there); without it claims only give way, as before, and the operator says so once at start.
Rules are labelled with the claim's UID; an operator that becomes active deletes every rule it
finds with that label (a previous instance's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from dra_api.aiotasks import BackgroundTasks
from dra_api.model import ALL, ResourceClaim
from dra_api.names import PROJECT_DOMAIN
from dra_operator.allocator import SliceIndex
from dra_operator.client.errors import Conflict, NotActive, error_text
from dra_operator.client.kubeapi import KubeApi
from dra_operator.model.book import ClaimBook
from dra_operator.model.cluster import ClaimKey, ClusterModel, DeviceID, parse_time
from dra_operator.model.workqueue import ClaimQueue
from dra_operator.planner.demand import DemandKey, key_of
from dra_operator.planner.index import key_matches

logger = logging.getLogger(__name__)

RESERVED_FOR_LABEL = f"{PROJECT_DOMAIN}/reserved-for-claim"
"""Label on the operator's DeviceTaintRules: the UID of the claim the node is reserved for."""
RESERVATION_TAINT_KEY = f"{PROJECT_DOMAIN}/reserved-for-claim"

RESERVATION_SETTLE_S = 2.0
"""How long after writing a rule kube-scheduler is taken to have seen it (its watch delay plus the
pod it may have been placing at that moment), and after writing the allocation, to have seen that."""
RULE_SEEN_S = 0.5
"""How long after writing a rule kube-scheduler is taken to have seen it: enough for a device another
claim held at that moment, which kube-scheduler could not have been giving to a pod."""
RESERVATION_TTL_S = 30.0
"""A reservation that has brought the claim nothing for this long is given up."""
NODES_PER_RESERVATION = 4
"""At most one node in this many (at least one node) is reserved at any time."""


@dataclass(frozen=True, slots=True)
class Target:
    """The node to reserve for a claim, and the devices there to reserve: per request, as many
    free ones as it asks for and as many of those held longest."""

    node: str
    devices: tuple[DeviceID, ...]


@dataclass
class Reservation:
    claim: ClaimKey
    uid: str
    target: Target
    made_at: float
    """time.monotonic() when its rules were written."""
    rules: list[str] = field(default_factory=list)
    """The rules written, in the order of ``target.devices``."""
    held: frozenset[DeviceID] = frozenset()
    """The reserved devices other claims held when the rules were written."""

    def settled_devices(self, now: float) -> frozenset[DeviceID]:
        """The reserved devices kube-scheduler no longer allocates at ``now``."""
        age = now - self.made_at
        return frozenset(
            d for d in self.target.devices if age >= (RULE_SEEN_S if d in self.held else RESERVATION_SETTLE_S)
        )

    def expired(self, now: float) -> bool:
        return now - self.made_at >= RESERVATION_TTL_S


def _request_keys(claim: ResourceClaim, model: ClusterModel) -> list[tuple[DemandKey, int]] | None:
    """The claim's requests as (devices it can use, how many), or None for what a node reservation
    is not made for: alternatives (firstAvailable), all-devices requests, admin access, a missing
    class."""
    keys = []
    for request in claim.spec.requests:
        spec = request.exactly
        if spec is None or spec.mode == ALL or spec.admin_access:
            return None
        device_class = model.classes.get(spec.device_class_name)
        if device_class is None:
            return None
        keys.append((key_of(request=spec, device_class=device_class), spec.effective_count))
    return keys or None


def choose_target(
    *,
    claim: ResourceClaim,
    model: ClusterModel,
    index: SliceIndex,
    in_use: Collection[DeviceID],
    excluded: Collection[str] = (),
    now: float | None = None,
) -> Target | None:
    """What to reserve for ``claim``: on a node with enough devices it could use once they are
    free (nodes in ``excluded`` never), the most of them free now first, then the longest held;
    there, per request, as many free devices as it asks for and as many of those held longest.
    None when no node qualifies or the claim is not of a kind reserved for."""
    keys = _request_keys(claim, model)
    if keys is None:
        return None
    now = time.time() if now is None else now
    best: tuple[tuple[int, float], Target] | None = None
    for node, slices in index.on_node.items():
        if node in excluded:
            continue
        chosen: list[DeviceID] = []
        free = 0
        oldest = now
        for key, count in keys:
            found = [
                e.id
                for s in slices
                for e in index.entries(s)
                if e.id not in chosen and key_matches(key=key, entry=e)
            ]
            if len(found) < count:
                break
            # As many free ones (kube-scheduler may be giving them to a pod this moment) and as many
            # held longest (the likeliest to be freed next): the claim takes the first free.
            free_now = [d for d in found if d not in in_use]
            held = sorted((d for d in found if d in in_use), key=lambda d: _held_since(model, d, now=now))
            chosen += free_now[:count] + held[:count]
            free += sum(1 for d in found if d not in in_use)
            oldest = min([oldest, *(_held_since(model, d, now=now) for d in found if d in in_use)])
        else:
            score = (-free, oldest)
            if best is None or score < best[0]:
                best = (score, Target(node=node, devices=tuple(chosen)))
    return best[1] if best is not None else None


def _held_since(model: ClusterModel, device: DeviceID, *, now: float) -> float:
    """When the claims holding ``device`` were made (the earliest), as wall-clock seconds."""
    stamps = [parse_time(model.claim_created.get(k, "")) for k in model.holders(device)]
    return min((s for s in stamps if s is not None), default=now)


def rule_body(*, name: str, claim: ResourceClaim, device: DeviceID, api_version: str) -> dict[str, object]:
    driver, pool_name, device_name = device
    return {
        "apiVersion": api_version,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": name,
            "labels": {RESERVED_FOR_LABEL: claim.metadata.uid},
            "annotations": {f"{PROJECT_DOMAIN}/claim": f"{claim.namespace}/{claim.name}"},
        },
        "spec": {
            "deviceSelector": {"driver": driver, "pool": pool_name, "device": device_name},
            "taint": {"key": RESERVATION_TAINT_KEY, "value": claim.metadata.uid, "effect": "NoSchedule"},
        },
    }


class NodeReservations:
    """The reservations of the claims that have waited too long; writes and deletes their rules."""

    def __init__(
        self,
        *,
        api: KubeApi,
        model: ClusterModel,
        queue: ClaimQueue,
        after_s: float,
        ended: Callable[[str], None] = lambda outcome: None,
        book: ClaimBook | None = None,
    ) -> None:
        self.api = api
        self.ended = ended
        """Called with how each reservation ended (metrics.RESERVATION_OUTCOMES)."""
        self.model = model
        self.queue = queue
        self.after_s = after_s
        """How long a claim gives way before a node is reserved for it; negative: never."""
        book = book if book is not None else ClaimBook()
        # The claim book's: the reservation of each claim, and the nodes tried for it.
        self.by_claim: dict[ClaimKey, Reservation] = book.reservations
        self._tasks = BackgroundTasks()
        self._tried: dict[ClaimKey, set[str]] = book.tried_nodes

    @property
    def enabled(self) -> bool:
        return self.after_s >= 0 and self.api.taint_rule_version is not None

    def of(self, key: ClaimKey) -> Reservation | None:
        return self.by_claim.get(key)

    def settled_devices(self, key: ClaimKey) -> frozenset[DeviceID]:
        """The devices reserved for ``key`` that kube-scheduler no longer allocates."""
        found = self.by_claim.get(key)
        return frozenset() if found is None else found.settled_devices(time.monotonic())

    def due(self, claim: ResourceClaim, *, waited_s: float) -> bool:
        """Whether a node should be reserved for the claim now."""
        key = ClaimKey(claim.namespace, claim.name)
        if not self.enabled or key in self.by_claim or waited_s < self.after_s:
            return False
        nodes = len({s.node_name for s in self.model.slices.values() if s.node_name})
        return len(self.by_claim) < max(1, nodes // NODES_PER_RESERVATION)

    def reserved_nodes(self) -> set[str]:
        return {r.target.node for r in self.by_claim.values()}

    def tried_nodes(self, key: ClaimKey) -> set[str]:
        return self._tried.get(key, set())

    async def reserve(self, claim: ResourceClaim, target: Target) -> Reservation | None:
        """Write the rules for ``target``; None when the API refused (logged; the claim keeps
        giving way)."""
        key = ClaimKey(claim.namespace, claim.name)
        reservation = Reservation(claim=key, uid=claim.metadata.uid, target=target, made_at=time.monotonic())
        self.by_claim[key] = reservation
        self._tried.setdefault(key, set()).add(target.node)
        try:
            for i, device in enumerate(target.devices):
                name = f"reserved-{claim.metadata.uid}-{i}"
                version = self.api.taint_rule_api_version
                body = rule_body(name=name, claim=claim, device=device, api_version=version)
                # A conflict: written by an earlier try for the same claim, the same rule.
                with contextlib.suppress(Conflict):
                    await self.api.create_taint_rule(body)
                reservation.rules.append(name)
        except NotActive:
            self._drop(key, delay=0.0, outcome="refused")
            raise
        except Exception as exc:  # any refusal: give way as before, say why
            logger.warning("claim %s: could not reserve node %s: %s", key, target.node, error_text(exc))
            self._drop(key, delay=0.0, outcome="refused")
            return None
        reservation.made_at = time.monotonic()
        reservation.held = frozenset(d for d in target.devices if self.model.holders(d))
        logger.info(
            "claim %s: reserved node %s for it (%s) with DeviceTaintRules; it is placed there once "
            "kube-scheduler has seen them and the devices are free",
            key,
            target.node,
            ", ".join("/".join(d) for d in target.devices),
        )
        # Placed again once settled and once expired, whether or not anything else changes by then.
        loop = asyncio.get_running_loop()
        if reservation.held:
            loop.call_later(RULE_SEEN_S + 0.01, self._requeue, [key])
        loop.call_later(RESERVATION_SETTLE_S + 0.01, self._requeue, [key])
        loop.call_later(RESERVATION_TTL_S + 0.01, lambda: self._requeue(self.expire()))
        return reservation

    def _requeue(self, keys: Iterable[ClaimKey]) -> None:
        for key in keys:
            self.queue.dirty[key] = None
        self.queue.wake.set()

    def expire(self) -> list[ClaimKey]:
        """Give up the reservations that brought nothing in time; the claims they were for."""
        now = time.monotonic()
        expired = [k for k, r in self.by_claim.items() if r.expired(now)]
        for key in expired:
            logger.info(
                "claim %s: no device freed in time on node %s; its reservation is given up",
                key,
                self.by_claim[key].target.node,
            )
            self._drop(key, delay=0.0, outcome="expired")
        return expired

    def allocated(self, key: ClaimKey, devices: Collection[DeviceID]) -> None:
        """The claim's allocation of ``devices`` is written: the rules on those go once
        kube-scheduler has seen it, the others (reserved but not taken) at once."""
        self._tried.pop(key, None)
        reservation = self.by_claim.get(key)
        if reservation is not None:
            taken = [
                n for d, n in zip(reservation.target.devices, reservation.rules, strict=True) if d in devices
            ]
            spare = [n for n in reservation.rules if n not in taken]
            if spare:
                self._tasks.spawn(self._delete(spare, 0.0), name=f"unreserve spare {key}")
            reservation.rules = taken
        self._drop(key, delay=RESERVATION_SETTLE_S, outcome="allocated")

    def gone(self, key: ClaimKey) -> None:
        """The claim is deleted or no longer waits: its rules go now."""
        self._tried.pop(key, None)
        self._drop(key, delay=0.0, outcome="gone")

    def _drop(self, key: ClaimKey, *, delay: float, outcome: str) -> None:
        reservation = self.by_claim.pop(key, None)
        if reservation is not None:
            self.ended(outcome)
        if reservation is not None and reservation.rules:
            self._tasks.spawn(self._delete(reservation.rules, delay), name=f"unreserve {key}")

    async def _delete(self, names: Iterable[str], delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        for name in names:
            try:
                await self.api.delete_taint_rule(name)
            except NotActive:
                return  # the next active instance deletes it (sweep)
            except Exception as exc:  # logged; the next sweep deletes it
                logger.warning("could not delete DeviceTaintRule %s: %s", name, error_text(exc))

    async def sweep(self) -> int:
        """Delete the rules that no reservation of this instance holds (a previous active
        instance's); how many."""
        if self.api.taint_rule_version is None:
            return 0
        mine = {n for r in self.by_claim.values() for n in r.rules}
        names = [n for n in await self.api.list_taint_rules(RESERVED_FOR_LABEL) if n not in mine]
        await self._delete(names, 0.0)
        if names:
            logger.info("deleted %d DeviceTaintRule(s) left by a previous instance", len(names))
        return len(names)

    async def stop(self, *, grace: float) -> None:
        """Delete every rule still held (the operator is stopping), within ``grace`` seconds."""
        for key in list(self.by_claim):
            self._drop(key, delay=0.0, outcome="gone")
        await self._tasks.drain(grace=grace)
