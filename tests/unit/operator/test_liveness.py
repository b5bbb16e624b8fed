from __future__ import annotations

from dra_operator.liveness import Health


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_liveness_fails_when_heartbeats_stop_coming_back() -> None:
    clock = _Clock()
    active = [True]
    health = Health(stale_after=30, identity="me", active=lambda: active[0], clock=clock)
    clock.now = 10
    health.heartbeat_seen("me@1.000")
    clock.now = 35
    assert health.verdict()[0]
    clock.now = 41
    ok, text = health.verdict()
    assert not ok
    assert "no heartbeat" in text
    active[0] = False  # a standby's watches are frozen on purpose
    ok, text = health.verdict()
    assert ok
    assert "standby" in text


def test_a_foreign_heartbeat_does_not_count() -> None:
    clock = _Clock()
    health = Health(stale_after=5, identity="me", clock=clock)
    clock.now = 10
    health.heartbeat_seen("other@2.000")
    health.heartbeat_seen("me-too@2.000")  # a prefix of another identity is not this one
    assert not health.verdict()[0]
    health.heartbeat_seen("me@9.000")
    assert health.verdict()[0]
