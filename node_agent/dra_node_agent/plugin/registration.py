"""``pluginregistration.Registration``: tells kubelet what the plugin is and hears whether it was accepted.

Fault injection for the tests: with ``DRA_AGENT_TEST_FAIL_GETINFO`` set to ``n``, the first ``n``
GetInfo calls fail with UNAVAILABLE and a message saying the failure is injected, so a test can
watch the kubelet's plugin watcher retry the registration.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Final

import grpc

from dra_api.kubeletapi import convert, pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from dra_api.kubeletapi.model import PluginInfo

logger = logging.getLogger(__name__)

FAIL_GETINFO_ENV: Final = "DRA_AGENT_TEST_FAIL_GETINFO"


def _injected_failures() -> int:
    text = os.environ.get(FAIL_GETINFO_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        # A test knob must never stop the agent; the warning tells the test why nothing failed.
        logger.warning("ignoring %s=%r: not a count of GetInfo calls", FAIL_GETINFO_ENV, text)
        return 0
    return int(text)


class RegistrationServicer(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    """Answers GetInfo from a fixed ``PluginInfo`` and records the last registration status."""

    def __init__(self, *, info: PluginInfo) -> None:
        self._info = info
        self._fail_get_info = _injected_failures()
        self.get_info_calls = 0
        self.registered = False
        self.error = ""
        # Set on every status kubelet reports, so a caller can wait for the first one.
        self.status_received = asyncio.Event()

    async def GetInfo(
        self,
        request: pluginregistration_v1_pb2.InfoRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pluginregistration_v1_pb2.PluginInfo:
        self.get_info_calls += 1
        if self.get_info_calls <= self._fail_get_info:
            message = (
                f"injected GetInfo failure {self.get_info_calls} of {self._fail_get_info} "
                f"({FAIL_GETINFO_ENV})"
            )
            logger.warning("test fault injection: driver %s: %s", self._info.name, message)
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)
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
