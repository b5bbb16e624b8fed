"""Events wait behind the claim writes, and a full queue drops Normal Events before Warnings."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from dra_operator.client.events import EventSink


class Recorder:
    def __init__(self) -> None:
        self.posted: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.release = asyncio.Event()
        self.release.set()

    async def post_event(self, *, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await self.release.wait()
        self.in_flight -= 1
        self.posted.append(f"{type_}/{reason}/{involved['name']}")


class Count:
    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


def _post(sink: EventSink, name: str, *, type_: str = "Normal", reason: str = "Allocated") -> None:
    sink.post(involved={"name": name}, type_=type_, reason=reason, message="m")


async def test_idle_worker_posts_everything_with_bounded_concurrency() -> None:
    api = Recorder()
    api.release.clear()
    sink = EventSink(api, idle=lambda: True, idle_concurrency=3)
    for i in range(10):
        _post(sink, f"c{i}")
    runner = asyncio.create_task(sink.run(poll=0.01))
    await asyncio.sleep(0.1)
    assert api.in_flight == 3
    api.release.set()
    await sink.flush(within=5)
    runner.cancel()
    assert api.posted == [f"Normal/Allocated/c{i}" for i in range(10)]
    assert api.most_in_flight == 3


async def test_busy_worker_holds_events_until_they_are_old_then_sends_one_at_a_time() -> None:
    api = Recorder()
    now = [100.0]
    busy = [True]
    sink = EventSink(api, idle=lambda: not busy[0], max_delay=10.0, clock=lambda: now[0])
    for i in range(3):
        _post(sink, f"c{i}")
    runner = asyncio.create_task(sink.run(poll=0.01))
    await asyncio.sleep(0.1)
    assert api.posted == []  # busy and young: held back
    now[0] += 10.0
    api.release.clear()
    await asyncio.sleep(0.1)
    assert api.in_flight == 1  # old enough: one at a time while busy
    api.release.set()
    await asyncio.sleep(0.1)
    assert len(api.posted) == 3
    assert api.most_in_flight == 1
    busy[0] = False
    _post(sink, "late")
    await sink.flush(within=5)
    runner.cancel()
    assert api.posted[-1] == "Normal/Allocated/late"


async def test_a_full_queue_drops_the_oldest_normal_event_and_keeps_warnings() -> None:
    api = Recorder()
    dropped = Count()
    sink = EventSink(api, idle=lambda: False, capacity=3, dropped=dropped)
    _post(sink, "w1", type_="Warning", reason="Unsatisfiable")
    _post(sink, "n1")
    _post(sink, "n2")
    _post(sink, "n3")  # drops n1
    assert dropped.value == 1
    _post(sink, "w2", type_="Warning", reason="Unsatisfiable")  # drops n2
    _post(sink, "w3", type_="Warning", reason="Unsatisfiable")  # drops n3
    _post(sink, "n4")  # only Warnings queued: n4 itself is dropped
    assert dropped.value == 4
    assert len(sink) == 3
    sink.idle = lambda: True
    runner = asyncio.create_task(sink.run(poll=0.01))
    await sink.flush(within=5)
    runner.cancel()
    assert sorted(api.posted) == [
        "Warning/Unsatisfiable/w1",
        "Warning/Unsatisfiable/w2",
        "Warning/Unsatisfiable/w3",
    ]


async def test_a_failing_post_does_not_stop_the_queue() -> None:
    class Flaky(Recorder):
        async def post_event(self, **kwargs: Any) -> None:
            if kwargs["involved"]["name"] == "bad":
                raise RuntimeError("boom")
            await super().post_event(**kwargs)

    api = Flaky()
    sink = EventSink(api, idle=lambda: True)
    _post(sink, "bad")
    _post(sink, "good")
    runner = asyncio.create_task(sink.run(poll=0.01))
    await sink.flush(within=5)
    runner.cancel()
    assert api.posted == ["Normal/Allocated/good"]
