"""Translation between the protobuf messages of the kubelet plugin protocols and ``model`` dataclasses.

DRA v1 and v1beta1 messages are field-for-field identical except ``Device.share_id`` (v1 only), so
each function accepts either version's message; builders take the message to fill, which keeps the
concrete type the caller's gRPC signature needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from dra_api.kubeletapi import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    health_v1_pb2,
    health_v1alpha1_pb2,
    pluginregistration_v1_pb2,
)
from dra_api.kubeletapi.model import (
    ClaimRef,
    DeviceHealth,
    HealthStatus,
    PluginInfo,
    PreparedDevice,
    PrepareResult,
)

PrepareRequest = dra_v1_pb2.NodePrepareResourcesRequest | dra_v1beta1_pb2.NodePrepareResourcesRequest
PrepareResponse = dra_v1_pb2.NodePrepareResourcesResponse | dra_v1beta1_pb2.NodePrepareResourcesResponse
UnprepareRequest = dra_v1_pb2.NodeUnprepareResourcesRequest | dra_v1beta1_pb2.NodeUnprepareResourcesRequest
UnprepareResponse = dra_v1_pb2.NodeUnprepareResourcesResponse | dra_v1beta1_pb2.NodeUnprepareResourcesResponse
ClaimResponse = dra_v1_pb2.NodePrepareResourceResponse | dra_v1beta1_pb2.NodePrepareResourceResponse

HealthResponse = health_v1_pb2.NodeWatchResourcesResponse | health_v1alpha1_pb2.NodeWatchResourcesResponse

_HEALTH_TO_PROTO: dict[HealthStatus, health_v1_pb2.HealthStatus.ValueType] = {
    HealthStatus.UNKNOWN: health_v1_pb2.UNKNOWN,
    HealthStatus.HEALTHY: health_v1_pb2.HEALTHY,
    HealthStatus.UNHEALTHY: health_v1_pb2.UNHEALTHY,
}
# Both health versions number the states alike (a unit test compares the two protos).
_HEALTH_FROM_PROTO: dict[int, HealthStatus] = {value: key for key, value in _HEALTH_TO_PROTO.items()}


def claims_from_request(request: PrepareRequest | UnprepareRequest) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


def fill_claims(request: PrepareRequest | UnprepareRequest, claims: Iterable[ClaimRef]) -> None:
    for claim in claims:
        request.claims.add(namespace=claim.namespace, name=claim.name, uid=claim.uid)


def fill_prepare_entry(entry: ClaimResponse, result: PrepareResult) -> None:
    """Write one claim's result; a v1beta1 entry silently has no room for ``share_id``."""
    entry.error = result.error
    for device in result.devices:
        added = entry.devices.add(
            request_names=list(device.requests),
            pool_name=device.pool,
            device_name=device.device,
            cdi_device_ids=list(device.cdi_device_ids),
        )
        if device.share_id is not None and isinstance(added, dra_v1_pb2.Device):
            added.share_id = device.share_id


def fill_prepare_response(response: PrepareResponse, results: Mapping[str, PrepareResult]) -> None:
    for uid, result in results.items():
        fill_prepare_entry(response.claims[uid], result)


def prepare_results_from_response(response: PrepareResponse) -> dict[str, PrepareResult]:
    results: dict[str, PrepareResult] = {}
    for uid, entry in response.claims.items():
        devices = []
        for device in entry.devices:
            share_id = None
            if isinstance(device, dra_v1_pb2.Device) and device.HasField("share_id"):
                share_id = device.share_id
            devices.append(
                PreparedDevice(
                    requests=tuple(device.request_names),
                    pool=device.pool_name,
                    device=device.device_name,
                    cdi_device_ids=tuple(device.cdi_device_ids),
                    share_id=share_id,
                )
            )
        results[uid] = PrepareResult(devices=tuple(devices), error=entry.error)
    return results


def fill_unprepare_response(response: UnprepareResponse, errors: Mapping[str, str]) -> None:
    for uid, error in errors.items():
        response.claims[uid].error = error


def unprepare_errors_from_response(response: UnprepareResponse) -> dict[str, str]:
    return {uid: entry.error for uid, entry in response.claims.items()}


def health_to_proto(devices: Sequence[DeviceHealth]) -> health_v1_pb2.NodeWatchResourcesResponse:
    """The report as the v1 health service sends it."""
    response = health_v1_pb2.NodeWatchResourcesResponse()
    for item in devices:
        response.devices.add(
            device=health_v1_pb2.DeviceIdentifier(pool_name=item.pool, device_name=item.device),
            health=_HEALTH_TO_PROTO[HealthStatus(item.health)],
            last_updated_time=int(item.last_updated),
            health_check_timeout_seconds=item.health_check_timeout or 0,
            message=item.message,
        )
    return response


def health_to_v1alpha1(
    response: health_v1_pb2.NodeWatchResourcesResponse,
) -> health_v1alpha1_pb2.NodeWatchResourcesResponse:
    """The same report for the v1alpha1 service. The two versions' messages are field for field
    the same (upstream copied v1alpha1 into v1), so their encodings are too."""
    return health_v1alpha1_pb2.NodeWatchResourcesResponse.FromString(response.SerializeToString())


def health_from_proto(response: HealthResponse) -> list[DeviceHealth]:
    return [
        DeviceHealth(
            pool=item.device.pool_name,
            device=item.device.device_name,
            # Values unknown to this proto revision read as Unknown, as kubelet treats them.
            health=_HEALTH_FROM_PROTO.get(item.health, HealthStatus.UNKNOWN),
            last_updated=item.last_updated_time,
            health_check_timeout=item.health_check_timeout_seconds
            if item.health_check_timeout_seconds > 0
            else None,
            message=item.message,
        )
        for item in response.devices
    ]


def plugin_info_to_proto(info: PluginInfo) -> pluginregistration_v1_pb2.PluginInfo:
    return pluginregistration_v1_pb2.PluginInfo(
        type=info.type,
        name=info.name,
        endpoint=info.endpoint,
        supported_versions=list(info.supported_versions),
    )


def plugin_info_from_proto(message: pluginregistration_v1_pb2.PluginInfo) -> PluginInfo:
    return PluginInfo(
        type=message.type,
        name=message.name,
        endpoint=message.endpoint,
        supported_versions=tuple(message.supported_versions),
    )
