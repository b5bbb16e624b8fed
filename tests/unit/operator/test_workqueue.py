"""The claim queue hands claims out one at a time: urgent tiers first, namespaces in turn."""

from __future__ import annotations

from dra_operator.model.cluster import ClaimKey
from dra_operator.model.workqueue import ClaimQueue, Turns


def _keys(namespace: str, count: int) -> list[ClaimKey]:
    return [ClaimKey(namespace, f"{namespace}-{i}") for i in range(count)]


def test_namespaces_take_turns_within_a_tier() -> None:
    turns = Turns()
    turns.add([*_keys("flood", 4), *_keys("quiet", 1)], tier=lambda k: 0)
    order = [turns.next() for _ in range(5)]
    assert [k.name for k in order if k] == ["flood-0", "quiet-0", "flood-1", "flood-2", "flood-3"]
    assert turns.next() is None


def test_a_more_urgent_tier_goes_first_and_a_key_is_queued_once() -> None:
    turns = Turns()
    held, waiting = ClaimKey("a", "held"), ClaimKey("b", "waiting")
    tier = {held: 1, waiting: 0}
    turns.add([held, waiting, held], tier=tier.__getitem__)
    assert len(turns) == 2
    assert [turns.next(), turns.next()] == [waiting, held]


async def test_claims_marked_while_others_wait_take_their_namespaces_turn() -> None:
    queue = ClaimQueue()
    queue.mark_all(_keys("flood", 50))
    first = queue.next(order=lambda k: k.name, tier=lambda k: 0)
    assert first == ClaimKey("flood", "flood-0")
    queue.mark(ClaimKey("late", "late-0"))  # arrives while forty-nine flood claims wait
    assert queue.next(order=lambda k: k.name, tier=lambda k: 0) == ClaimKey("late", "late-0")
    assert not queue.idle()  # claims waiting their turn are work still to do
    queue.hold_back()
    assert len(queue.dirty) == 49  # the flood claims still waiting their turn
    assert not queue.turns
