"""Which operator instance is the active one: Kopf peering, renewed often, with a step-down.

Every instance keeps an entry ``{priority, lifetime, lastseen}`` under its identity in the
ClusterKopfPeering object's ``status`` (Kopf's format; Kopf's own keep-alive writes the same entry
and pauses its watch streams by the same rule). The live instance with the highest priority is
the active one; on a tie every instance stays paused, as Kopf does.

Three numbers, as in client-go's leader election:

- renew interval R (``heartbeat_interval_s``, 2 s): each instance renews its entry every R s (the
  same patch carries the liveness heartbeat, see :mod:`dra_operator.watch.liveness`);
- renew deadline D (``peering_renew_deadline_s``, 8 s): the active instance stops writing once its
  last successful renewal *started* more than D s ago (a slow or unreachable API server);
- lifetime L (``peering_lifetime_s``, 12 s): peers count an entry as live until ``lastseen + L``.

R < D < L. After a SIGKILL the standby takes over between L - R and L after the kill (it wakes at
the dead entry's deadline), plus one listing of the cluster. L - D is what keeps two instances from
writing at once when the active one is cut off: it has stopped D after ``lastseen``, the other
starts at L. That margin must cover the clock difference between the two machines (``lastseen``
is the writer's clock) and the time a renewal takes to reach the standby.

On SIGTERM the instance steps down first (no write starts after that), then removes its entry; the
standby watches the peering object and takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_api import times
from dra_api.names import PROJECT_DOMAIN
from dra_operator.client.errors import Expired, WatchInactive, error_text
from dra_operator.client.kubeapi import KubeApi

logger = logging.getLogger(__name__)

HEARTBEAT_ANNOTATION = f"{PROJECT_DOMAIN}/heartbeat"


@dataclass(frozen=True)
class PeeringTimes:
    renew_interval: float
    renew_deadline: float
    lifetime: int

    def check(self) -> None:
        """Raise ValueError unless R < D < L."""
        if not 0 < self.renew_interval < self.renew_deadline < self.lifetime:
            raise ValueError(
                "peering timing: need heartbeat interval < renew deadline < lifetime, got "
                f"{self.renew_interval:g} s, {self.renew_deadline:g} s, {self.lifetime} s"
            )


def parse_time(text: str) -> float | None:
    """A Kopf ``lastseen`` (ISO 8601, with or without a zone) as a Unix time; None if unreadable."""
    return times.parse(text)


def _live_peers(peers: Mapping[str, Any], *, identity: str, now: float) -> list[tuple[int, float]]:
    """(priority, deadline) of every other peer whose entry is still live (Kopf ignores dead ones)."""
    live = []
    for other, info in peers.items():
        if other == identity or not isinstance(info, Mapping):
            continue
        lastseen = parse_time(str(info.get("lastseen", "")))
        if lastseen is None:
            continue
        deadline = lastseen + float(info.get("lifetime") or 0)
        if deadline > now:
            live.append((int(info.get("priority") or 0), deadline))
    return live


def blocking_deadlines(*, peers: Mapping[str, Any], identity: str, priority: int, now: float) -> list[float]:
    """When each live peer that keeps this one paused (same or higher priority) expires."""
    return [d for p, d in _live_peers(peers, identity=identity, now=now) if p >= priority]


def has_live_lower(*, peers: Mapping[str, Any], identity: str, priority: int, now: float) -> bool:
    """Whether a live peer with a lower priority exists (it may be the active one right now)."""
    return any(p < priority for p, _ in _live_peers(peers, identity=identity, now=now))


def is_active(*, peers: Mapping[str, Any], identity: str, priority: int, now: float) -> bool:
    """Kopf's rule seen from one peer: it has an entry, and no other live peer has the same or a
    higher priority."""
    return identity in peers and not blocking_deadlines(
        peers=peers, identity=identity, priority=priority, now=now
    )


def _lastseen(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat()


class Peering:
    """This instance's keep-alive, its view of the peers, and whether it may write."""

    def __init__(
        self,
        *,
        api: KubeApi,
        name: str,
        identity: str,
        priority: int,
        times: PeeringTimes,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        times.check()
        self.api = api
        self.name = name
        self.identity = identity
        self.priority = priority
        self.times = times
        self.clock = clock
        self.wall = wall
        self.sent: str | None = None
        """The heartbeat annotation value last written (liveness compares what the watch brings)."""
        self.changed = asyncio.Event()
        """Set whenever ``active`` may have turned on; the claim worker waits on it."""
        self.stopping = False
        self.missing = False
        self._by_peers = False
        self._renewed: float | None = None  # clock() when the last successful renewal started
        self._joined: float | None = None  # clock() since when this entry has been live throughout
        self._wake = asyncio.Event()
        # One write of this instance's entry at a time: a renewal still in flight when the farewell
        # is sent could land after it and bring the entry back for a whole lifetime.
        self._write = asyncio.Lock()
        self._next_deadline: float | None = None  # wall time a blocking peer expires
        self._was_active = False

    # -- the verdict --------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether this instance may write: the peers say so and its own entry is fresh."""
        return (
            not self.stopping
            and self._by_peers
            and self._renewed is not None
            and self.clock() - self._renewed < self.times.renew_deadline
        )

    def observe(self, obj: Mapping[str, Any]) -> None:
        """Evaluate the peers from the peering object (a renewal's response or a watch event)."""
        peers = obj.get("status") or {}
        if not isinstance(peers, Mapping):
            peers = {}
        now = self.wall()
        deadlines = blocking_deadlines(peers=peers, identity=self.identity, priority=self.priority, now=now)
        self._by_peers = self.identity in peers and not deadlines
        if self._by_peers and self._joined is not None:
            # Newly (re)joined above a live lower peer, which may be the active one: give it one
            # renew interval to see this entry (on its watch or its next renewal) and stop writing.
            settle = self._joined + self.times.renew_interval - self.clock()
            if settle > 0 and has_live_lower(
                peers=peers, identity=self.identity, priority=self.priority, now=now
            ):
                self._by_peers = False
                deadlines = [now + settle]
        self._next_deadline = min(deadlines) if deadlines else None
        self._report()

    def _report(self) -> None:
        now_active = self.active
        if now_active != self._was_active:
            self._was_active = now_active
            if now_active:
                logger.info("this instance is now active (identity %s)", self.identity)
                self.changed.set()
            elif self.stopping:
                logger.info("stepped down: this instance is stopping")
            elif self._by_peers:
                logger.error(
                    "stepped down: no keep-alive renewed for %.0f s (renew deadline %g s); another "
                    "instance may take over after %d s",
                    self.clock() - (self._renewed or 0.0),
                    self.times.renew_deadline,
                    self.times.lifetime,
                )
            else:
                logger.info("this instance is now standby: another instance is active")

    # -- the loops ----------------------------------------------------------------------------------

    async def renew(self) -> None:
        """Write this instance's entry and the heartbeat; read the peers back from the response."""
        started = self.clock()
        now = self.wall()
        stamp = f"{self.identity}@{now:.3f}"
        body = {
            "metadata": {"annotations": {HEARTBEAT_ANNOTATION: stamp}},
            "status": {
                self.identity: {
                    "priority": self.priority,
                    "lifetime": self.times.lifetime,
                    "lastseen": _lastseen(now),
                }
            },
        }
        async with self._write:
            if self.stopping:
                return  # the farewell came first: no entry may be written after it
            obj = await asyncio.wait_for(
                self.api.patch_peering(name=self.name, body=body), timeout=self.times.renew_deadline
            )
        if obj is None:
            if not self.missing:
                logger.warning(
                    "peering object ClusterKopfPeering %s is missing: staying paused. Apply crds/ and "
                    "manifests/base/operator-peering.yaml, or run with --standalone=true",
                    self.name,
                )
            self.missing = True
            self._by_peers = False
            self._report()
            return
        if self._stepped_down():
            return  # a renewal that raced the farewell must not count
        self.missing = False
        self.sent = stamp
        if self._renewed is None or started - self._renewed >= self.times.lifetime:
            self._joined = started  # the peers saw no live entry of this instance until now
        self._renewed = started
        self.observe(obj)

    async def run(self) -> None:
        """Renew every R seconds; in between, wake at a blocking peer's deadline or on a watch event."""
        while not self.stopping:
            try:
                await self.renew()
            except Exception as exc:
                logger.warning("keep-alive in peering object %s failed: %s", self.name, error_text(exc))
                self._report()
            await self._sleep_until_next()

    async def _sleep_until_next(self) -> None:
        delay = self.times.renew_interval
        if self._next_deadline is not None:
            delay = min(delay, max(0.0, self._next_deadline - self.wall()) + 0.05)
        if self._renewed is not None:
            # Wake when the renew deadline passes, so the step-down is logged and counted then.
            delay = min(delay, max(0.0, self._renewed + self.times.renew_deadline - self.clock()) + 0.01)
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=delay)

    async def watch(
        self,
        *,
        server_timeout_s: int,
        client_timeout_s: float,
        connect_timeout_s: float,
        inactivity_timeout_s: float,
    ) -> None:
        """Follow the peering object, so a peer's farewell or appearance is seen at once. A stream
        that goes silent is dropped after ``inactivity_timeout_s`` and resumed (the keep-alive's
        own writes do not depend on it)."""
        version = "0"
        failures = 0
        while not self.stopping:
            try:
                async for kind, obj in self.api.watch_peering(
                    name=self.name,
                    resource_version=version,
                    server_timeout_s=server_timeout_s,
                    client_timeout_s=client_timeout_s,
                    connect_timeout_s=connect_timeout_s,
                    inactivity_timeout_s=inactivity_timeout_s,
                ):
                    failures = 0
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if kind in ("ADDED", "MODIFIED"):
                        self.observe(obj)
                        self._wake.set()  # re-plan the next wake-up from the new deadlines
            except Expired:
                version = "0"
            except WatchInactive as exc:
                logger.warning("the peering watch went silent (%s); dropped it, resuming", exc)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                logger.debug("peering watch ended: %s", error_text(exc))
                await asyncio.sleep(min(10.0, 0.5 * 2**failures))

    # -- stopping -----------------------------------------------------------------------------------

    def _stepped_down(self) -> bool:
        """``stopping``, read again after an ``await`` (a check before it does not hold after)."""
        return self.stopping

    def step_down(self) -> None:
        """Stop writing now (SIGTERM); nothing is renewed after this."""
        self.stopping = True
        self._wake.set()
        self._report()

    async def farewell(self) -> None:
        """Remove this instance's entry, so the standby need not wait out its lifetime."""
        self.step_down()
        try:
            async with asyncio.timeout(self.times.renew_deadline), self._write:
                # After any renewal in flight has landed, so that none can bring the entry back.
                await self.api.patch_peering(name=self.name, body={"status": {self.identity: None}})
            logger.info("removed this instance from peering object %s", self.name)
        except Exception as exc:
            logger.warning(
                "could not remove this instance from peering object %s (%s): the standby takes over "
                "after %d s instead",
                self.name,
                error_text(exc),
                self.times.lifetime,
            )
