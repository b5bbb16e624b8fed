"""``v1alpha1.DRAResourceHealth/NodeWatchResources``: forwards a ``HealthSource`` to each kubelet stream."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import grpc

from dra_api.kubeletapi import convert, health_v1alpha1_pb2, health_v1alpha1_pb2_grpc
from dra_api.kubeletapi.model import DeviceHealth
from dra_node_agent.plugin.handler import HealthSource

logger = logging.getLogger(__name__)


class HealthServicer(health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    """One ``source.watch()`` per stream; every stream ends as soon as ``stopping`` is set."""

    def __init__(self, *, driver: str, source: HealthSource, stopping: asyncio.Event) -> None:
        self._driver = driver
        self._source = source
        self._stopping = stopping

    async def NodeWatchResources(
        self,
        request: health_v1alpha1_pb2.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[health_v1alpha1_pb2.NodeWatchResourcesResponse]:
        logger.info("kubelet opened the health stream of driver %s", self._driver)
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
                yield convert.health_to_proto(devices)
        finally:
            stop.cancel()
            if report is not None and not report.done():
                # The generator must be idle before it can be closed.
                report.cancel()
                await asyncio.wait({report})
            aclose = getattr(reports, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:
                    logger.debug("closing the health source of driver %s failed", self._driver, exc_info=True)
            logger.info("health stream of driver %s ended", self._driver)
