"""NodePrepareResources / NodeUnprepareResources in both DRA versions, through the test kubelet."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import get_args

import pytest

from dra_api.kubeletapi.model import DRAVersion
from dra_devcluster.kubelet import KubeletPluginClient, PluginCallError
from dra_node_agent.plugin import ClaimRef, PreparedDevice, PrepareResult, serve_plugin
from dra_node_agent.plugin.dra_service import ClaimService

from .conftest import DRIVER
from .drivers import GatedHandler, RecordingHandler

VERSIONS: tuple[DRAVersion, ...] = get_args(DRAVersion)

CLAIM_A = ClaimRef(namespace="team-a", name="train", uid="uid-a")
CLAIM_B = ClaimRef(namespace="team-b", name="infer", uid="uid-b")
CLAIM_C = ClaimRef(namespace="team-c", name="batch", uid="uid-c")


def test_both_versions_are_covered() -> None:
    assert VERSIONS == ("v1", "v1beta1")


@pytest.mark.parametrize("version", VERSIONS)
async def test_prepare_returns_devices_per_claim(
    kubelet: KubeletPluginClient, handler: RecordingHandler, version: DRAVersion
) -> None:
    results = await kubelet.prepare([CLAIM_A, CLAIM_B], version=version)

    assert results == {
        "uid-a": PrepareResult(devices=(RecordingHandler.device_for(CLAIM_A),)),
        "uid-b": PrepareResult(devices=(RecordingHandler.device_for(CLAIM_B),)),
    }
    assert handler.prepared == [[CLAIM_A, CLAIM_B]]


@pytest.mark.parametrize("version", VERSIONS)
async def test_unprepare_answers_every_claim(
    kubelet: KubeletPluginClient, handler: RecordingHandler, version: DRAVersion
) -> None:
    errors = await kubelet.unprepare([CLAIM_A, CLAIM_B], version=version)

    assert errors == {"uid-a": "", "uid-b": ""}
    assert handler.unprepared == [[CLAIM_A, CLAIM_B]]


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_failing_claim_does_not_spoil_the_others(
    kubelet: KubeletPluginClient, handler: RecordingHandler, version: DRAVersion
) -> None:
    handler.fail["uid-b"] = "ResourceClaim team-b/infer: not allocated"

    results = await kubelet.prepare([CLAIM_A, CLAIM_B, CLAIM_C], version=version)
    errors = await kubelet.unprepare([CLAIM_A, CLAIM_B, CLAIM_C], version=version)

    assert results["uid-b"] == PrepareResult(error="ResourceClaim team-b/infer: not allocated")
    assert results["uid-a"].error == ""
    assert results["uid-a"].devices == (RecordingHandler.device_for(CLAIM_A),)
    assert results["uid-c"].devices == (RecordingHandler.device_for(CLAIM_C),)
    assert errors == {"uid-a": "", "uid-b": "ResourceClaim team-b/infer: not allocated", "uid-c": ""}


@pytest.mark.parametrize("version", VERSIONS)
async def test_handler_exception_becomes_an_error_for_each_claim(
    kubelet: KubeletPluginClient, handler: RecordingHandler, version: DRAVersion
) -> None:
    handler.raise_error = RuntimeError("NVML went away")

    results = await kubelet.prepare([CLAIM_A, CLAIM_B], version=version)
    errors = await kubelet.unprepare([CLAIM_A], version=version)

    assert set(results) == {"uid-a", "uid-b"}
    assert all(not r.devices for r in results.values())
    assert "prepare failed: NVML went away" in results["uid-a"].error
    assert "team-b/infer" in results["uid-b"].error
    assert "unprepare failed: NVML went away" in errors["uid-a"]

    # The server keeps serving once the handler recovers.
    handler.raise_error = None
    assert (await kubelet.prepare([CLAIM_A], version=version))["uid-a"].error == ""


async def test_a_claim_missing_from_the_handler_result_gets_an_error(
    kubelet: KubeletPluginClient, handler: RecordingHandler
) -> None:
    handler.skip.add("uid-b")

    results = await kubelet.prepare([CLAIM_A, CLAIM_B])
    errors = await kubelet.unprepare([CLAIM_A, CLAIM_B])

    assert results["uid-a"].error == ""
    assert (
        results["uid-b"].error
        == "ResourceClaim team-b/infer (uid uid-b): driver returned no result for this claim"
    )
    assert errors["uid-a"] == ""
    assert "no result" in errors["uid-b"]


async def test_results_for_unrequested_claims_are_dropped(
    kubelet: KubeletPluginClient, handler: RecordingHandler
) -> None:
    handler.extra["uid-stranger"] = PrepareResult()

    # The test kubelet, like kubelet, would raise on an unrequested UID in the response.
    results = await kubelet.prepare([CLAIM_A])

    assert set(results) == {"uid-a"}


async def test_claims_with_empty_identity_fields_are_rejected_individually(
    kubelet: KubeletPluginClient, handler: RecordingHandler
) -> None:
    nameless = ClaimRef(namespace="team-b", name="", uid="uid-b")

    results = await kubelet.prepare([CLAIM_A, nameless])

    assert results["uid-a"].error == ""
    assert results["uid-b"].error == "ResourceClaim team-b/ (uid uid-b): claim name is empty"
    assert handler.prepared == [[CLAIM_A]]


async def test_malformed_devices_become_a_claim_error(
    kubelet: KubeletPluginClient, handler: RecordingHandler
) -> None:
    handler.devices["uid-b"] = (PreparedDevice(requests=(), pool="", device="gpu-0"),)

    results = await kubelet.prepare([CLAIM_A, CLAIM_B])

    assert results["uid-a"].error == ""
    assert "empty or non-string pool" in results["uid-b"].error


async def test_subrequest_names_are_reported_as_their_top_level_request(
    kubelet: KubeletPluginClient, handler: RecordingHandler
) -> None:
    handler.devices["uid-a"] = (
        PreparedDevice(requests=("gpu/big", "gpu/small", "nic"), pool="node-a", device="gpu-0"),
        PreparedDevice(requests=(), pool="node-a", device="gpu-1", cdi_device_ids=("a.com/b=c", "a.com/b=d")),
    )

    results = await kubelet.prepare([CLAIM_A])

    assert results["uid-a"].devices == (
        PreparedDevice(requests=("gpu", "nic"), pool="node-a", device="gpu-0"),
        PreparedDevice(requests=(), pool="node-a", device="gpu-1", cdi_device_ids=("a.com/b=c", "a.com/b=d")),
    )


async def test_share_id_travels_over_v1_only(kubelet: KubeletPluginClient, handler: RecordingHandler) -> None:
    shared = PreparedDevice(requests=("gpu",), pool="node-a", device="gpu-0", share_id="share-1")
    handler.devices["uid-a"] = (shared,)

    over_v1 = await kubelet.prepare([CLAIM_A], version="v1")
    over_v1beta1 = await kubelet.prepare([CLAIM_A], version="v1beta1")

    assert over_v1["uid-a"].devices == (shared,)
    assert over_v1beta1["uid-a"].devices[0].share_id is None


async def test_duplicate_claims_in_one_request_reach_the_handler_once(
    kubelet: KubeletPluginClient, handler: RecordingHandler
) -> None:
    results = await kubelet.prepare([CLAIM_A, CLAIM_A])

    assert set(results) == {"uid-a"}
    assert handler.prepared == [[CLAIM_A]]


async def test_an_empty_request_gets_an_empty_answer(
    kubelet: KubeletPluginClient, handler: RecordingHandler
) -> None:
    assert await kubelet.prepare([]) == {}
    assert await kubelet.unprepare([]) == {}
    assert handler.prepared == []


async def test_without_serialize_handler_calls_overlap(registry_dir: Path, plugins_dir: Path) -> None:
    gated = GatedHandler()
    running = await serve_plugin(
        driver=DRIVER, handler=gated, registry_dir=registry_dir, plugins_dir=plugins_dir, serialize=False
    )
    client = await KubeletPluginClient.register(running.registration_socket, call_timeout=10.0)
    try:
        first = asyncio.create_task(client.prepare([CLAIM_A]))
        second = asyncio.create_task(client.prepare([CLAIM_B]))
        async with gated.entered:
            await gated.entered.wait_for(lambda: gated.inside >= 2)
        gated.release.set()
        results = [await first, await second]
    finally:
        await client.close()
        await running.stop()

    assert gated.most_inside == 2
    assert results[0]["uid-a"].error == ""
    assert results[1]["uid-b"].error == ""


@pytest.mark.parametrize(("serialize", "inside_while_blocked"), [(True, 1), (False, 2)])
async def test_serialize_holds_the_second_call_until_the_first_returns(
    serialize: bool, inside_while_blocked: int
) -> None:
    gated = GatedHandler()
    service = ClaimService(driver=DRIVER, handler=gated, serialize=serialize)
    first = asyncio.create_task(service.prepare([CLAIM_A]))
    async with gated.entered:
        await gated.entered.wait_for(lambda: gated.inside >= 1)
    second = asyncio.create_task(service.prepare([CLAIM_B]))
    # Nothing on the way to the handler does I/O, so a few loop turns take the second call as far as it
    # can go: into the handler, or onto the lock.
    for _ in range(20):
        await asyncio.sleep(0)

    assert gated.inside == inside_while_blocked
    assert not second.done()
    gated.release.set()
    assert (await first)["uid-a"].error == ""
    assert (await second)["uid-b"].error == ""
    assert gated.most_inside == inside_while_blocked


async def test_a_call_kubelet_gave_up_on_still_completes(registry_dir: Path, plugins_dir: Path) -> None:
    gated = GatedHandler()
    running = await serve_plugin(
        driver=DRIVER, handler=gated, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    client = await KubeletPluginClient.register(running.registration_socket)
    try:
        # The handler is held, so this deadline always expires first, as kubelet's 45 s would; it is
        # long enough for a loaded machine to deliver the call, so the handler is inside by then.
        with pytest.raises(PluginCallError, match="DEADLINE_EXCEEDED"):
            await client.prepare([CLAIM_A], deadline=2.0)
        assert gated.most_inside == 1
        gated.release.set()
    finally:
        await client.close()
        await running.stop(grace=30)  # waits for the abandoned handler call

    assert gated.cancelled == 0
    assert gated.prepared == [[CLAIM_A]]


async def test_a_failure_nobody_waits_for_is_logged(
    registry_dir: Path, plugins_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gated = GatedHandler()
    gated.raise_error = RuntimeError("device reset failed")
    running = await serve_plugin(
        driver=DRIVER, handler=gated, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    client = await KubeletPluginClient.register(running.registration_socket)
    try:
        # Long enough for a loaded machine to deliver the call: the handler must be inside when the
        # kubelet gives up, or there is nothing left to log.
        with pytest.raises(PluginCallError, match="DEADLINE_EXCEEDED"):
            await client.prepare([CLAIM_A], deadline=2.0)
        assert gated.most_inside == 1
        # The server notices the expired RPC a moment after the client does; release only then, or
        # the call finishes as an ordinary one.
        for _ in range(500):
            if running.abandoned_calls:
                break
            await asyncio.sleep(0.01)
        assert running.abandoned_calls == 1
        gated.release.set()
    finally:
        await client.close()
        await running.stop(grace=30)

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("stopped waiting for failed: device reset failed" in m for m in warnings)
