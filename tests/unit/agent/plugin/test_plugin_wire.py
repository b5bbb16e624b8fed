"""Field numbers, packages and method paths checked against hand-encoded protobuf bytes.

The expected bytes are built here from the upstream field numbers, independently of the generated
code, so a wrong number or package in our .proto files fails these tests.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from dra_api.kubeletapi import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    health_v1_pb2,
    health_v1alpha1_pb2,
    pluginregistration_v1_pb2,
)
from dra_node_agent.plugin import PreparedDevice, RunningPlugin

from .conftest import DRIVER
from .drivers import RecordingHandler

VARINT, LEN = 0, 2


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _len(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | LEN) + _varint(len(payload)) + payload


def _str(number: int, text: str) -> bytes:
    return _len(number, text.encode())


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3 | VARINT) + _varint(value)


def _decode(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs: ints for varints, bytes for length-delimited fields."""
    fields: list[tuple[int, int | bytes]] = []
    pos = 0

    def read_varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return result

    while pos < len(data):
        key = read_varint()
        number, wire_type = key >> 3, key & 7
        if wire_type == VARINT:
            fields.append((number, read_varint()))
        elif wire_type == LEN:
            size = read_varint()
            fields.append((number, data[pos : pos + size]))
            pos += size
        else:
            raise AssertionError(f"unexpected wire type {wire_type} for field {number}")
    return fields


def _claim_bytes(namespace: str, uid: str, name: str) -> bytes:
    return _str(1, namespace) + _str(2, uid) + _str(3, name)


def _device_bytes(
    *, requests: list[str], pool: str, device: str, cdi: list[str], share_id: str | None
) -> bytes:
    out = b"".join(_str(1, r) for r in requests) + _str(2, pool) + _str(3, device)
    out += b"".join(_str(4, c) for c in cdi)
    if share_id is not None:
        out += _str(5, share_id)
    return out


@pytest.mark.parametrize("module", [dra_v1_pb2, dra_v1beta1_pb2])
def test_claim_and_requests_use_upstream_field_numbers(
    module: ModuleType,
) -> None:
    claim = _claim_bytes("ns", "uid-1", "claim-1")
    request = _len(1, claim) + _len(1, _claim_bytes("ns2", "uid-2", "claim-2"))

    parsed = module.NodePrepareResourcesRequest.FromString(request)
    unprepare = module.NodeUnprepareResourcesRequest.FromString(request)

    assert [(c.namespace, c.uid, c.name) for c in parsed.claims] == [
        ("ns", "uid-1", "claim-1"),
        ("ns2", "uid-2", "claim-2"),
    ]
    assert [c.uid for c in unprepare.claims] == ["uid-1", "uid-2"]
    assert module.Claim(namespace="ns", uid="uid-1", name="claim-1").SerializeToString() == claim


def test_v1_prepare_response_uses_upstream_field_numbers() -> None:
    device = _device_bytes(requests=["gpu"], pool="pool-a", device="gpu-0", cdi=["v.com/c=x"], share_id="s-1")
    entry_value = _len(1, device) + _str(2, "")
    wire = _len(1, _str(1, "uid-1") + _len(2, entry_value)) + _len(
        1, _str(1, "uid-2") + _len(2, _str(2, "claim uid-2 failed"))
    )

    parsed = dra_v1_pb2.NodePrepareResourcesResponse.FromString(wire)

    ok = parsed.claims["uid-1"]
    assert ok.error == ""
    assert [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids), d.share_id)
        for d in ok.devices
    ] == [(["gpu"], "pool-a", "gpu-0", ["v.com/c=x"], "s-1")]
    assert parsed.claims["uid-2"].error == "claim uid-2 failed"
    assert (
        dra_v1_pb2.Device(
            request_names=["gpu"],
            pool_name="pool-a",
            device_name="gpu-0",
            cdi_device_ids=["v.com/c=x"],
            share_id="s-1",
        ).SerializeToString()
        == device
    )


def test_v1beta1_device_has_no_share_id() -> None:
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    assert dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"].number == 5
    device = _device_bytes(requests=[], pool="p", device="d", cdi=["a.com/b=c"], share_id=None)
    assert (
        dra_v1beta1_pb2.Device(
            pool_name="p", device_name="d", cdi_device_ids=["a.com/b=c"]
        ).SerializeToString()
        == device
    )


@pytest.mark.parametrize("module", [dra_v1_pb2, dra_v1beta1_pb2])
def test_unprepare_response_uses_upstream_field_numbers(
    module: ModuleType,
) -> None:
    wire = _len(1, _str(1, "uid-1") + _len(2, b"")) + _len(1, _str(1, "uid-2") + _len(2, _str(1, "busy")))

    parsed = module.NodeUnprepareResourcesResponse.FromString(wire)

    assert {uid: entry.error for uid, entry in parsed.claims.items()} == {"uid-1": "", "uid-2": "busy"}


def test_registration_messages_use_upstream_field_numbers() -> None:
    info = (
        _str(1, "DRAPlugin")
        + _str(2, DRIVER)
        + _str(3, "/x/dra.sock")
        + _str(4, "v1.DRAPlugin")
        + _str(4, "b")
    )
    status = _int(1, 1) + _str(2, "why")

    parsed = pluginregistration_v1_pb2.PluginInfo.FromString(info)
    parsed_status = pluginregistration_v1_pb2.RegistrationStatus.FromString(status)

    assert (parsed.type, parsed.name, parsed.endpoint, list(parsed.supported_versions)) == (
        "DRAPlugin",
        DRIVER,
        "/x/dra.sock",
        ["v1.DRAPlugin", "b"],
    )
    assert (parsed_status.plugin_registered, parsed_status.error) == (True, "why")


@pytest.mark.parametrize("module", [health_v1_pb2, health_v1alpha1_pb2], ids=["v1", "v1alpha1"])
def test_health_messages_use_upstream_field_numbers(module: ModuleType) -> None:
    device = _len(1, _str(1, "pool-a") + _str(2, "gpu-1")) + _int(2, 2) + _int(3, 1_700_000_000)
    device += _int(4, 45) + _str(5, "XID 79")
    wire = _len(1, device)

    parsed = module.NodeWatchResourcesResponse.FromString(wire)

    (item,) = parsed.devices
    assert (item.device.pool_name, item.device.device_name) == ("pool-a", "gpu-1")
    assert item.health == module.UNHEALTHY
    assert (item.last_updated_time, item.health_check_timeout_seconds, item.message) == (
        1_700_000_000,
        45,
        "XID 79",
    )
    assert (module.UNKNOWN, module.HEALTHY, module.UNHEALTHY) == (0, 1, 2)


def _shape(descriptor: Any) -> list[tuple[str, int, int, bool, str]]:
    """A message's fields and, recursively, those of the messages it holds, without the package."""
    shape = []
    for field in descriptor.fields:
        inner = field.message_type or field.enum_type
        name = inner.full_name.split(".", 1)[1] if inner is not None else ""
        shape.append((field.name, field.number, field.type, field.is_repeated, name))
        if field.message_type is not None:
            shape += _shape(field.message_type)
    return shape


def test_the_two_health_versions_are_the_same_messages() -> None:
    # convert.health_to_v1alpha1 re-reads v1's encoding as v1alpha1: exact only while upstream's
    # two protos stay field for field alike.
    for message in ("NodeWatchResourcesRequest", "NodeWatchResourcesResponse", "DeviceHealth"):
        v1 = health_v1_pb2.DESCRIPTOR.message_types_by_name[message]
        v1alpha1 = health_v1alpha1_pb2.DESCRIPTOR.message_types_by_name[message]
        assert _shape(v1) == _shape(v1alpha1), message
    states = health_v1_pb2.DESCRIPTOR.enum_types_by_name["HealthStatus"].values
    assert [(v.name, v.number) for v in states] == [
        (v.name, v.number) for v in health_v1alpha1_pb2.DESCRIPTOR.enum_types_by_name["HealthStatus"].values
    ]


def test_services_have_the_upstream_full_names() -> None:
    def methods(module: ModuleType, service: str) -> list[str]:
        descriptor = module.DESCRIPTOR.services_by_name[service]
        return [f"/{descriptor.full_name}/{m.name}" for m in descriptor.methods]

    assert methods(dra_v1_pb2, "DRAPlugin") == [
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    ]
    assert methods(dra_v1beta1_pb2, "DRAPlugin") == [
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
    ]
    assert methods(pluginregistration_v1_pb2, "Registration") == [
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    ]
    assert methods(health_v1alpha1_pb2, "DRAResourceHealth") == [
        "/v1alpha1.DRAResourceHealth/NodeWatchResources"
    ]
    assert methods(health_v1_pb2, "DRAResourceHealth") == ["/v1.DRAResourceHealth/NodeWatchResources"]


async def _raw_call(socket_path: Path, method: str, request: bytes) -> bytes:
    async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
        # No serializers: the bytes go over the socket exactly as built here.
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        reply = await call(request, timeout=10)
    assert isinstance(reply, bytes)
    return reply


async def test_raw_get_info_bytes(plugin: RunningPlugin) -> None:
    reply = await _raw_call(plugin.registration_socket, "/pluginregistration.Registration/GetInfo", b"")

    assert _decode(reply) == [
        (1, b"DRAPlugin"),
        (2, DRIVER.encode()),
        (3, str(plugin.dra_socket).encode()),
        (4, b"v1.DRAPlugin"),
        (4, b"v1beta1.DRAPlugin"),
        (4, b"v1.DRAResourceHealth"),
        (4, b"v1alpha1.DRAResourceHealth"),
    ]


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_raw_prepare_bytes(plugin: RunningPlugin, handler: RecordingHandler, version: str) -> None:
    handler.devices["uid-1"] = (
        PreparedDevice(
            requests=("gpu",), pool="pool-a", device="gpu-0", cdi_device_ids=("v.com/c=x",), share_id="s"
        ),
    )
    handler.fail["uid-2"] = "nope"
    request = _len(1, _claim_bytes("ns", "uid-1", "one")) + _len(1, _claim_bytes("ns", "uid-2", "two"))

    reply = await _raw_call(
        plugin.dra_socket, f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources", request
    )

    entries = {}
    for number, value in _decode(reply):
        assert number == 1
        assert isinstance(value, bytes)
        entry = dict(_decode(value))
        assert isinstance(entry[1], bytes)
        assert isinstance(entry[2], bytes)
        entries[entry[1].decode()] = _decode(entry[2])
    share = [(5, b"s")] if version == "v1" else []
    device = [(1, b"gpu"), (2, b"pool-a"), (3, b"gpu-0"), (4, b"v.com/c=x"), *share]
    assert set(entries) == {"uid-1", "uid-2"}
    (device_field,) = entries["uid-1"]  # proto3 leaves the empty error off the wire
    assert device_field[0] == 1
    assert isinstance(device_field[1], bytes)
    assert _decode(device_field[1]) == device
    assert entries["uid-2"] == [(2, b"nope")]
    assert [c.uid for c in handler.prepared[0]] == ["uid-1", "uid-2"]
    assert [(c.namespace, c.name) for c in handler.prepared[0]] == [("ns", "one"), ("ns", "two")]


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_raw_unprepare_bytes(plugin: RunningPlugin, handler: RecordingHandler, version: str) -> None:
    handler.fail["uid-2"] = "still in use"
    request = _len(1, _claim_bytes("ns", "uid-1", "one")) + _len(1, _claim_bytes("ns", "uid-2", "two"))

    reply = await _raw_call(
        plugin.dra_socket, f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodeUnprepareResources", request
    )

    entries: dict[str, list[tuple[int, int | bytes]]] = {}
    for _, value in _decode(reply):
        assert isinstance(value, bytes)
        entry = dict(_decode(value))
        key, body = entry[1], entry.get(2, b"")
        assert isinstance(key, bytes)
        assert isinstance(body, bytes)
        entries[key.decode()] = _decode(body)
    assert entries == {"uid-1": [], "uid-2": [(1, b"still in use")]}
