from __future__ import annotations

from dra_operator.watch.liveness import Health


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
    # A standby's watches keep the model a takeover allocates from: they are checked too.
    active[0] = False
    ok, text = health.verdict()
    assert not ok
    assert text.startswith("standby: no heartbeat")
    health.heartbeat_seen("me@40.000")
    ok, text = health.verdict()
    assert ok
    assert "standby" in text


def test_an_instance_that_writes_no_heartbeat_is_not_checked_until_it_does() -> None:
    clock = _Clock()
    writing = [False]  # the peering object is missing: no heartbeat is written
    health = Health(stale_after=30, identity="me", clock=clock, writing=lambda: writing[0])
    clock.now = 100
    ok, text = health.verdict()
    assert ok
    assert "peering object is missing" in text
    writing[0] = True  # the object came back: the wait for a heartbeat starts now, not at start
    clock.now = 125
    assert health.verdict()[0]
    clock.now = 131
    assert not health.verdict()[0]


def test_a_foreign_heartbeat_does_not_count() -> None:
    clock = _Clock()
    health = Health(stale_after=5, identity="me", clock=clock)
    clock.now = 10
    health.heartbeat_seen("other@2.000")
    health.heartbeat_seen("me-too@2.000")  # a prefix of another identity is not this one
    assert not health.verdict()[0]
    health.heartbeat_seen("me@9.000")
    assert health.verdict()[0]
