"""Listings come in pages of 500 (``limit`` and ``continue``), one snapshot at the first page's
resourceVersion; the re-list reads them one at a time, the other callers all at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from dra_operator.client.kubeapi import KubeApi
from dra_operator.client.listwatch import PAGE_SIZE, Listing
from tests.unit.operator.local_http import client_config, local_server

Served = list[tuple[str, dict[str, str]]]

# Real continue tokens are base64; this one has what must be escaped in a query.
TOKEN = "a+b/c=d&e"


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Served]]:
    """Every list in three pages of one object each: page 0 at resourceVersion 100, later ones at
    a newer one (as if written meanwhile), which the snapshot must not take."""
    served: Served = []

    async def handle(request: web.Request) -> web.Response:
        query = dict(request.query)
        served.append((request.path, query))
        index = 0 if "continue" not in query else int(query["continue"].removeprefix(TOKEN))
        meta: dict[str, Any] = {"resourceVersion": str(100 + index)}
        if index < 2:
            meta["continue"] = f"{TOKEN}{index + 1}"
        plural = request.path.rsplit("/", 1)[1]
        items = [{"metadata": {"name": f"{plural}-{index}"}}]
        return web.json_response({"metadata": meta, "items": items})

    async with local_server(handle) as url:
        yield url, served


@pytest.mark.parametrize(
    ("plural", "path"),
    [
        ("nodes", "/api/v1/nodes"),
        ("pods", "/api/v1/pods"),
        ("resourceslices", "/apis/resource.k8s.io/v1/resourceslices"),
    ],
)
async def test_pages_come_one_at_a_time_at_the_first_pages_version(
    server: tuple[str, Served], plural: str, path: str
) -> None:
    url, served = server
    async with client.ApiClient(client_config(url)) as api_client:
        api = KubeApi(api_client, resource_version="v1", instance="test")
        pages = api.core_pages(plural) if plural in ("nodes", "pods") else api.snapshot_pages(plural)
        got: list[Listing] = []
        async for page in pages:
            got.append(page)
            assert len(served) == len(got)  # the next page is asked for only when wanted
    assert [p.resource_version for p in got] == ["100"] * 3
    assert [[o["metadata"]["name"] for o in p.items] for p in got] == [[f"{plural}-{i}"] for i in range(3)]
    assert served == [
        (path, {"limit": str(PAGE_SIZE)}),
        (path, {"limit": str(PAGE_SIZE), "continue": f"{TOKEN}1"}),
        (path, {"limit": str(PAGE_SIZE), "continue": f"{TOKEN}2"}),
    ]
    if plural == "resourceslices":
        assert got[0].items[0]["kind"] == "ResourceSlice"
        assert got[0].items[0]["apiVersion"] == "resource.k8s.io/v1"


async def test_whole_listings_collect_the_pages(server: tuple[str, Served]) -> None:
    url, _ = server
    async with client.ApiClient(client_config(url)) as api_client:
        api = KubeApi(api_client, resource_version="v1", instance="test")
        claims = await api.list_snapshot("resourceclaims")
        nodes = await api.list_core("nodes")
    assert claims.resource_version == nodes.resource_version == "100"
    assert [o["metadata"]["name"] for o in claims.items] == [f"resourceclaims-{i}" for i in range(3)]
    assert [o["metadata"]["name"] for o in nodes.items] == [f"nodes-{i}" for i in range(3)]
