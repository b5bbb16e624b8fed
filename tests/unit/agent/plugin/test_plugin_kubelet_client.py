"""The test kubelet's own checks, against hand-rolled plugins that break the protocol on purpose."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from dra_api.kubeletapi import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2_grpc,
)
from dra_api.kubeletapi.model import DRAVersion, PluginInfo
from dra_devcluster.kubelet import KubeletPluginClient, PluginProtocolError, PluginRegistrationError
from dra_node_agent.plugin import ClaimRef
from dra_node_agent.plugin.registration import RegistrationServicer

from .conftest import DRIVER

CLAIM_A = ClaimRef(namespace="ns", name="a", uid="uid-a")
CLAIM_B = ClaimRef(namespace="ns", name="b", uid="uid-b")


class SloppyDRA(dra_v1_pb2_grpc.DRAPluginServicer):
    """Answers only the first claim, and adds one nobody asked about when told to."""

    def __init__(self) -> None:
        self.add_stranger = False

    async def NodePrepareResources(
        self,
        request: dra_v1_pb2.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> dra_v1_pb2.NodePrepareResourcesResponse:
        response = dra_v1_pb2.NodePrepareResourcesResponse()
        response.claims[request.claims[0].uid].error = ""
        if self.add_stranger:
            for claim in request.claims[1:]:
                response.claims[claim.uid].error = ""
            response.claims["uid-stranger"].error = ""
        return response

    async def NodeUnprepareResources(
        self,
        request: dra_v1_pb2.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        return dra_v1_pb2.NodeUnprepareResourcesResponse()


class HandRolledPlugin:
    def __init__(self, *, root: Path, versions: tuple[str, ...], endpoint_on_registration: bool) -> None:
        self.registration_socket = root / "reg.sock"
        self.dra = SloppyDRA()
        endpoint = "" if endpoint_on_registration else str(root / "dra.sock")
        self.registration = RegistrationServicer(
            info=PluginInfo(type="DRAPlugin", name=DRIVER, endpoint=endpoint, supported_versions=versions)
        )
        self.servers: list[grpc.aio.Server] = []
        self.root = root
        self.endpoint_on_registration = endpoint_on_registration

    async def start(self) -> None:
        registration = grpc.aio.server()
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(self.registration, registration)
        dra = registration if self.endpoint_on_registration else grpc.aio.server()
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(self.dra, dra)
        registration.add_insecure_port(f"unix:{self.registration_socket}")
        self.servers.append(registration)
        if dra is not registration:
            dra.add_insecure_port(f"unix:{self.root / 'dra.sock'}")
            self.servers.append(dra)
        for server in self.servers:
            await server.start()

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop(None)


@pytest.fixture
async def sloppy(socket_root: Path) -> AsyncIterator[HandRolledPlugin]:
    plugin = HandRolledPlugin(root=socket_root, versions=("v1.DRAPlugin",), endpoint_on_registration=True)
    await plugin.start()
    try:
        yield plugin
    finally:
        await plugin.stop()


async def test_empty_endpoint_means_the_registration_socket(sloppy: HandRolledPlugin) -> None:
    client = await KubeletPluginClient.register(sloppy.registration_socket)
    try:
        assert client.endpoint == sloppy.registration_socket
        assert not client.health_advertised
    finally:
        await client.close()


async def test_a_skipped_claim_fails_the_call_like_in_kubelet(sloppy: HandRolledPlugin) -> None:
    client = await KubeletPluginClient.register(sloppy.registration_socket)
    try:
        with pytest.raises(
            PluginProtocolError, match=r"NodePrepareResources: plugin gpu\.nvidia\.com skipped 1"
        ):
            await client.prepare([CLAIM_A, CLAIM_B])
        with pytest.raises(PluginProtocolError, match=r"NodeUnprepareResources: .* skipped 2 claims"):
            await client.unprepare([CLAIM_A, CLAIM_B])
        sloppy.dra.add_stranger = True
        with pytest.raises(PluginProtocolError, match=r"returned unrequested claims: \['uid-stranger'\]"):
            await client.prepare([CLAIM_A, CLAIM_B])
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("versions", "wanted", "chosen"),
    [
        (("v1beta1.DRAPlugin", "v1.DRAPlugin"), None, "v1beta1"),
        (("v1alpha1.DRAResourceHealth", "v1.DRAPlugin"), None, "v1"),
        (("v1.DRAPlugin", "v1beta1.DRAPlugin"), "v1beta1", "v1beta1"),
    ],
)
async def test_the_first_known_service_is_chosen(
    socket_root: Path, versions: tuple[str, ...], wanted: DRAVersion | None, chosen: str
) -> None:
    plugin = HandRolledPlugin(root=socket_root, versions=versions, endpoint_on_registration=False)
    await plugin.start()
    try:
        client = await KubeletPluginClient.register(
            plugin.registration_socket,
            version=wanted,
        )
        await client.close()
    finally:
        await plugin.stop()
    assert client.version == chosen
    assert plugin.registration.registered


@pytest.mark.parametrize(
    ("versions", "health"),
    [
        # A 1.37 kubelet takes the newest health service advertised, wherever it is in the list.
        (("v1.DRAPlugin", "v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"), "v1"),
        (("v1.DRAPlugin", "v1alpha1.DRAResourceHealth"), "v1alpha1"),
        (("v1.DRAPlugin", "v1.DRAResourceHealth"), "v1"),
        (("v1.DRAPlugin", "v2.DRAResourceHealth"), None),
    ],
)
async def test_the_newest_advertised_health_service_is_chosen(
    socket_root: Path, versions: tuple[str, ...], health: str | None
) -> None:
    plugin = HandRolledPlugin(root=socket_root, versions=versions, endpoint_on_registration=False)
    await plugin.start()
    try:
        client = await KubeletPluginClient.register(plugin.registration_socket)
        await client.close()
    finally:
        await plugin.stop()
    assert client.health_version == health
    assert client.health_advertised is (health is not None)


@pytest.mark.parametrize(
    ("versions", "wanted", "message"),
    [
        ((), None, "name no DRAPlugin service"),
        (("v1alpha4.DRAPlugin",), None, "name no DRAPlugin service"),
        (("v1.DRAPlugin",), "v1beta1", "lack the v1beta1 DRAPlugin"),
    ],
)
async def test_no_usable_service_is_a_rejection_the_plugin_hears(
    socket_root: Path, versions: tuple[str, ...], wanted: DRAVersion | None, message: str
) -> None:
    plugin = HandRolledPlugin(root=socket_root, versions=versions, endpoint_on_registration=False)
    await plugin.start()
    try:
        with pytest.raises(PluginRegistrationError, match=message):
            await KubeletPluginClient.register(plugin.registration_socket, version=wanted)
    finally:
        await plugin.stop()
    assert plugin.registration.status_received.is_set()
    assert not plugin.registration.registered
    assert message in plugin.registration.error
