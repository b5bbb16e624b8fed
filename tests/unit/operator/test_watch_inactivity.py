"""A watch that goes silent (no data, no end) is dropped after the inactivity timeout: the
operator's own watches (KubeApi) against a real HTTP server that stops sending, and Kopf's through
the log filter that counts and reports its restarts."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import AsyncIterator

import kopf
import pytest
from aiohttp import web
from kopf._cogs.clients import fetching as kopf_fetching
from kopf._cogs.clients import watching as kopf_watching
from kubernetes_asyncio import client

from dra_operator.base.settings import parse
from dra_operator.client.errors import WatchInactive
from dra_operator.client.kubeapi import KubeApi
from dra_operator.entry import runner
from dra_operator.model.metrics import Metrics
from dra_operator.watch import kopfwatchlog


@pytest.fixture
async def stalling_server() -> AsyncIterator[tuple[str, list[str]]]:
    """Answers every watch with one event, then keeps the stream open and silent; a request
    whose path ends in /slow never gets its headers. Yields the URL and the paths asked for."""
    asked: list[str] = []
    silence = asyncio.Event()  # never set: the handlers wait until the client goes away

    async def handle(request: web.Request) -> web.StreamResponse:
        asked.append(request.path_qs)
        if request.path.endswith("/slow"):
            await silence.wait()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        event = {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "7"}}}
        await response.write(json.dumps(event).encode() + b"\n")
        await silence.wait()
        return response

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", asked
    finally:
        await runner.cleanup()


async def test_a_stalled_watch_ends_with_watch_inactive(stalling_server: tuple[str, list[str]]) -> None:
    url, asked = stalling_server
    config = client.Configuration(host=url)
    async with client.ApiClient(config) as api_client:
        api = KubeApi(api_client, resource_version="v1", instance="test")
        seen: list[tuple[str, str]] = []

        async def follow() -> None:
            async for kind, obj in api.watch(
                "resourceclaims",
                resource_version="5",
                server_timeout_s=300,
                client_timeout_s=330,
                connect_timeout_s=5,
                inactivity_timeout_s=0.5,
            ):
                seen.append((kind, obj["metadata"]["name"]))

        with pytest.raises(WatchInactive, match="not even a bookmark"):
            await follow()
        assert seen == [("ADDED", "a")]  # the stream worked, then went silent
        assert "timeoutSeconds=300" in asked[0]
        assert "allowWatchBookmarks=true" in asked[0]

        # No headers at all is a stall too.
        with pytest.raises(WatchInactive, match="no response"):
            async for _ in api._watch(
                "/slow",
                [],
                resource_version="5",
                server_timeout_s=300,
                client_timeout_s=330,
                connect_timeout_s=5,
                inactivity_timeout_s=0.5,
            ):
                pass


def test_kopf_still_logs_the_messages_the_filter_reads() -> None:
    """The filter matches Kopf's own text; a Kopf that rewords it must fail here, not go quiet."""
    source = inspect.getsource(kopf_watching)
    assert 'f"Watch-stream for {resource} {where} is inactive, reconnecting."' in source
    assert 'f"Restarting the watch-stream for {resource} {where}."' in source
    assert "settings.watching.inactivity_timeout" in source
    assert kopf_watching.logger.name == kopfwatchlog.KOPF_WATCHING_LOGGER


def test_kopf_watch_restarts_are_counted_and_silent_ones_warned(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    logger = logging.getLogger(kopfwatchlog.KOPF_WATCHING_LOGGER)
    level_before = logger.level
    caplog.set_level(logging.INFO)
    uninstall = kopfwatchlog.install(metrics=metrics, inactivity_timeout_s=70)
    try:
        logger.debug(
            "Watch-stream for resourceslices.v1.resource.k8s.io cluster-wide is inactive, reconnecting."
        )
        logger.debug("Restarting the watch-stream for deviceclasses.v1.resource.k8s.io cluster-wide.")
        logger.debug("Stopping the watch-stream for nodes.v1 cluster-wide.")  # other DEBUG: still dropped
    finally:
        uninstall()
    assert logger.level == level_before
    assert not logger.filters
    restarts = metrics.watch_restarts
    assert restarts.labels("resourceslices", "inactive")._value.get() == 1
    assert restarts.labels("deviceclasses", "expired")._value.get() == 1
    mine = [r for r in caplog.records if r.name == kopfwatchlog.KOPF_WATCHING_LOGGER]
    assert [(r.levelname, r.getMessage()) for r in mine] == [
        (
            "WARNING",
            "the resourceslices watch (cluster-wide) went silent: nothing, not even a bookmark, for 70 s; "
            "Kopf dropped it and resumes from the last resourceVersion",
        )
    ]


def test_watch_timeouts_are_settings_and_checked() -> None:
    settings = parse(
        [
            "--watch-inactivity-timeout-seconds=5",
            "--watch-server-timeout-seconds=20",
            "--watch-client-timeout-seconds=25",
        ],
        env={},
    )
    assert settings.watch_inactivity_timeout_s == 5
    assert parse([], env={}).watch_inactivity_timeout_s == 70
    with pytest.raises(ValueError, match="watch_client_timeout"):
        parse(["--watch-server-timeout-seconds=400"], env={})
    with pytest.raises(ValueError, match="must be positive"):
        parse(["--watch-inactivity-timeout-seconds=0"], env={})


def test_kopf_lists_in_pages() -> None:
    kopf_settings = kopf.OperatorSettings()
    runner.configure_kopf(kopf_settings, parse([], env={}))
    assert kopf_settings.watching.chunk_size == runner.LIST_PAGE_SIZE
    # The setting is what Kopf's listing reads to send limit= and follow continue tokens.
    source = inspect.getsource(kopf_fetching.fetch_objs)
    assert "settings.watching.chunk_size" in source
    assert "continue_token" in source
