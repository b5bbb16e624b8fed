"""ClaimReader: every GET has a deadline; timeouts, connection errors, 429 and 5xx are retried a few
times with a back-off, other errors and 404 are not."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent.claim_reader import ClaimError, ClaimGone, ClaimReader

REF = ClaimRef(namespace="ns", name="c", uid="u1")


class ScriptedCustom:
    def __init__(self, outcomes: list[Any]) -> None:
        self.outcomes = outcomes
        self.timeouts: list[Any] = []

    async def get_namespaced_custom_object(self, *args: Any, _request_timeout: Any = None) -> Any:
        self.timeouts.append(_request_timeout)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def _reader(outcomes: list[Any], sleeps: list[float]) -> tuple[ClaimReader, ScriptedCustom]:
    async def sleep(delay: float) -> None:
        sleeps.append(delay)

    reader = ClaimReader(
        api=client.ApiClient(), driver="gpu.nvidia.com", api_version="v1", request_timeout=7, sleep=sleep
    )
    custom = ScriptedCustom(outcomes)
    reader._custom = custom  # type: ignore[assignment]
    return reader, custom


async def test_timeouts_and_5xx_are_retried_with_a_deadline_on_every_read() -> None:
    sleeps: list[float] = []
    obj = {"metadata": {"uid": "u1"}}
    reader, custom = _reader([TimeoutError(), ApiException(status=503, reason="busy"), obj], sleeps)
    assert await reader.get(REF) == obj
    assert sleeps == [0.5, 1.0]
    assert all(t.total == 7 for t in custom.timeouts)
    assert len(custom.timeouts) == 3


async def test_gives_up_after_the_last_attempt_with_a_clear_error() -> None:
    sleeps: list[float] = []
    reader, _ = _reader([TimeoutError(), aiohttp.ClientConnectionError("reset"), TimeoutError()], sleeps)
    with pytest.raises(
        ClaimError, match=r"ResourceClaim ns/c \(uid u1\): reading it failed after 3 attempts"
    ):
        await reader.get(REF)
    assert sleeps == [0.5, 1.0]


async def test_404_and_403_are_not_retried() -> None:
    sleeps: list[float] = []
    reader, _ = _reader([ApiException(status=404, reason="NotFound")], sleeps)
    with pytest.raises(ClaimGone):
        await reader.get(REF)
    reader, _ = _reader([ApiException(status=403, reason="Forbidden")], sleeps)
    with pytest.raises(ClaimError, match="403 Forbidden"):
        await reader.get(REF)
    assert sleeps == []
