"""Start and stop one driver's kubelet plugin: the DRA socket (v1, v1beta1, health) and registration."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import TracebackType

import grpc

from dra_api.kubeletapi import (
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2_grpc,
    pluginregistration_v1_pb2_grpc,
)
from dra_api.kubeletapi.model import (
    DRA_PLUGIN_TYPE,
    DRA_V1_SERVICE,
    DRA_V1BETA1_SERVICE,
    HEALTH_SERVICE_VERSIONS,
    PluginInfo,
)
from dra_api.kubeletapi.socketpaths import PluginPaths, plugin_paths
from dra_node_agent.plugin import sockets
from dra_node_agent.plugin.dra_service import ClaimService, DRAPluginV1beta1Servicer, DRAPluginV1Servicer
from dra_node_agent.plugin.handler import DRAHandler, HealthSource
from dra_node_agent.plugin.health_service import HealthServicer, HealthServicerV1alpha1, HealthStreams
from dra_node_agent.plugin.registration import RegistrationServicer

logger = logging.getLogger(__name__)

DEFAULT_GRACE_PERIOD = 5.0


def supported_versions(*, health: bool) -> tuple[str, ...]:
    """Services advertised to kubelet, newest first: kubelet takes the first DRA entry it knows, and
    a 1.37 kubelet the newest health service (1.34 to 1.36 know v1alpha1 only and skip v1)."""
    services = (DRA_V1_SERVICE, DRA_V1BETA1_SERVICE)
    return (*services, *HEALTH_SERVICE_VERSIONS) if health else services


class RunningPlugin:
    """A serving plugin. ``stop()`` de-registers first (registration socket), then stops the DRA server."""

    def __init__(
        self,
        *,
        driver: str,
        paths: PluginPaths,
        info: PluginInfo,
        dra_server: grpc.aio.Server,
        dra_inode: int,
        registration_server: grpc.aio.Server,
        registration_inode: int,
        registration: RegistrationServicer,
        service: ClaimService,
        stopping: asyncio.Event,
        grace_period: float,
    ) -> None:
        self.driver = driver
        self.paths = paths
        self.info = info
        self._dra_server = dra_server
        self._dra_inode = dra_inode
        self._registration_server = registration_server
        self._registration_inode = registration_inode
        self._registration = registration
        self._service = service
        self._stopping = stopping
        self._grace_period = grace_period
        self._stopped = False

    @property
    def registration_socket(self) -> Path:
        return self.paths.registration_socket

    @property
    def dra_socket(self) -> Path:
        return self.paths.dra_socket

    @property
    def abandoned_calls(self) -> int:
        """Handler calls still running after kubelet gave up on their RPC (they run to completion)."""
        return self._service.abandoned_calls

    @property
    def registered(self) -> bool:
        """Whether kubelet's last NotifyRegistrationStatus accepted the plugin."""
        return self._registration.registered

    @property
    def registration_error(self) -> str:
        return self._registration.error

    async def wait_registration_status(self) -> bool:
        """Wait for kubelet's first NotifyRegistrationStatus; return whether it registered the plugin."""
        await self._registration.status_received.wait()
        return self._registration.registered

    async def stop(self, *, grace: float | None = None) -> None:
        """Stop serving and remove both sockets; in-flight calls get ``grace`` seconds. Idempotent.

        Each step waits up to ``grace``: the registration server, the DRA server, then handler calls
        that outlived a cancelled RPC.
        """
        if self._stopped:
            return
        self._stopped = True
        grace = self._grace_period if grace is None else grace
        self._stopping.set()  # ends the health streams now instead of after the grace period
        # Removing the registration socket is what de-registers the plugin in kubelet.
        await asyncio.to_thread(
            sockets.remove_socket, self.paths.registration_socket, inode=self._registration_inode
        )
        await self._registration_server.stop(grace)
        await self._dra_server.stop(grace)
        await asyncio.to_thread(sockets.remove_socket, self.paths.dra_socket, inode=self._dra_inode)
        # Handler calls whose RPC was cancelled still run; let them finish within the same grace.
        await self._service.drain(grace=grace)
        logger.info("stopped kubelet plugin of driver %s", self.driver)

    async def __aenter__(self) -> RunningPlugin:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def _listen(*, server: grpc.aio.Server, path: Path) -> int:
    """Start ``server`` on a unix socket, published at ``path`` once it is locked down; return its inode."""
    staging = await asyncio.to_thread(sockets.staging_path, path)
    server.add_insecure_port(f"unix://{staging}")
    await server.start()
    try:
        return await asyncio.to_thread(sockets.publish_socket, staging=staging, path=path)
    except BaseException:
        await server.stop(None)
        await asyncio.to_thread(sockets.remove_socket, staging, inode=None)
        raise


async def serve_plugin(
    *,
    driver: str,
    handler: DRAHandler,
    health: HealthSource | None = None,
    registry_dir: str | Path = sockets.DEFAULT_REGISTRY_DIR,
    plugins_dir: str | Path = sockets.DEFAULT_PLUGINS_DIR,
    instance: str | None = None,
    serialize: bool = True,
    grace_period: float = DEFAULT_GRACE_PERIOD,
) -> RunningPlugin:
    """Serve the kubelet plugin of one driver and return once kubelet can find it.

    The DRA socket ``<plugins_dir>/<driver>/dra.sock`` serves DRA v1 and v1beta1 (and health v1
    and v1alpha1 when ``health`` is given); the registration socket
    ``<registry_dir>/<driver>-reg.sock`` is created last, since its appearance is what makes kubelet
    connect. ``instance`` (a pod UID) switches to per-instance socket names for rolling updates.
    Stale files at either path are removed first.
    """
    paths = plugin_paths(
        driver=driver, registry_dir=Path(registry_dir), plugins_dir=Path(plugins_dir), instance=instance
    )
    await asyncio.to_thread(sockets.make_directory, paths.plugin_dir, force_mode=True)
    await asyncio.to_thread(sockets.make_directory, paths.registration_socket.parent, force_mode=False)
    await asyncio.to_thread(sockets.remove_dead_siblings, driver=driver, paths=paths)

    stopping = asyncio.Event()
    service = ClaimService(driver=driver, handler=handler, serialize=serialize)
    dra_server = grpc.aio.server()
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DRAPluginV1Servicer(service=service), dra_server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
        DRAPluginV1beta1Servicer(service=service), dra_server
    )
    if health is not None:
        streams = HealthStreams(driver=driver, source=health, stopping=stopping)
        health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            HealthServicer(streams=streams), dra_server
        )
        health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            HealthServicerV1alpha1(streams=streams), dra_server
        )
    dra_inode = await _listen(server=dra_server, path=paths.dra_socket)

    info = PluginInfo(
        type=DRA_PLUGIN_TYPE,
        name=driver,
        endpoint=str(paths.dra_socket),
        supported_versions=supported_versions(health=health is not None),
    )
    registration = RegistrationServicer(info=info)
    registration_server = grpc.aio.server()
    pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(registration, registration_server)
    try:
        registration_inode = await _listen(server=registration_server, path=paths.registration_socket)
    except BaseException:
        await dra_server.stop(None)
        await asyncio.to_thread(sockets.remove_socket, paths.dra_socket, inode=dra_inode)
        raise
    logger.info(
        "serving kubelet plugin of driver %s: registration %s, DRA %s (%s)",
        driver,
        paths.registration_socket,
        paths.dra_socket,
        ", ".join(info.supported_versions),
    )
    return RunningPlugin(
        driver=driver,
        paths=paths,
        info=info,
        dra_server=dra_server,
        dra_inode=dra_inode,
        registration_server=registration_server,
        registration_inode=registration_inode,
        registration=registration,
        service=service,
        stopping=stopping,
        grace_period=grace_period,
    )
