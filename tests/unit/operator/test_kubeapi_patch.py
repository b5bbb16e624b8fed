"""The claim writes (merge patches) skip the generated API, through the operator's own keep-alive
connections (``pooled``) or the client's REST session: either way they must send what the
generated client sends and fail the way it fails."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_operator.client.connection import MERGE_PATCH, write_pool
from dra_operator.client.errors import Conflict, Gone, retry_after, transient
from dra_operator.client.kubeapi import KubeApi
from tests.unit.operator.local_http import client_config, local_server

Seen = list[dict[str, Any]]


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Seen, list[tuple[int, dict[str, str], str]]]]:
    """Records each request; answers with the next queued (status, headers, body), else 200 and
    the patch echoed in an object."""
    seen: Seen = []
    answers: list[tuple[int, dict[str, str], str]] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append(
            {
                "method": request.method,
                "path": request.raw_path,
                "content_type": request.headers.get("Content-Type"),
                "accept": request.headers.get("Accept"),
                "authorization": request.headers.get("Authorization"),
                "user_agent": request.headers.get("User-Agent"),
                "body": json.loads(body),
            }
        )
        if answers:
            status, headers, text = answers.pop(0)
            return web.Response(status=status, headers=headers, text=text)
        return web.json_response({"kind": "ResourceClaim", "patched": json.loads(body)})

    async with local_server(handle) as url:
        yield url, seen, answers


@pytest.fixture(params=["pooled", "aiohttp"])
def pooled(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "pooled")


def kube_api(api_client: client.ApiClient, pooled: bool) -> KubeApi:
    writes = write_pool(api_client) if pooled else None
    assert (writes is not None) == pooled
    return KubeApi(api_client, resource_version="v1", instance="test", writes=writes)


BODY = {"metadata": {"resourceVersion": "7"}, "status": {"allocation": {"devices": {"results": []}}}}


async def test_claim_patches_send_what_the_generated_client_sends(
    server: tuple[str, Seen, list[tuple[int, dict[str, str], str]]], pooled: bool
) -> None:
    url, seen, _ = server
    async with client.ApiClient(client_config(url)) as api_client:
        api = kube_api(api_client, pooled)
        custom: Any = client.CustomObjectsApi(api_client)
        pairs = (
            (api.patch_claim_status, custom.patch_namespaced_custom_object_status),
            (api.patch_claim, custom.patch_namespaced_custom_object),
        )
        for namespace, name in (("ns", "claim-1"), ("odd ns", "a/b?c")):
            for ours, generated in pairs:
                got = await ours(namespace=namespace, name=name, body=BODY)
                assert got == {"kind": "ResourceClaim", "patched": BODY}
                args = ("resource.k8s.io", "v1", namespace, "resourceclaims", name, BODY)
                await generated(*args, _content_type=MERGE_PATCH)
                assert seen[-2] == seen[-1]
    assert seen[0]["path"] == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim-1/status"
    assert seen[0]["authorization"] == "Bearer secret-token"
    assert seen[0]["content_type"] == MERGE_PATCH
    assert seen[4]["path"] == "/apis/resource.k8s.io/v1/namespaces/odd%20ns/resourceclaims/a%2Fb%3Fc/status"


async def test_claim_patch_errors_are_raised_as_before(
    server: tuple[str, Seen, list[tuple[int, dict[str, str], str]]], pooled: bool
) -> None:
    url, _, answers = server
    async with client.ApiClient(client_config(url)) as api_client:
        api = kube_api(api_client, pooled)
        answers.append((409, {}, '{"kind":"Status","code":409}'))
        with pytest.raises(Conflict, match="Conflict") as conflict:
            await api.patch_claim_status(namespace="ns", name="c", body=BODY)
        assert isinstance(conflict.value.__cause__, ApiException)
        answers.append((404, {}, '{"kind":"Status","code":404}'))
        with pytest.raises(Gone, match="Not Found"):
            await api.patch_claim(namespace="ns", name="c", body=BODY)
        answers.append((429, {"Retry-After": "3"}, '{"kind":"Status","code":429}'))
        with pytest.raises(ApiException) as throttled:
            await api.patch_claim_status(namespace="ns", name="c", body=BODY)
        assert throttled.value.status == 429
        assert throttled.value.reason == "Too Many Requests"
        assert throttled.value.body == '{"kind":"Status","code":429}'
        assert transient(throttled.value)
        assert retry_after(throttled.value) == 3.0
        answers.append((422, {}, '{"kind":"Status","code":422}'))
        with pytest.raises(ApiException) as invalid:
            await api.patch_claim(namespace="ns", name="c", body=BODY)
        assert invalid.value.status == 422
        assert not transient(invalid.value)


INVOLVED = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "name": "c",
    "namespace": "ns",
    "uid": "u1",
}


async def test_events_are_posted_and_a_refused_one_is_logged_not_raised(
    server: tuple[str, Seen, list[tuple[int, dict[str, str], str]]],
    pooled: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, seen, answers = server
    async with client.ApiClient(client_config(url)) as api_client:
        api = kube_api(api_client, pooled)
        await api.post_event(involved=INVOLVED, type_="Normal", reason="Allocated", message="on node-1")
        assert seen[-1]["method"] == "POST"
        assert seen[-1]["path"] == "/api/v1/namespaces/ns/events"
        assert seen[-1]["body"]["involvedObject"]["uid"] == "u1"
        assert seen[-1]["body"]["reason"] == "Allocated"
        answers.append((403, {}, '{"kind":"Status","message":"events is forbidden"}'))
        await api.post_event(involved=INVOLVED, type_="Warning", reason="Unschedulable", message="no")
    assert "could not post Warning event Unschedulable on c: HTTP 403 Forbidden" in caplog.text
    assert "events is forbidden" in caplog.text


async def test_every_write_carries_the_token_the_configuration_holds_then(
    server: tuple[str, Seen, list[tuple[int, dict[str, str], str]]], pooled: bool
) -> None:
    """A ServiceAccount's token is re-read when it rotates (the client's refresh hook): the
    writes must not keep the first one."""
    url, seen, _ = server
    config = client_config(url)
    tokens = iter(["first", "second"])

    def refresh(configuration: client.Configuration) -> None:
        configuration.api_key["BearerToken"] = next(tokens, "second")

    config.refresh_api_key_hook = refresh
    async with client.ApiClient(config) as api_client:
        api = kube_api(api_client, pooled)
        await api.patch_claim_status(namespace="ns", name="c", body=BODY)
        await api.patch_claim_status(namespace="ns", name="c", body=BODY)
    assert [s["authorization"] for s in seen] == ["Bearer first", "Bearer second"]
