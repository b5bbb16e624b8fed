"""AllocatedState counts holders: a device two allocations hold stays in use until both let go."""

from __future__ import annotations

from dra_api.model import AllocationResult
from dra_operator.allocator import AllocatedState

D = ("gpu.example.com", "node-1", "gpu-0")


def _allocation(*, share_id: str | None = None, admin: bool = False) -> AllocationResult:
    result: dict[str, object] = {"request": "r", "driver": D[0], "pool": D[1], "device": D[2]}
    if share_id:
        result["shareID"] = share_id
    if admin:
        result["adminAccess"] = True
    return AllocationResult.from_json({"devices": {"results": [result]}})


def test_an_exclusive_device_held_twice_is_freed_by_the_second_release_only() -> None:
    state = AllocatedState()
    first, second = _allocation(), _allocation()
    state.add_allocation(first)
    state.add_allocation(second)
    copy = state.copy()
    state.remove_allocation(first)
    assert state.devices == {D}
    assert state.in_use_ids() == {D}
    state.remove_allocation(second)
    assert state.devices == set()
    # The copy counts as the original did when it was taken.
    copy.remove_allocation(first)
    assert copy.devices == {D}


def test_devices_put_straight_into_the_set_count_once_and_admin_access_not_at_all() -> None:
    state = AllocatedState(devices={D})
    state.add_allocation(_allocation(admin=True))
    state.remove_allocation(_allocation())
    assert state.devices == set()
    state.remove_allocation(_allocation())  # releasing what is not held changes nothing
    assert state.devices == set()


def test_shares_are_counted_per_share_id() -> None:
    state = AllocatedState()
    state.add_allocation(_allocation(share_id="s1"))
    state.add_allocation(_allocation(share_id="s1"))
    state.add_allocation(_allocation(share_id="s2"))
    state.remove_allocation(_allocation(share_id="s1"))
    assert state.shared == {(*D, "s1"), (*D, "s2")}
    state.remove_allocation(_allocation(share_id="s1"))
    assert state.shared == {(*D, "s2")}
