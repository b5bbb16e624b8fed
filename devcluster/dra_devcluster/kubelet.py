"""A stand-in for kubelet's side of the DRA plugin protocols, over the plugin's real unix sockets.

Tests and the demo have no kubelet, so this client does what kubelet does with a DRA plugin: it finds
the registration socket in the plugins_registry folder, asks GetInfo, picks the first advertised DRA
service it supports (v1 or v1beta1, or the one asked for), reports NotifyRegistrationStatus, then calls
NodePrepareResources / NodeUnprepareResources on the advertised endpoint and reads the health stream.
Everything it returns is a plain dataclass from ``dra_api.kubeletapi.model``; every call has a timeout.
Like kubelet, it treats a response that skips a requested claim, or names one it did not ask about, as
a failed call.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

import grpc

from dra_api.kubeletapi import (
    convert,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from dra_api.kubeletapi.model import (
    DRA_PLUGIN_TYPE,
    DRA_SERVICE_VERSIONS,
    HEALTH_SERVICE_VERSIONS,
    ClaimRef,
    DeviceHealth,
    DRAVersion,
    HealthVersion,
    PluginInfo,
    PrepareResult,
)

logger = logging.getLogger(__name__)

# kubelet's own timeouts: GetInfo during registration, and every DRA call.
GET_INFO_TIMEOUT: Final = 1.0
CALL_TIMEOUT: Final = 45.0
HEALTH_IDLE_TIMEOUT: Final = 60.0


class KubeletClientError(Exception):
    """A plugin misbehaved or could not be reached, as kubelet would see it."""


class PluginRegistrationError(KubeletClientError):
    """The registration handshake failed; the plugin was told so when it got that far."""


class PluginCallError(KubeletClientError):
    """A gRPC call failed as a whole (kubelet then ignores the response and retries later)."""

    def __init__(self, *, method: str, code: str, details: str) -> None:
        super().__init__(f"{method} failed with {code}: {details}")
        self.method = method
        self.code = code
        self.details = details


class PluginProtocolError(KubeletClientError):
    """A response broke the protocol, e.g. it skipped a claim of the request."""


@dataclass(frozen=True)
class HealthStreamEnded:
    """Returned by ``HealthStream.next`` when the plugin closed the stream; ``code`` is the gRPC status."""

    code: str
    details: str


def _channel(socket_path: str | Path) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"unix:{socket_path}")


def _call_error(method: str, exc: grpc.aio.AioRpcError) -> PluginCallError:
    return PluginCallError(method=method, code=exc.code().name, details=exc.details() or "")


def _list_registration_sockets(registry_dir: Path) -> list[Path]:
    found: list[Path] = []
    for root, dirs, files in os.walk(registry_dir):
        # kubelet ignores every entry whose name starts with a dot, folders included.
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            path = Path(root) / name
            if not name.startswith(".") and stat.S_ISSOCK(path.lstat().st_mode):
                found.append(path)
    # Newest last: with several sockets per driver (rolling update) kubelet prefers the latest.
    return sorted(found, key=lambda p: (p.lstat().st_mtime_ns, str(p)))


async def find_registration_sockets(registry_dir: str | Path) -> list[Path]:
    """Unix sockets under ``registry_dir`` that kubelet would consider, oldest first."""
    return await asyncio.to_thread(_list_registration_sockets, Path(registry_dir))


async def get_plugin_info(
    registration_socket: str | Path, *, deadline: float = GET_INFO_TIMEOUT
) -> PluginInfo:
    """GetInfo on a registration socket, without registering anything; ``deadline`` in seconds."""
    async with _channel(registration_socket) as channel:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
        try:
            reply = await stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=deadline)
        except grpc.aio.AioRpcError as exc:
            raise _call_error(f"GetInfo on {registration_socket}", exc) from exc
    return convert.plugin_info_from_proto(reply)


def _choose_version(info: PluginInfo, *, wanted: DRAVersion | None) -> DRAVersion:
    if wanted is not None:
        for service, version in DRA_SERVICE_VERSIONS.items():
            if version == wanted and service in info.supported_versions:
                return version
        raise PluginRegistrationError(
            f"DRA plugin {info.name}: supported_versions {list(info.supported_versions)} "
            f"lack the {wanted} DRAPlugin"
        )
    for service in info.supported_versions:
        if service in DRA_SERVICE_VERSIONS:
            return DRA_SERVICE_VERSIONS[service]
    raise PluginRegistrationError(
        f"DRA plugin {info.name}: supported_versions {list(info.supported_versions)} "
        f"name no DRAPlugin service this kubelet knows ({', '.join(DRA_SERVICE_VERSIONS)})"
    )


def _check_info(info: PluginInfo, *, driver: str | None) -> None:
    if info.type != DRA_PLUGIN_TYPE:
        raise PluginRegistrationError(f"plugin {info.name!r}: type is {info.type!r}, not {DRA_PLUGIN_TYPE!r}")
    if not info.name:
        raise PluginRegistrationError("DRA plugin: name is empty")
    if driver is not None and info.name != driver:
        raise PluginRegistrationError(
            f"DRA plugin {info.name}: name differs from the expected driver {driver}"
        )


async def _notify(
    stub: pluginregistration_v1_pb2_grpc.RegistrationAsyncStub, *, error: str, deadline: float
) -> None:
    status = pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=not error, error=error)
    try:
        await stub.NotifyRegistrationStatus(status, timeout=deadline)
    except grpc.aio.AioRpcError as exc:
        raise _call_error("NotifyRegistrationStatus", exc) from exc


class HealthStream:
    """One open NodeWatchResources stream; use as an async context manager so it is always cancelled."""

    def __init__(
        self,
        *,
        call: (
            grpc.aio.UnaryStreamCall[
                health_v1_pb2.NodeWatchResourcesRequest, health_v1_pb2.NodeWatchResourcesResponse
            ]
            | grpc.aio.UnaryStreamCall[
                health_v1alpha1_pb2.NodeWatchResourcesRequest, health_v1alpha1_pb2.NodeWatchResourcesResponse
            ]
        ),
    ):
        self._call = call

    async def next(
        self, *, idle_timeout: float = HEALTH_IDLE_TIMEOUT
    ) -> list[DeviceHealth] | HealthStreamEnded:
        """The next complete device report, or how the stream ended; raises if none comes in time."""
        try:
            reply = await asyncio.wait_for(self._call.read(), idle_timeout)
        except TimeoutError as exc:
            raise PluginCallError(
                method="NodeWatchResources",
                code="DEADLINE_EXCEEDED",
                details=f"no report within {idle_timeout} s",
            ) from exc
        except grpc.aio.AioRpcError as exc:
            return HealthStreamEnded(code=exc.code().name, details=exc.details() or "")
        if isinstance(
            reply, health_v1_pb2.NodeWatchResourcesResponse | health_v1alpha1_pb2.NodeWatchResourcesResponse
        ):
            return convert.health_from_proto(reply)
        # Anything else is grpc.aio.EOF: the plugin ended the stream.
        code = await self._call.code()
        return HealthStreamEnded(code=code.name, details=await self._call.details() or "")

    def cancel(self) -> None:
        self._call.cancel()

    async def __aenter__(self) -> HealthStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cancel()


class KubeletPluginClient:
    """A registered DRA plugin, called the way kubelet calls it. Create with ``register``."""

    def __init__(
        self,
        *,
        info: PluginInfo,
        registration_socket: Path,
        version: DRAVersion,
        call_timeout: float,
    ) -> None:
        self.info = info
        self.registration_socket = registration_socket
        self.version: DRAVersion = version
        self.call_timeout = call_timeout
        # An empty endpoint means the registration socket serves DRA too.
        self.endpoint = Path(info.endpoint) if info.endpoint else registration_socket
        self._channel = _channel(self.endpoint)
        self._v1 = dra_v1_pb2_grpc.DRAPluginStub(self._channel)
        self._v1beta1 = dra_v1beta1_pb2_grpc.DRAPluginStub(self._channel)
        self._health_v1 = health_v1_pb2_grpc.DRAResourceHealthStub(self._channel)
        self._health_v1alpha1 = health_v1alpha1_pb2_grpc.DRAResourceHealthStub(self._channel)

    @classmethod
    async def register(
        cls,
        registration_socket: str | Path,
        *,
        driver: str | None = None,
        version: DRAVersion | None = None,
        info_timeout: float = GET_INFO_TIMEOUT,
        call_timeout: float = CALL_TIMEOUT,
    ) -> KubeletPluginClient:
        """Do kubelet's registration handshake on ``registration_socket``.

        ``driver`` checks the advertised name; ``version`` forces v1 or v1beta1, otherwise the first
        DRA service in the plugin's list wins, as in kubelet. The plugin hears the outcome either way.
        """
        path = Path(registration_socket)
        async with _channel(path) as channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            try:
                reply = await stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=info_timeout)
            except grpc.aio.AioRpcError as exc:
                raise _call_error(f"GetInfo on {path}", exc) from exc
            info = convert.plugin_info_from_proto(reply)
            try:
                _check_info(info, driver=driver)
                chosen = _choose_version(info, wanted=version)
            except PluginRegistrationError as exc:
                await _notify(stub, error=str(exc), deadline=info_timeout)
                raise
            await _notify(stub, error="", deadline=info_timeout)
        logger.info("registered DRA plugin %s at %s using %s", info.name, info.endpoint or path, chosen)
        return cls(info=info, registration_socket=path, version=chosen, call_timeout=call_timeout)

    @classmethod
    async def register_driver(
        cls,
        registry_dir: str | Path,
        *,
        driver: str,
        version: DRAVersion | None = None,
        info_timeout: float = GET_INFO_TIMEOUT,
        call_timeout: float = CALL_TIMEOUT,
    ) -> KubeletPluginClient:
        """Find ``driver``'s newest registration socket under ``registry_dir`` and register it."""
        candidates: list[Path] = []
        for path in await find_registration_sockets(registry_dir):
            try:
                info = await get_plugin_info(path, deadline=info_timeout)
            except PluginCallError as exc:
                logger.info("skipping registration socket %s: %s", path, exc)
                continue
            if info.name == driver:
                candidates.append(path)
        if not candidates:
            raise PluginRegistrationError(
                f"no registration socket under {registry_dir} answers for driver {driver}"
            )
        return await cls.register(
            candidates[-1],
            driver=driver,
            version=version,
            info_timeout=info_timeout,
            call_timeout=call_timeout,
        )

    @property
    def health_advertised(self) -> bool:
        return self.health_version is not None

    @property
    def health_version(self) -> HealthVersion | None:
        """The health service a 1.37 kubelet would use: the newest the plugin advertises."""
        advertised = self.info.supported_versions
        return next((v for service, v in HEALTH_SERVICE_VERSIONS.items() if service in advertised), None)

    def _check_entries(self, *, method: str, claims: Sequence[ClaimRef], returned: set[str]) -> None:
        asked = {claim.uid for claim in claims}
        skipped = sorted(asked - returned)
        if skipped:
            raise PluginProtocolError(
                f"{method}: plugin {self.info.name} skipped {len(skipped)} claims: {skipped}"
            )
        unknown = sorted(returned - asked)
        if unknown:
            raise PluginProtocolError(
                f"{method}: plugin {self.info.name} returned unrequested claims: {unknown}"
            )

    async def prepare(
        self, claims: Sequence[ClaimRef], *, version: DRAVersion | None = None, deadline: float | None = None
    ) -> dict[str, PrepareResult]:
        """NodePrepareResources; results keyed by claim UID, per-claim failures in ``error``."""
        use = version or self.version
        seconds = self.call_timeout if deadline is None else deadline
        response: convert.PrepareResponse
        try:
            if use == "v1":
                request_v1 = dra_v1_pb2.NodePrepareResourcesRequest()
                convert.fill_claims(request_v1, claims)
                response = await self._v1.NodePrepareResources(request_v1, timeout=seconds)
            else:
                request_v1beta1 = dra_v1beta1_pb2.NodePrepareResourcesRequest()
                convert.fill_claims(request_v1beta1, claims)
                response = await self._v1beta1.NodePrepareResources(request_v1beta1, timeout=seconds)
        except grpc.aio.AioRpcError as exc:
            raise _call_error(f"{use} NodePrepareResources", exc) from exc
        results = convert.prepare_results_from_response(response)
        self._check_entries(method="NodePrepareResources", claims=claims, returned=set(results))
        return results

    async def unprepare(
        self, claims: Sequence[ClaimRef], *, version: DRAVersion | None = None, deadline: float | None = None
    ) -> dict[str, str]:
        """NodeUnprepareResources; claim UID -> error, "" where the claim was unprepared."""
        use = version or self.version
        seconds = self.call_timeout if deadline is None else deadline
        response: convert.UnprepareResponse
        try:
            if use == "v1":
                request_v1 = dra_v1_pb2.NodeUnprepareResourcesRequest()
                convert.fill_claims(request_v1, claims)
                response = await self._v1.NodeUnprepareResources(request_v1, timeout=seconds)
            else:
                request_v1beta1 = dra_v1beta1_pb2.NodeUnprepareResourcesRequest()
                convert.fill_claims(request_v1beta1, claims)
                response = await self._v1beta1.NodeUnprepareResources(request_v1beta1, timeout=seconds)
        except grpc.aio.AioRpcError as exc:
            raise _call_error(f"{use} NodeUnprepareResources", exc) from exc
        errors = convert.unprepare_errors_from_response(response)
        self._check_entries(method="NodeUnprepareResources", claims=claims, returned=set(errors))
        return errors

    def watch_health(
        self, *, timeout: float | None = None, version: HealthVersion | None = None
    ) -> HealthStream:
        """Open NodeWatchResources; ``timeout`` bounds the whole stream (None: until cancelled).
        ``version`` picks the service (as kubelets before 1.37 ask for v1alpha1); by default the
        newest advertised one, else v1."""
        if (version or self.health_version or "v1") == "v1":
            return HealthStream(
                call=self._health_v1.NodeWatchResources(
                    health_v1_pb2.NodeWatchResourcesRequest(), timeout=timeout
                )
            )
        return HealthStream(
            call=self._health_v1alpha1.NodeWatchResources(
                health_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=timeout
            )
        )

    async def health_reports(
        self, *, idle_timeout: float = HEALTH_IDLE_TIMEOUT
    ) -> AsyncIterator[list[DeviceHealth]]:
        """Iterate health reports until the stream ends; raises if the plugin stays silent too long.

        Breaking out early leaves the stream open until the generator is closed: wrap it in
        ``contextlib.aclosing`` for that.
        """
        async with self.watch_health() as stream:
            while True:
                report = await stream.next(idle_timeout=idle_timeout)
                if isinstance(report, HealthStreamEnded):
                    return
                yield report

    async def close(self) -> None:
        await self._channel.close(None)

    async def __aenter__(self) -> KubeletPluginClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
