"""``pluginregistration.Registration``: tells kubelet what the plugin is and hears whether it was accepted."""

from __future__ import annotations

import asyncio
import logging

import grpc

from dra_api.kubeletapi import convert, pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from dra_api.kubeletapi.model import PluginInfo

logger = logging.getLogger(__name__)


class RegistrationServicer(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    """Answers GetInfo from a fixed ``PluginInfo`` and records the last registration status."""

    def __init__(self, *, info: PluginInfo) -> None:
        self._info = info
        self.registered = False
        self.error = ""
        # Set on every status kubelet reports, so a caller can wait for the first one.
        self.status_received = asyncio.Event()

    async def GetInfo(
        self,
        request: pluginregistration_v1_pb2.InfoRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pluginregistration_v1_pb2.PluginInfo:
        logger.debug("kubelet asked for the registration info of driver %s", self._info.name)
        return convert.plugin_info_to_proto(self._info)

    async def NotifyRegistrationStatus(
        self,
        request: pluginregistration_v1_pb2.RegistrationStatus,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pluginregistration_v1_pb2.RegistrationStatusResponse:
        self.registered = request.plugin_registered
        self.error = request.error
        if request.plugin_registered:
            logger.info("kubelet registered DRA driver %s at %s", self._info.name, self._info.endpoint)
        else:
            logger.warning(
                "kubelet rejected DRA driver %s: %s", self._info.name, request.error or "no reason given"
            )
        self.status_received.set()
        return pluginregistration_v1_pb2.RegistrationStatusResponse()
