"""Every reconciler in these tests checks, after every event it is fed (claim events, the
operator's own write results, cluster changes), that the placer's free-device index agrees with
the cluster model: a disagreement fails the test at the event that caused it, not some placements
later. Integration tests do the same through ``--verify-placer-index`` (see
``tests/integration/operator/conftest.py``)."""

from __future__ import annotations

import pytest

from dra_operator.claims.coordinator import ClaimReconciler


def assert_placer_agrees(reconciler: ClaimReconciler) -> None:
    problems = reconciler.placer.disagreements(reconciler.model)
    assert not problems, "placer index disagrees with the model: " + "; ".join(problems)


@pytest.fixture(autouse=True)
def placer_checked_after_every_event(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ClaimReconciler, "_verify_after_event", assert_placer_agrees)
