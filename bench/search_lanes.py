"""Where a long search should run: on the event loop, in a worker thread, or in a process.

On a synthetic cluster of N nodes with eight GPUs each (``bench/allocator_bench.py``'s) plus a node
of partitionable devices in two counter sets, one hopeless claim (25 of 48 partitions where 24 fit,
which no polynomial check sees) is searched with a budget of ``--budget`` CPU seconds while the event
loop runs a 5 ms ticker, standing for watches, ``/healthz`` and other claims. Printed per way:

- ``inline``: the search on the loop (the operator before issue 37): the longest the ticker waited;
- ``thread``: the search in a worker thread from a :class:`~dra_operator.planner.PlannerSnapshot`
  (what the operator does): the longest the ticker waited (the GIL hands the interpreter back every
  5 ms) and the ticks the loop got meanwhile;
- ``process``: what a worker process would need first: the snapshot pickled (seconds and MiB), per
  search, since the model changes between searches.

And the feasibility check's cost: the issue's claim (two requests selecting the same devices, one
more than a node has) placed across all N nodes, each refused by the check, and an ordinary one-GPU
claim's placement with the check and without it (``Planner(feasibility=False)``).

    .venv/bin/python -m bench.search_lanes --nodes 1000,5000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench.allocator_bench import device_class, node_slice
from dra_api.model import DeviceClass, Node, ResourceClaim, ResourceSlice
from dra_operator.allocator import SliceIndex
from dra_operator.cel import WorkBudget, compile_selector
from dra_operator.planner import NotPlaced, OutOfBudget, Planner, PlannerSnapshot

DRIVER = "gpu.nvidia.com"


def _parts(node: str) -> dict[str, Any]:
    devices = [
        {
            "name": f"part-{s}-{i}",
            "attributes": {"type": {"string": "gpu"}},
            "consumesCounters": [{"counterSet": s, "counters": {"units": {"value": "1"}}}],
        }
        for s in ("a", "b")
        for i in range(24)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": node},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "sharedCounters": [{"name": s, "counters": {"units": {"value": "12"}}} for s in ("a", "b")],
            "devices": devices,
        },
    }


def _claim(name: str, *requests: tuple[str, int, str]) -> ResourceClaim:
    return ResourceClaim.from_json(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "bench"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": r,
                            "exactly": {
                                "deviceClassName": "gpu.nvidia.com",
                                "count": n,
                                "selectors": [{"cel": {"expression": sel}}],
                            },
                        }
                        for r, n, sel in requests
                    ]
                }
            },
        }
    )


async def _loop_lag(work: Any) -> tuple[float, int, float]:
    """Run ``work()`` (a coroutine) while a 5 ms ticker runs: (longest wait of a tick, ticks, seconds)."""
    longest = 0.0
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal longest, ticks
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            longest = max(longest, now - last - 0.005)
            last = now
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    started = time.monotonic()
    await work()
    took = time.monotonic() - started
    stop.set()
    await task
    return longest, ticks, took


def run(nodes: int, budget: float) -> None:
    compile_selector("true")
    slices = [ResourceSlice.from_json(node_slice(n)) for n in range(nodes)]
    slices.append(ResourceSlice.from_json(_parts("zz-parts")))
    classes = {"gpu.nvidia.com": DeviceClass.from_json(device_class())}
    node_objs = [Node.make(f"node-{n:05d}") for n in range(nodes)] + [Node.make("zz-parts")]
    index = SliceIndex(slices)
    hopeless = _claim("hopeless", ("parts", 25, 'device.attributes["gpu.nvidia.com"].type == "gpu"'))
    print(f"--- {nodes} nodes x 8 GPUs and a node of 48 partitions; search budget {budget:g} s", flush=True)

    # Inline: the search on the loop.
    planner = Planner(classes=classes, slices=index, nodes=node_objs, policy="bin-pack")

    async def inline() -> None:
        outcome = planner.plan([hopeless], node="zz-parts", budget=WorkBudget(budget))
        assert isinstance(outcome, OutOfBudget), outcome

    lag, ticks, took = asyncio.run(_loop_lag(inline))
    print(f"inline:  the loop waited up to {1000 * lag:.0f} ms ({ticks} ticks in {took:.2f} s)")

    # Thread: from a snapshot, the way the operator does it.
    snapshot = PlannerSnapshot(
        slices=index,
        classes=dict(classes),
        nodes=node_objs,
        allocations=[],
        gates=planner.gates,
        policy="first-fit",
    )

    async def threaded() -> None:
        outcome, _ = await asyncio.to_thread(snapshot.plan, [hopeless], budget_s=budget)
        assert isinstance(outcome, OutOfBudget | NotPlaced), outcome

    lag, ticks, took = asyncio.run(_loop_lag(threaded))
    print(f"thread:  the loop waited up to {1000 * lag:.0f} ms ({ticks} ticks of 5 ms in {took:.2f} s)")

    # Process: the snapshot has to reach it first, for every search. The model's objects are
    # read-only views (mappingproxy) that do not pickle: what would travel is their JSON.
    started = time.perf_counter()
    data = json.dumps([s.to_json() for s in slices])
    sent = time.perf_counter() - started
    started = time.perf_counter()
    SliceIndex([ResourceSlice.from_json(obj) for obj in json.loads(data)])
    received = time.perf_counter() - started
    print(
        f"process: the slices as JSON in {sent:.2f} s ({len(data) / 2**20:.0f} MiB), parsed and indexed "
        f"there in {received:.2f} s, for every search (the model changes between searches)"
    )

    # The feasibility check: the claim, refused on every node without a search.
    same = _claim(
        "same-devices",
        ("a", 5, 'has(device.attributes["gpu.nvidia.com"].productName)'),
        ("b", 4, 'device.attributes["gpu.nvidia.com"].?brand.orValue("") == "Nvidia"'),
    )
    for feasibility in (True, False):
        checked = Planner(classes=classes, slices=index, nodes=node_objs, feasibility=feasibility)
        started = time.perf_counter()
        outcome = checked.plan([same], budget=WorkBudget(600.0 if feasibility else budget))
        took = time.perf_counter() - started
        what = type(outcome).__name__
        tried = getattr(outcome, "tried", "-")
        print(
            f"{'with' if feasibility else 'without'} the check: the issue's claim -> {what} in {took:.2f} s "
            f"({1e6 * took / (nodes + 1):.0f} us a node; {tried} nodes searched)"
        )
    # A claim no node can hold is refused with an explanation, again on every cluster change.
    nine = _claim("nine", ("gpu", 9, 'has(device.attributes["gpu.nvidia.com"].productName)'))
    refusing = Planner(classes=classes, slices=index, nodes=node_objs)
    refusing.plan([nine])
    spent = []
    for _ in range(20):
        started = time.thread_time()
        refused = refusing.plan([nine])
        spent.append(time.thread_time() - started)
    assert isinstance(refused, NotPlaced), refused
    print(f"a claim for 9 whole GPUs (no node has 9): refused with its explanation in p50 "
          f"{1000 * statistics.median(spent):.1f} ms CPU")  # fmt: skip
    ordinary = _claim("one", ("gpu", 1, 'device.attributes["gpu.nvidia.com"].type == "gpu"'))
    pair = _claim("pair", ("gpu", 2, 'device.attributes["gpu.nvidia.com"].type == "gpu"'))
    for claim in (ordinary, pair):
        for feasibility in (True, False):
            checked = Planner(classes=classes, slices=index, nodes=node_objs, feasibility=feasibility)
            checked.plan([claim])  # the index's first evaluation, outside the figure
            times = []
            for _ in range(200):
                started = time.perf_counter()
                checked.plan([claim])
                times.append(time.perf_counter() - started)
            print(
                f"  claim {claim.name}: placement p50 {1e6 * statistics.median(times):.0f} us "
                f"{'with' if feasibility else 'without'} the check"
            )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000", help="comma-separated node counts")
    parser.add_argument("--budget", type=float, default=2.0, help="the hopeless search's budget, seconds")
    args = parser.parse_args(argv)
    for n in (int(x) for x in args.nodes.split(",")):
        run(n, args.budget)


if __name__ == "__main__":
    main()
