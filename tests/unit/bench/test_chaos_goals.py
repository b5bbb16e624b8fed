"""The chaos churn goes on until it has done what the test counts: what it still lacks."""

from __future__ import annotations

from collections import Counter

from bench.operator_chaos import ChaosReport, short_of

GOALS = {"kills": 3, "claim created": 20, "pod force-deleted": 5, "samples": 50}


def test_what_is_still_lacking_is_counted_per_goal() -> None:
    report = ChaosReport(actions=Counter({"claim created": 25, "pod force-deleted": 2}), kills=1, samples=50)
    assert short_of(GOALS, report) == {"kills": 2, "pod force-deleted": 3}


def test_nothing_lacks_once_every_goal_is_met_and_an_action_never_seen_lacks_in_full() -> None:
    report = ChaosReport(actions=Counter({"claim created": 20, "pod force-deleted": 5}), kills=3, samples=51)
    assert short_of(GOALS, report) == {}
    assert short_of({"race lost by the scheduler": 1}, report) == {"race lost by the scheduler": 1}
