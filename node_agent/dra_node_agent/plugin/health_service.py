"""``DRAResourceHealth/NodeWatchResources`` in both versions a kubelet may ask for: ``v1`` (kubelet
1.37+, which prefers it) and ``v1alpha1`` (1.34 to 1.36, and 1.37 still accepts it). Each forwards a
``HealthSource`` to every kubelet stream; the two differ only in the message types they send."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import grpc

from dra_api.kubeletapi import (
    convert,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)
from dra_api.kubeletapi.model import DeviceHealth, HealthVersion
from dra_node_agent.plugin.handler import HealthSource

logger = logging.getLogger(__name__)


class HealthStreams:
    """One ``source.watch()`` per kubelet stream; every stream ends as soon as ``stopping`` is set."""

    def __init__(self, *, driver: str, source: HealthSource, stopping: asyncio.Event) -> None:
        self._driver = driver
        self._source = source
        self._stopping = stopping

    async def follow(
        self, *, version: HealthVersion, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncGenerator[Sequence[DeviceHealth]]:
        """The source's reports for one stream, until the source ends, the plugin stops or the
        kubelet goes (the caller then closes this generator)."""
        logger.info("kubelet opened the health stream of driver %s (%s)", self._driver, version)
        reports = self._source.watch()
        stop = asyncio.ensure_future(self._stopping.wait())
        report: asyncio.Future[Sequence[DeviceHealth]] | None = None
        try:
            while True:
                # Wait for the next report or for shutdown, whichever comes first, so that stopping the
                # plugin never waits on a quiet health source.
                report = asyncio.ensure_future(anext(reports))
                await asyncio.wait({report, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not report.done():
                    return
                try:
                    devices = report.result()
                except StopAsyncIteration:
                    return
                except Exception as exc:
                    logger.exception("health source of driver %s failed", self._driver)
                    await context.abort(grpc.StatusCode.UNAVAILABLE, f"health source failed: {exc}")
                yield devices
        finally:
            stop.cancel()
            if report is not None and not report.done():
                # The generator must be idle before it can be closed.
                report.cancel()
                await asyncio.wait({report})
            await self._close(reports)
            logger.info("health stream of driver %s (%s) ended", self._driver, version)

    async def _close(self, reports: AsyncIterator[Sequence[DeviceHealth]]) -> None:
        aclose = getattr(reports, "aclose", None)
        if aclose is None:
            return
        try:
            await aclose()
        except Exception:
            logger.debug("closing the health source of driver %s failed", self._driver, exc_info=True)


class HealthServicer(health_v1_pb2_grpc.DRAResourceHealthServicer):
    """``v1.DRAResourceHealth``."""

    def __init__(self, *, streams: HealthStreams) -> None:
        self._streams = streams

    async def NodeWatchResources(
        self,
        request: health_v1_pb2.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[health_v1_pb2.NodeWatchResourcesResponse]:
        # aclosing: when the kubelet goes, gRPC closes this generator, and this one must then
        # close the source's watch at once rather than leave it to the garbage collector.
        async with contextlib.aclosing(self._streams.follow(version="v1", context=context)) as reports:
            async for devices in reports:
                yield convert.health_to_proto(devices)


class HealthServicerV1alpha1(health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth``: the same stream in the older version's messages."""

    def __init__(self, *, streams: HealthStreams) -> None:
        self._streams = streams

    async def NodeWatchResources(
        self,
        request: health_v1alpha1_pb2.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[health_v1alpha1_pb2.NodeWatchResourcesResponse]:
        async with contextlib.aclosing(self._streams.follow(version="v1alpha1", context=context)) as reports:
            async for devices in reports:
                yield convert.health_to_v1alpha1(convert.health_to_proto(devices))
