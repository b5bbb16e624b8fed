"""The slowdown the few time-bound integration tests scale by: the load per CPU, within [1, 3]."""

from __future__ import annotations

import pytest

from tests.integration import pace


@pytest.mark.parametrize(
    ("load", "cpus", "factor"), [(0.3, 2, 1.0), (5.0, 2, 2.5), (40.0, 2, 3.0), (6.0, None, 3.0)]
)
def test_slowdown_is_the_load_per_cpu_within_bounds(
    monkeypatch: pytest.MonkeyPatch, load: float, cpus: int | None, factor: float
) -> None:
    monkeypatch.setattr(pace.os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(pace.os, "cpu_count", lambda: cpus)
    assert pace.slowdown() == factor


def test_a_measured_pace_keeps_the_largest_factor_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    loads = iter([4.0, 1.0])
    monkeypatch.setattr(pace.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(pace.os, "cpu_count", lambda: 2)
    with pace.measured() as measured:
        pass
    assert measured.factor == 2.0
    assert measured.scaled(10.0) == 20.0
