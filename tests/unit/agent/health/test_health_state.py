"""The per-device state machine: unknown -> healthy/unhealthy, recovery after a quiet period, history."""

from __future__ import annotations

from dra_node_agent.health.state import DeviceHealthState, Observation, ProblemKind, State


def current(state: DeviceHealthState) -> State:
    return state.state


def xid(code: int, at: float) -> Observation:
    return Observation(device="gpu-0", time=at, kind=ProblemKind.XID, value=str(code), message=f"XID {code}")


def ok(at: float) -> Observation:
    return Observation(device="gpu-0", time=at)


def test_unknown_until_checked_then_healthy() -> None:
    state = DeviceHealthState(device="gpu-0", recovery_period=60)
    assert current(state) is State.UNKNOWN
    assert state.observe(ok(100)) is True
    assert current(state) is State.HEALTHY
    assert state.observe(ok(110)) is False
    assert [(t.old, t.new) for t in state.history] == [(State.UNKNOWN, State.HEALTHY)]


def test_problem_makes_unhealthy_and_expires_after_the_quiet_period() -> None:
    state = DeviceHealthState(device="gpu-0", recovery_period=60)
    state.observe(ok(100))
    assert state.observe(xid(79, 110)) is True
    assert current(state) is State.UNHEALTHY
    assert state.reasons() == ("xid=79",)
    assert state.message() == "XID 79"
    assert state.next_expiry() == 170
    assert state.expire(now=169.9) is False
    assert current(state) is State.UNHEALTHY
    assert state.expire(now=170) is True
    assert current(state) is State.HEALTHY
    assert [t.new for t in state.history] == [State.HEALTHY, State.UNHEALTHY, State.HEALTHY]
    assert state.history[-1].reasons == ()
    assert state.history[1].reasons == ("xid=79",)


def test_a_problem_seen_again_restarts_the_quiet_period() -> None:
    state = DeviceHealthState(device="gpu-0", recovery_period=60)
    state.observe(xid(79, 100))
    assert state.observe(xid(79, 150)) is False  # same problem: no new transition
    assert state.problems[(ProblemKind.XID, "79")].first_seen == 100
    assert state.expire(now=200) is False
    assert state.expire(now=210) is True
    assert current(state) is State.HEALTHY


def test_each_problem_expires_on_its_own() -> None:
    state = DeviceHealthState(device="gpu-0", recovery_period=60)
    state.observe(xid(79, 100))
    state.observe(Observation(device="gpu-0", time=130, kind=ProblemKind.GPU_LOST))
    state.expire(now=165)
    assert state.reasons() == ("gpu-lost",)
    assert current(state) is State.UNHEALTHY
    state.expire(now=190)
    assert current(state) is State.HEALTHY


def test_unknown_when_not_checkable_keeps_problems() -> None:
    state = DeviceHealthState(device="gpu-0", recovery_period=60)
    state.observe(ok(1))
    assert state.mark_unknown(now=2, reason="NVML failed") is True
    assert current(state) is State.UNKNOWN
    assert state.message() == "NVML failed"
    state.observe(xid(48, 3))
    assert state.mark_unknown(now=4, reason="NVML failed") is False
    assert current(state) is State.UNHEALTHY


def test_history_is_bounded() -> None:
    state = DeviceHealthState(device="gpu-0", recovery_period=1, history_size=4)
    for i in range(10):
        state.observe(xid(79, i * 10))
        state.expire(now=i * 10 + 5)
    assert len(state.history) == 4
    assert state.history[-1].new is State.HEALTHY
    assert state.history[-1].time == 95
