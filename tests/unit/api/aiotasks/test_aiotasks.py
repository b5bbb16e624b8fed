"""Background tasks: held until they end, failures logged, drained within a grace period at stop."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from dra_api.aiotasks import BackgroundTasks


async def _forever() -> None:
    await asyncio.Event().wait()


async def _fail() -> None:
    raise ValueError("boom")


async def test_a_task_is_held_until_it_ends() -> None:
    tasks = BackgroundTasks()
    gate = asyncio.Event()
    task = tasks.spawn(gate.wait(), name="waiter")
    del task
    gc.collect()  # the loop's weak reference alone would let an unheld task vanish
    assert len(tasks) == 1
    gate.set()
    await tasks.join()
    assert len(tasks) == 0


async def test_spawn_names_the_task_and_returns_it() -> None:
    tasks = BackgroundTasks()

    async def answer() -> int:
        return 42

    task = tasks.spawn(answer(), name="answer")
    assert task.get_name() == "answer"
    assert await task == 42


async def test_a_failure_is_logged_when_the_task_ends(caplog: pytest.LogCaptureFixture) -> None:
    tasks = BackgroundTasks()
    with caplog.at_level(logging.ERROR, logger="dra_api.aiotasks"):
        tasks.spawn(_fail(), name="failing")
        await tasks.join()
    (record,) = [r for r in caplog.records if r.name == "dra_api.aiotasks"]
    assert "background task failing failed" in record.getMessage()
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], ValueError)


async def test_failures_are_left_to_the_caller_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    tasks = BackgroundTasks(log_failures=False)
    with caplog.at_level(logging.ERROR, logger="dra_api.aiotasks"):
        task = tasks.spawn(_fail())
        with pytest.raises(ValueError, match="boom"):
            await task
    assert not [r for r in caplog.records if r.name == "dra_api.aiotasks"]


async def test_join_waits_for_tasks_started_meanwhile() -> None:
    tasks = BackgroundTasks()
    ran: list[str] = []

    async def second() -> None:
        ran.append("second")

    async def first() -> None:
        await asyncio.sleep(0)
        tasks.spawn(second())
        ran.append("first")

    tasks.spawn(first())
    await tasks.join()
    assert ran == ["first", "second"]


async def test_drain_with_nothing_running_returns_at_once() -> None:
    assert await BackgroundTasks().drain(grace=10) == set()


async def test_drain_lets_quick_tasks_finish() -> None:
    tasks = BackgroundTasks()
    done = tasks.spawn(asyncio.sleep(0.01))
    assert await tasks.drain(grace=5) == set()
    assert done.done()
    assert not done.cancelled()


async def test_drain_cancels_what_outlives_the_grace() -> None:
    tasks = BackgroundTasks()
    quick = tasks.spawn(asyncio.sleep(0))
    stuck = tasks.spawn(_forever(), name="stuck")
    late = await tasks.drain(grace=0.05)
    assert late == {stuck}
    assert stuck.cancelled()  # and it has ended: drain waited for the cancellation
    assert quick.done()
    assert not quick.cancelled()
    assert len(tasks) == 0


async def test_drain_with_no_grace_cancels_everything_still_running() -> None:
    tasks = BackgroundTasks()
    stuck = tasks.spawn(_forever())
    assert await tasks.drain(grace=0) == {stuck}
    assert stuck.cancelled()


async def test_drain_without_cancel_leaves_late_tasks_running() -> None:
    tasks = BackgroundTasks()
    gate = asyncio.Event()
    slow = tasks.spawn(gate.wait())
    assert await tasks.drain(grace=0.01, cancel=False) == {slow}
    assert not slow.done()
    gate.set()
    await tasks.join()
    assert slow.done()
    assert not slow.cancelled()


async def test_drain_never_raises_a_task_failure(caplog: pytest.LogCaptureFixture) -> None:
    tasks = BackgroundTasks()
    with caplog.at_level(logging.ERROR, logger="dra_api.aiotasks"):
        tasks.spawn(_fail())
        assert await tasks.drain(grace=1) == set()
