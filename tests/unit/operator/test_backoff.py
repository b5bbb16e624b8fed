"""Retry delays: doubling per claim, reset by success, and the server's Retry-After for everyone."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from dra_operator.claims.backoff import Backoff
from dra_operator.client.errors import error_cause, retry_after, transient


def test_delay_doubles_per_claim_up_to_the_cap_and_success_resets_it() -> None:
    backoff = Backoff(base=0.5, cap=4.0, clock=lambda: 0.0)
    assert [backoff.failed("a") for _ in range(5)] == [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0)]
    assert backoff.failed("b") == (1, 0.5)  # per claim
    backoff.succeeded("a")
    assert backoff.failed("a") == (1, 0.5)


def test_retry_after_sets_the_floor_and_pauses_all_writes() -> None:
    now = [10.0]
    backoff = Backoff(base=0.5, clock=lambda: now[0])
    assert backoff.pause_left() == 0.0
    assert backoff.failed("a", retry_after=3.0) == (1, 3.0)
    assert backoff.pause_left() == pytest.approx(3.0)
    now[0] += 2.0
    assert backoff.pause_left() == pytest.approx(1.0)
    now[0] += 2.0
    assert backoff.pause_left() == 0.0


async def test_wait_for_pause_sleeps_until_the_retry_after_ends() -> None:
    backoff = Backoff()
    backoff.failed("a", retry_after=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await backoff.wait_for_pause()
    assert loop.time() - started >= 0.19


def _api_error(status: int, headers: dict[str, str] | None = None) -> ApiException:
    exc = ApiException(status=status, reason="x")
    exc.headers = headers
    return exc


def test_which_errors_are_worth_retrying() -> None:
    assert transient(_api_error(429))
    assert transient(_api_error(503))
    assert transient(_api_error(500))
    assert transient(ConnectionResetError())
    assert transient(TimeoutError())
    assert not transient(_api_error(403))
    assert not transient(_api_error(422))
    assert not transient(ValueError())
    assert error_cause(_api_error(503)) == "503"
    assert error_cause(ConnectionResetError()) == "ConnectionResetError"


def test_retry_after_is_read_from_429_and_503_only() -> None:
    assert retry_after(_api_error(429, {"Retry-After": "7"})) == 7.0
    assert retry_after(_api_error(503, {"Retry-After": "2"})) == 2.0
    assert retry_after(_api_error(500, {"Retry-After": "2"})) is None
    assert retry_after(_api_error(429)) is None
    assert retry_after(_api_error(429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})) is None
    assert retry_after(ConnectionResetError()) is None
