from __future__ import annotations

import datetime

from dra_operator.health import Health, is_active


def _stamp(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")


def test_highest_live_priority_is_active() -> None:
    now = 1_000_000.0
    peers = {
        "me": {"priority": 10, "lifetime": 60, "lastseen": _stamp(now)},
        "low": {"priority": 5, "lifetime": 60, "lastseen": _stamp(now)},
    }
    assert is_active(peers=peers, identity="me", priority=10, now=now)
    assert not is_active(peers=peers, identity="low", priority=5, now=now)


def test_tie_pauses_and_dead_peers_do_not_count() -> None:
    now = 1_000_000.0
    tie = {"other": {"priority": 10, "lifetime": 60, "lastseen": _stamp(now - 1)}}
    assert not is_active(peers=tie, identity="me", priority=10, now=now)
    dead = {"other": {"priority": 99, "lifetime": 60, "lastseen": _stamp(now - 120)}}
    assert is_active(peers=dead, identity="me", priority=10, now=now)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_liveness_fails_when_heartbeats_stop_coming_back() -> None:
    clock = _Clock()
    health = Health(stale_after=30, clock=clock)
    health.active = True
    health.sent = "me@1"
    clock.now = 10
    health.heartbeat_seen("me@1")
    clock.now = 35
    assert health.verdict()[0]
    clock.now = 41
    ok, text = health.verdict()
    assert not ok
    assert "no heartbeat" in text
    health.active = False  # a standby's watches are frozen on purpose
    assert health.verdict()[0]


def test_a_foreign_heartbeat_does_not_count() -> None:
    clock = _Clock()
    health = Health(stale_after=5, clock=clock)
    health.active = True
    health.sent = "me@2"
    clock.now = 10
    health.heartbeat_seen("other@2")
    assert not health.verdict()[0]
