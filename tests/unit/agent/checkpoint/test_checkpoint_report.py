"""A checkpoint that fails closed says so: one CheckpointCorrupted Event per reason, a gauge, no storm."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from prometheus_client import REGISTRY

from dra_api.kubeletapi.model import ClaimRef
from dra_node_agent import checkpoint as cp
from dra_node_agent.checkpoint_report import (
    MAX_DETAIL,
    REASON,
    RECOVERY_SECTION,
    CorruptionReporter,
    corruption_message,
)
from dra_node_agent.claim_reader import ClaimAllocation, ClaimGone
from dra_node_agent.health.events import NodeEvents
from dra_node_agent.prepare import PrepareHandler
from dra_node_agent.simulated.discovery import SimulatedBackend

NODE = "node-a"


class Recorder:
    """Records the Events it is given, as `NodeEvents` would post them."""

    def __init__(self, *, fail: bool = False, hold: asyncio.Event | None = None) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.fail = fail
        self.hold = hold

    async def record(self, *, type: str, reason: str, message: str) -> None:
        if self.hold is not None:
            await self.hold.wait()
        if self.fail:
            raise RuntimeError("API server unreachable")
        self.events.append((type, reason, message))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class NoClaims:
    async def read(self, ref: ClaimRef) -> ClaimAllocation:
        raise ClaimGone(f"ResourceClaim {ref.namespace}/{ref.name}: not found")


def gauge(driver: str) -> float | None:
    return REGISTRY.get_sample_value("dra_agent_checkpoint_corrupt", {"driver": driver})


def corrupt_file(path: Path) -> None:
    """A checkpoint whose content no longer matches its checksum."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"driver": "x", "nodeBootID": "boot-1", "preparedClaims": {}}
    doc = {"apiVersion": cp.API_VERSION, "kind": cp.KIND, "checksum": "sha256:" + "0" * 64, "data": data}
    path.write_text(json.dumps(doc))


@pytest.fixture
def boot_id(tmp_path: Path) -> Path:
    path = tmp_path / "proc/sys/kernel/random/boot_id"
    path.parent.mkdir(parents=True)
    path.write_text("boot-1\n")
    return path


async def handler_on_corrupt_file(tmp_path: Path, driver: str) -> PrepareHandler:
    backend = SimulatedBackend(
        profile="h100-80gb-x8", node_name=NODE, state_dir=tmp_path / "hw", driver=driver
    )
    handler = PrepareHandler(
        driver=driver,
        node_name=NODE,
        inventory=await backend.discover(),
        claims=NoClaims(),
        state_dir=tmp_path / "state" / driver,
        cdi_dir=tmp_path / "cdi",
        proc_root=tmp_path / "proc",
    )
    corrupt_file(handler.store.path)
    return handler


def test_message_names_the_file_the_reason_what_is_refused_and_the_way_out(tmp_path: Path) -> None:
    path = tmp_path / "gpu.nvidia.com" / "checkpoint.json"
    error = cp.CheckpointCorrupt(f"checkpoint {path}: checksum mismatch (file says 'x', content is y)")
    message = corruption_message(driver="gpu.nvidia.com", path=path, error=error)
    assert message == (
        f"Checkpoint {path} of driver gpu.nvidia.com cannot be trusted: checksum mismatch (file says "
        "'x', content is y). Every prepare and unprepare of gpu.nvidia.com claims on this node fails "
        "closed until it is fixed; the agent keeps the file untouched and never discards it. To "
        f"recover, see {RECOVERY_SECTION}."
    )


def test_a_long_reason_is_cut_and_the_way_out_stays(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    error = cp.CheckpointCorrupt(f"checkpoint {path}: not valid JSON ({'x' * 5000})")
    message = corruption_message(driver="gpu.nvidia.com", path=path, error=error)
    assert message.endswith(f"To recover, see {RECOVERY_SECTION}.")
    assert "x" * (MAX_DETAIL - 20) + "..." in message
    assert "x" * MAX_DETAIL not in message
    assert len(message) < 1024  # NodeEvents keeps 1024 characters


async def test_a_corrupt_checkpoint_posts_one_event_however_often_calls_are_refused(
    tmp_path: Path, boot_id: Path
) -> None:
    driver = "once.nvidia.com"
    handler = await handler_on_corrupt_file(tmp_path, driver)
    recorder = Recorder()
    reporter = CorruptionReporter(
        driver=driver, path=handler.store.path, events=recorder, loop=asyncio.get_running_loop()
    )
    handler.store.add_corruption_listener(reporter)
    assert gauge(driver) == 0.0
    await handler.start()  # the store's calls run in threads, as in the agent
    assert gauge(driver) == 1.0
    for n in range(5):
        claim = ClaimRef(namespace="ns", name=f"c{n}", uid=f"uid-{n}")
        assert "checkpoint is corrupt" in (await handler.prepare([claim]))[claim.uid].error
        assert "checkpoint is corrupt" in (await handler.unprepare([claim]))[claim.uid]
    await handler.clean_up_stale(older_than=0)
    await reporter.aclose()
    assert reporter.reported == 1
    ((type_, reason, message),) = recorder.events
    assert (type_, reason) == ("Warning", REASON)
    assert (
        f"Checkpoint {handler.store.path} of driver {driver} cannot be trusted: checksum mismatch" in message
    )
    assert gauge(driver) == 1.0


async def test_the_same_reason_is_posted_again_only_after_the_repeat_interval(tmp_path: Path) -> None:
    driver = "repeat.nvidia.com"
    clock = Clock()
    recorder = Recorder()
    path = tmp_path / "checkpoint.json"
    reporter = CorruptionReporter(
        driver=driver,
        path=path,
        events=recorder,
        loop=asyncio.get_running_loop(),
        repeat_after=600,
        clock=clock,
    )
    error = cp.CheckpointCorrupt(f"checkpoint {path}: top level is not an object")
    reporter(error)
    clock.now += 599
    reporter(error)
    await reporter.aclose()
    assert len(recorder.events) == 1
    clock.now += 1
    reporter(error)
    reporter(error)
    await reporter.aclose()
    assert len(recorder.events) == 2
    assert recorder.events[0] == recorder.events[1]


async def test_each_distinct_reason_is_posted_once(tmp_path: Path) -> None:
    driver = "distinct.nvidia.com"
    recorder = Recorder()
    path = tmp_path / "checkpoint.json"
    reporter = CorruptionReporter(
        driver=driver, path=path, events=recorder, loop=asyncio.get_running_loop(), clock=Clock()
    )
    json_error = cp.CheckpointCorrupt(f"checkpoint {path}: not valid JSON (Expecting value)")
    version_error = cp.CheckpointCorrupt(f"checkpoint {path}: unknown version 'v9' kind 'Checkpoint'")
    for error in (json_error, version_error, json_error, version_error):
        reporter(error)
    await reporter.aclose()
    assert [m.split(": ", 1)[1].split(".")[0] for _, _, m in recorder.events] == [
        "not valid JSON (Expecting value)",
        "unknown version 'v9' kind 'Checkpoint'",
    ]


async def test_quarantine_clears_the_gauge_and_a_new_corruption_is_reported_again(
    tmp_path: Path, boot_id: Path
) -> None:
    driver = "quarantine.nvidia.com"
    recorder = Recorder()
    path = tmp_path / "state" / "checkpoint.json"
    store = cp.CheckpointStore(path, boot_id, driver=driver)
    reporter = CorruptionReporter(driver=driver, path=path, events=recorder, loop=asyncio.get_running_loop())
    store.add_corruption_listener(reporter)
    corrupt_file(path)
    with pytest.raises(cp.CheckpointCorrupt):
        await asyncio.to_thread(store.load)
    assert gauge(driver) == 1.0

    aside = await asyncio.to_thread(store.quarantine)
    assert aside is not None
    assert aside.exists()
    assert gauge(driver) == 0.0
    assert await asyncio.to_thread(store.load) == []
    assert gauge(driver) == 0.0

    corrupt_file(path)  # the same damage again, after the recovery: a new incident
    with pytest.raises(cp.CheckpointCorrupt):
        await asyncio.to_thread(store.load)
    await reporter.aclose()
    assert gauge(driver) == 1.0
    assert len(recorder.events) == 2


async def test_a_failing_post_is_logged_and_never_fails_a_prepare(
    tmp_path: Path, boot_id: Path, caplog: pytest.LogCaptureFixture
) -> None:
    driver = "failing.nvidia.com"
    handler = await handler_on_corrupt_file(tmp_path, driver)
    reporter = CorruptionReporter(
        driver=driver, path=handler.store.path, events=Recorder(fail=True), loop=asyncio.get_running_loop()
    )
    handler.store.add_corruption_listener(reporter)
    with caplog.at_level(logging.WARNING, logger="dra_node_agent.checkpoint_report"):
        await handler.start()
        claim = ClaimRef(namespace="ns", name="c", uid="uid-c")
        result = (await handler.prepare([claim]))[claim.uid]
        await reporter.aclose()
    assert "checkpoint is corrupt" in result.error
    assert f"cannot post the {REASON} Event: API server unreachable" in caplog.text
    assert gauge(driver) == 1.0


async def test_a_post_that_hangs_does_not_hold_up_prepare(tmp_path: Path, boot_id: Path) -> None:
    driver = "hanging.nvidia.com"
    handler = await handler_on_corrupt_file(tmp_path, driver)
    never = asyncio.Event()
    recorder = Recorder(hold=never)
    reporter = CorruptionReporter(
        driver=driver, path=handler.store.path, events=recorder, loop=asyncio.get_running_loop()
    )
    handler.store.add_corruption_listener(reporter)
    await handler.start()
    claim = ClaimRef(namespace="ns", name="c", uid="uid-c")
    assert "checkpoint is corrupt" in (await handler.prepare([claim]))[claim.uid].error
    assert reporter.reported == 1
    await reporter.aclose(grace=0)  # the stuck post is cancelled at stop
    assert recorder.events == []


def test_a_refusal_after_the_loop_closed_still_sets_the_gauge(tmp_path: Path) -> None:
    driver = "closed.nvidia.com"
    loop = asyncio.new_event_loop()
    loop.close()
    reporter = CorruptionReporter(driver=driver, path=tmp_path / "c.json", events=Recorder(), loop=loop)
    reporter(cp.CheckpointCorrupt("checkpoint c.json: top level is not an object"))
    assert gauge(driver) == 1.0


def test_a_listener_that_raises_does_not_change_what_the_store_answers(
    tmp_path: Path, boot_id: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "checkpoint.json"
    store = cp.CheckpointStore(path, boot_id)
    seen: list[cp.CheckpointCorrupt | None] = []

    def broken(error: cp.CheckpointCorrupt | None) -> None:
        seen.append(error)
        raise ValueError("bug")

    store.add_corruption_listener(broken)
    corrupt_file(path)
    with caplog.at_level(logging.ERROR), pytest.raises(cp.CheckpointCorrupt, match="checksum mismatch"):
        store.load()
    with pytest.raises(cp.CheckpointCorrupt):
        store.get("uid")
    assert len(seen) == 2
    assert seen[0] is seen[1]
    assert "corruption listener failed" in caplog.text


class FakeCore:
    def __init__(self, *, node_readable: bool) -> None:
        self.node_readable = node_readable
        self.bodies: list[dict[str, Any]] = []

    async def read_node(self, name: str) -> Any:
        if not self.node_readable:
            raise RuntimeError("forbidden")

        class Meta:
            uid = "node-uid-1"

        class Node:
            metadata = Meta()

        return Node()

    async def create_namespaced_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.bodies.append(body)


@pytest.mark.parametrize("node_readable", [True, False])
async def test_node_event_names_the_driver_and_the_node_uid_when_known(node_readable: bool) -> None:
    core = FakeCore(node_readable=node_readable)
    async with client.ApiClient() as api:
        events = NodeEvents(api=api, node_name=NODE, component="gpu.nvidia.com")
        events._core = core  # type: ignore[assignment]
        await events.record(type="Warning", reason=REASON, message="m")
    (body,) = core.bodies
    assert body["reportingComponent"] == body["source"]["component"] == "gpu.nvidia.com"
    assert body["involvedObject"]["kind"] == "Node"
    assert body["involvedObject"]["name"] == NODE
    assert body["involvedObject"].get("uid") == ("node-uid-1" if node_readable else None)
    assert (body["type"], body["reason"], body["message"]) == ("Warning", REASON, "m")
