"""Test-side implementations of the plugin's handler protocols: plain Python, no hardware involved."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence

from dra_node_agent.plugin import ClaimRef, DeviceHealth, PreparedDevice, PrepareResult


class RecordingHandler:
    """Prepares every claim with one device named after it, unless told to misbehave for some UIDs."""

    def __init__(self) -> None:
        self.prepared: list[list[ClaimRef]] = []
        self.unprepared: list[list[ClaimRef]] = []
        self.fail: dict[str, str] = {}  # uid -> error returned for it
        self.skip: set[str] = set()  # uids left out of the result
        self.extra: dict[str, PrepareResult] = {}  # results for claims nobody asked about
        self.raise_error: Exception | None = None
        self.devices: dict[str, tuple[PreparedDevice, ...]] = {}  # uid -> devices to return instead

    @staticmethod
    def device_for(claim: ClaimRef) -> PreparedDevice:
        return PreparedDevice(
            requests=("gpu",),
            pool="node-a",
            device=f"gpu-{claim.name}",
            cdi_device_ids=(f"k8s.gpu.nvidia.com/claim={claim.uid}-gpu",),
        )

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        self.prepared.append(list(claims))
        if self.raise_error is not None:
            raise self.raise_error
        results: dict[str, PrepareResult] = dict(self.extra)
        for claim in claims:
            if claim.uid in self.skip:
                continue
            if claim.uid in self.fail:
                results[claim.uid] = PrepareResult(error=self.fail[claim.uid])
            else:
                devices = self.devices.get(claim.uid, (self.device_for(claim),))
                results[claim.uid] = PrepareResult(devices=devices)
        return results

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        self.unprepared.append(list(claims))
        if self.raise_error is not None:
            raise self.raise_error
        return {c.uid: self.fail.get(c.uid, "") for c in claims if c.uid not in self.skip}


class GatedHandler(RecordingHandler):
    """Holds every prepare call until ``release`` is set, counting how many are inside at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.inside = 0
        self.most_inside = 0
        self.entered = asyncio.Condition()
        self.cancelled = 0

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        async with self.entered:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.entered.notify_all()
        try:
            await self.release.wait()
            return await super().prepare(claims)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.inside -= 1


class QueueHealth:
    """A health source fed by the test: every ``publish`` reaches every open stream."""

    def __init__(self) -> None:
        self._queues: list[asyncio.Queue[Sequence[DeviceHealth] | Exception]] = []
        self.watchers = asyncio.Condition()
        self.closed = 0

    async def watch(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        queue: asyncio.Queue[Sequence[DeviceHealth] | Exception] = asyncio.Queue()
        async with self.watchers:
            self._queues.append(queue)
            self.watchers.notify_all()
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self._queues.remove(queue)
            self.closed += 1
            async with self.watchers:
                self.watchers.notify_all()

    @property
    def open_streams(self) -> int:
        return len(self._queues)

    async def wait_for_streams(self, count: int) -> None:
        async with self.watchers:
            await self.watchers.wait_for(lambda: len(self._queues) >= count)

    def publish(self, devices: Sequence[DeviceHealth] | Exception) -> None:
        for queue in self._queues:
            queue.put_nowait(devices)
