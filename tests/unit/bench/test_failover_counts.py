"""How the failover benchmarks count allocations: a claim the SIGKILLed instance wrote as it died
has no log line and still counts once; anything else not logged exactly once is a problem."""

from __future__ import annotations

from typing import Any

from bench.operator_failover import once_problems

KILLED_AT = 1_800_000_010.5  # 2027-01-15T08:00:10.5Z


def _claim(name: str, created: str, *, allocated: bool) -> dict[str, Any]:
    status = {"allocation": {"devices": {"results": []}}} if allocated else {}
    return {"metadata": {"name": name, "creationTimestamp": created}, "status": status}


def test_a_claim_written_as_the_instance_was_killed_counts_once() -> None:
    claims = [
        _claim("logged", "2027-01-15T08:00:05Z", allocated=True),
        _claim("silent", "2027-01-15T08:00:10Z", allocated=True),
    ]
    counts = {"logged": 1}
    assert once_problems(claims, ["logged", "silent"], counts, killed_at=KILLED_AT) == ([], 1)


def test_unlogged_claims_are_problems_unless_they_existed_at_a_kill_and_hold_an_allocation() -> None:
    claims = [
        _claim("after", "2027-01-15T08:00:12Z", allocated=True),  # created after the kill
        _claim("unallocated", "2027-01-15T08:00:05Z", allocated=False),
        _claim("twice", "2027-01-15T08:00:05Z", allocated=True),
        _claim("no-kill", "2027-01-15T08:00:05Z", allocated=True),
    ]
    counts = {"twice": 2}
    problems, silent = once_problems(claims, ["after", "unallocated", "twice"], counts, killed_at=KILLED_AT)
    assert problems == [
        "claim after allocated 0 times",
        "claim unallocated allocated 0 times",
        "claim twice allocated 2 times",
    ]
    assert silent == 0
    # Without a SIGKILL (a SIGTERM round: the instance logs as it stops) nothing is excused.
    assert once_problems(claims, ["no-kill"], {}, killed_at=None) == (["claim no-kill allocated 0 times"], 0)
