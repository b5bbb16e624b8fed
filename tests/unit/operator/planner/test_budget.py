"""One work budget per placement, across every node, CEL included; what a placement that runs out says.

Budgets here run on a counting clock (each reading advances it by one tick), so when they run out
does not depend on the machine's speed.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from dra_api.model import DeviceClass, Node, ResourceClaim, ResourceSlice
from dra_operator.cel import BudgetExhausted, WorkBudget, charged_to, compile_selector
from dra_operator.cel.selector import DeviceInput
from dra_operator.planner import NotPlaced, OutOfBudget, Planner

V1 = "resource.k8s.io/v1"
DRIVER = "gpu.example.com"
CLASS = DeviceClass.from_json(
    {
        "apiVersion": V1,
        "kind": "DeviceClass",
        "metadata": {"name": "gpu"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
)


def ticks(seconds: float) -> WorkBudget:
    """A budget of ``seconds`` clock readings."""
    counter = itertools.count()
    return WorkBudget(seconds, clock=lambda: float(next(counter)))


def split_counters_slice(node: str, *, per_set: int = 24, capacity: int = 12) -> dict[str, Any]:
    """A node whose devices consume one of two counter sets, each with room for ``capacity``
    devices: no more than 2 x ``capacity`` of them fit at once, which no per-device check sees."""
    devices = [
        {
            "name": f"part-{set_name}-{i}",
            "consumesCounters": [{"counterSet": set_name, "counters": {"units": {"value": "1"}}}],
        }
        for set_name in ("a", "b")
        for i in range(per_set)
    ]
    return {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": node},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "sharedCounters": [
                {"name": name, "counters": {"units": {"value": str(capacity)}}} for name in ("a", "b")
            ],
            "devices": devices,
        },
    }


def claim(count: int, *, name: str = "hard") -> ResourceClaim:
    return ResourceClaim.from_json(
        {
            "apiVersion": V1,
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {
                "devices": {
                    "requests": [{"name": "parts", "exactly": {"deviceClassName": "gpu", "count": count}}]
                }
            },
        }
    )


def planner(nodes: int) -> Planner:
    slices = [ResourceSlice.from_json(split_counters_slice(f"n{i}")) for i in range(nodes)]
    return Planner(classes=[CLASS], slices=slices, nodes=[Node.make(f"n{i}") for i in range(nodes)])


def test_a_hopeless_search_stops_at_the_budget_across_nodes() -> None:
    # 25 parts where only 24 fit: the counts pass, the search tries every combination.
    outcome = planner(3).plan([claim(25)], budget=ticks(20))
    assert isinstance(outcome, OutOfBudget)
    assert outcome.tried <= 3
    text = outcome.explanation.full
    assert text.startswith("claim ns/hard: the search used its budget")
    assert "the search was cut short on node n" in text
    assert "to change:" in text
    assert len(outcome.explanation.short) <= 1024


def test_the_same_claim_within_its_room_is_placed_under_the_same_budget() -> None:
    outcome = planner(3).plan([claim(24)], budget=ticks(100_000))
    assert not isinstance(outcome, OutOfBudget | NotPlaced), outcome


def test_without_a_budget_nothing_is_cut_short() -> None:
    # A small node: the search ends on its own (and finds nothing).
    small = Planner(
        classes=[CLASS],
        slices=[ResourceSlice.from_json(split_counters_slice("n0", per_set=4, capacity=2))],
        nodes=[Node.make("n0")],
    )
    outcome = small.plan([claim(5)])
    assert isinstance(outcome, NotPlaced)


def test_an_interrupted_index_evaluation_leaves_the_index_whole() -> None:
    # CEL that reads every attribute, cut short in the middle of a node: the node is evaluated
    # again next time, never counted with part of its devices.
    selector = f'device.attributes["{DRIVER}"].all(k, device.attributes["{DRIVER}"].all(j, k != j + "x"))'
    slices = [
        ResourceSlice.from_json(
            {
                "apiVersion": V1,
                "kind": "ResourceSlice",
                "metadata": {"name": "n0"},
                "spec": {
                    "driver": DRIVER,
                    "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1},
                    "nodeName": "n0",
                    "devices": [
                        {"name": f"gpu-{i}", "attributes": {f"a{k}": {"int": i * 100 + k} for k in range(8)}}
                        for i in range(4)
                    ],
                },
            }
        )
    ]
    body = claim(2).to_json()
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
    pending = ResourceClaim.from_json(body)
    p = Planner(classes=[CLASS], slices=slices, nodes=[Node.make("n0")])
    assert isinstance(p.plan([pending], budget=ticks(3)), OutOfBudget)
    assert p.index.count_problems() == []
    placed = p.plan([pending])
    assert not isinstance(placed, OutOfBudget | NotPlaced), placed
    assert p.index.count_problems() == []


def test_cel_checks_the_budget_of_its_thread() -> None:
    selector = compile_selector('device.attributes["d"].all(a, device.attributes["d"].all(b, a != b + "x"))')
    device = DeviceInput(
        driver="d",
        attributes={f"d/a{i}": f"v{i}" for i in range(4)},
        capacity={},
        allow_multiple_allocations=False,
    )
    with charged_to(ticks(0)), pytest.raises(BudgetExhausted):  # the first reading is past it
        selector.matches(device)
    # Nothing was remembered of the interrupted evaluation: without a budget it answers.
    assert selector.matches(device) is True


def test_the_cost_limit_is_upstreams() -> None:
    from dra_operator.cel import CelRuntimeError

    over = compile_selector("lists.range(1000).all(i, lists.range(1000).all(j, true))")
    with pytest.raises(CelRuntimeError, match=r"actual cost limit exceeded \(1000000 units\)"):
        over.matches(DeviceInput(driver="d", attributes={}, capacity={}, allow_multiple_allocations=False))
    under = compile_selector("lists.range(300).all(i, lists.range(300).all(j, true))")
    assert under.matches(
        DeviceInput(driver="d", attributes={}, capacity={}, allow_multiple_allocations=False)
    )


async def test_a_long_selector_is_compiled_off_the_loop() -> None:
    from dra_operator.cel.selector import INLINE_COMPILE_BYTES, is_compiled

    expression = " || ".join(f"device.driver == 'x{i}-long-selector-of-this-test'" for i in range(12))
    assert len(expression) > INLINE_COMPILE_BYTES
    with charged_to(WorkBudget.loop_slice(60.0)), pytest.raises(BudgetExhausted):
        compile_selector(expression)  # within a slice of the loop: handed to a worker thread
    for _ in range(500):
        if is_compiled(expression):
            break
        await asyncio.sleep(0.01)
    with charged_to(WorkBudget.loop_slice(60.0)):
        assert compile_selector(expression).expression == expression  # cached now
    # Outside the loop's slices (a worker thread, the command line) it compiles where it is.
    other = expression.replace("x0-", "y0-")
    with charged_to(WorkBudget.thread_cpu(60.0)):
        assert compile_selector(other).expression == other
