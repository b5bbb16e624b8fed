"""Searches in worker threads: namespaces take turns, the loop keeps running, snapshots stand alone."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dra_api.model import ResourceSlice
from dra_operator.cel import WorkBudget
from dra_operator.model.cluster import ClusterModel
from dra_operator.planner import PlannerPlacer, SearchThreads
from dra_operator.planner.offloop import InterpreterShare
from dra_operator.planner.placement import OutOfBudget, Placement

from .test_budget import claim, split_counters_slice


async def test_namespaces_take_turns_for_one_thread() -> None:
    threads = SearchThreads(threads=1)
    gate = threading.Event()
    order: list[str] = []

    def job(name: str) -> str:
        gate.wait(timeout=30)
        order.append(name)
        return name

    # a1 takes the thread; a2, a3 and b1 wait. b1 goes before a2: a's turn is over.
    tasks = [
        asyncio.create_task(threads.run(namespace=ns, work=lambda n=n: job(n)))
        for ns, n in [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1")]
    ]
    await asyncio.sleep(0)
    assert (threads.busy, threads.queued) == (1, 3)
    gate.set()
    assert await asyncio.gather(*tasks) == ["a1", "a2", "a3", "b1"]
    assert order == ["a1", "b1", "a2", "a3"]
    assert (threads.busy, threads.queued) == (0, 0)
    threads.shutdown()


async def test_one_namespace_never_holds_every_thread() -> None:
    # share=1: unpaced, so both jobs (which never check a budget) run at once
    threads = SearchThreads(threads=2, share=1.0)
    gate = threading.Event()
    running: list[str] = []

    def job(name: str) -> None:
        running.append(name)
        gate.wait(timeout=30)

    tasks = [
        asyncio.create_task(threads.run(namespace=ns, work=lambda n=n: job(n)))
        for ns, n in [("a", "a1"), ("a", "a2"), ("b", "b1")]
    ]
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len(running) == 2:
            break
    assert sorted(running) == ["a1", "b1"]  # a2 waits although a thread... is b's
    gate.set()
    await asyncio.gather(*tasks)
    threads.shutdown()


async def test_a_cancelled_caller_drops_its_waiting_job() -> None:
    threads = SearchThreads(threads=1)
    gate = threading.Event()
    ran: list[str] = []

    def job(name: str) -> None:
        ran.append(name)
        gate.wait(timeout=30)

    first = asyncio.create_task(threads.run(namespace="a", work=lambda: job("first")))
    second = asyncio.create_task(threads.run(namespace="b", work=lambda: job("second")))
    await asyncio.sleep(0)
    second.cancel()
    gate.set()
    await first
    await asyncio.sleep(0.05)
    assert ran == ["first"]
    threads.shutdown()


async def test_the_loop_runs_while_a_search_does() -> None:
    """A hopeless claim searched in a thread: the loop's own timer keeps ticking meanwhile."""
    model = ClusterModel()
    model.upsert_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu", "resourceVersion": "1"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]},
        }
    )
    body = split_counters_slice("n0")
    body["metadata"]["resourceVersion"] = "1"
    model.upsert_slice(body)
    model.upsert_node(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n0", "resourceVersion": "1"}}
    )
    placer = PlannerPlacer(budget_s=0.3, slice_s=0.01)
    assert isinstance(placer.place(claims=[claim(25)], model=model), OutOfBudget)  # the loop's slice
    events: list[str] = []

    async def tick() -> None:
        await asyncio.sleep(0.005)
        events.append("the loop ran")

    ticker = asyncio.create_task(tick())
    outcome = await placer.place_off_loop(claims=[claim(25)], model=model, namespace="ns")
    events.append("the search ended")
    await ticker
    assert isinstance(outcome, OutOfBudget)
    assert "the search used its budget" in outcome.message
    # 0.3 s of the thread's CPU went by; the loop's 5 ms timer fired meanwhile, not after.
    assert events == ["the loop ran", "the search ended"]
    # The same claim within the room there is placed off the loop too, as the loop would place it.
    placed = await placer.place_off_loop(claims=[claim(24)], model=model, namespace="ns")
    assert isinstance(placed, Placement)
    placer.search.shutdown()


def test_a_snapshot_does_not_see_later_changes_of_the_model() -> None:
    model = ClusterModel()
    model.upsert_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu", "resourceVersion": "1"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]},
        }
    )
    body = split_counters_slice("n0", per_set=2, capacity=2)
    body["metadata"]["resourceVersion"] = "1"
    model.upsert_slice(body)
    placer = PlannerPlacer()
    snapshot = placer.snapshot(model)
    model.remove_slice("n0")
    assert [s.name for s in snapshot.slices.slices] == ["n0"]
    assert isinstance(snapshot.slices.slices[0], ResourceSlice)


def test_interpreter_share_lets_one_search_compute_at_a_time_and_rests_between_turns() -> None:
    """Two CPU-bound searches under a share of 0.5: never both between two budget checks at once
    (one holds the turn), and each turn ends in a rest at a budget check."""
    share = InterpreterShare(0.5, turn_s=0.001)
    inside = 0
    most = 0
    lock = threading.Lock()

    def search() -> int:
        nonlocal inside, most
        budget = WorkBudget.thread_cpu(30.0)
        checks = 0
        with share.searching():
            while budget.spent < 0.02:
                with lock:
                    inside += 1
                    most = max(most, inside)
                sum(range(2000))  # work between two checks
                with lock:
                    inside -= 1
                budget.check()
                checks += 1
        return checks

    workers = [threading.Thread(target=search) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert not any(worker.is_alive() for worker in workers)
    assert most == 1
    assert share.rests >= 2


def test_interpreter_share_outside_a_search_paces_nothing() -> None:
    """A budget checked outside ``searching`` (the event loop's slice) never rests."""
    share = InterpreterShare(0.1, turn_s=0.0)
    budget = WorkBudget.thread_cpu(30.0)
    for _ in range(100):
        budget.check()
    assert share.rests == 0
    with pytest.raises(ValueError, match="share of the interpreter"):
        InterpreterShare(0.0)
    with pytest.raises(ValueError, match="share of the interpreter"):
        InterpreterShare(1.5)
