"""The NVML probe over ``FakeNvmlHealth``: the event thread, XID filtering, MIG attribution, polls."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from dra_node_agent.health.probe import XidReport
from dra_node_agent.health.state import Observation, ProblemKind
from dra_node_agent.nvidia.health_probe import DEFAULT_IGNORED_XIDS, NvmlHealthProbe, parse_xid_list
from dra_node_agent.simulated.health_probe import FakeNvmlHealth
from tests.unit.agent.health.fakes import Clock, a100_mig, discover, fake_nvml, h100

WAIT = 10.0  # generous upper bound for the event thread to hand over an observation


class Collected:
    def __init__(self) -> None:
        self.observations: queue.Queue[Observation] = queue.Queue()
        self.xids: queue.Queue[XidReport] = queue.Queue()

    def next_observation(self) -> Observation:
        return self.observations.get(timeout=WAIT)

    def next_xid(self) -> XidReport:
        return self.xids.get(timeout=WAIT)


@pytest.fixture
def fake() -> FakeNvmlHealth:
    return fake_nvml(h100(0), h100(1), a100_mig(2))


@pytest.fixture
def started(fake: FakeNvmlHealth, tmp_path: Path) -> Iterator[tuple[NvmlHealthProbe, Collected]]:
    probe = NvmlHealthProbe(nvml=fake, event_timeout_ms=50, clock=Clock())
    got = Collected()
    fake.nvmlInitWithFlags(0)
    devices = discover(fake, tmp_path)
    probe.start(devices=devices, emit=got.observations.put, xid=got.xids.put)
    yield probe, got
    probe.stop()
    fake.nvmlShutdown()


def test_default_application_xids() -> None:
    assert {13, 31, 43, 45, 68, 109} == DEFAULT_IGNORED_XIDS


def test_registers_xid_and_double_bit_events_on_each_physical_gpu(
    started: tuple[NvmlHealthProbe, Collected], fake: FakeNvmlHealth
) -> None:
    (event_set,) = fake.event_sets
    wanted = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
    assert event_set.registered == {gpu.uuid: wanted for gpu in fake.gpus}


def test_fatal_xid_becomes_an_observation(
    started: tuple[NvmlHealthProbe, Collected], fake: FakeNvmlHealth
) -> None:
    _, got = started
    fake.inject_xid(fake.gpus[1].uuid, 79)
    assert got.next_xid() == XidReport(device="gpu-1", xid=79, fatal=True)
    observation = got.next_observation()
    assert (observation.device, observation.kind, observation.value) == ("gpu-1", ProblemKind.XID, "79")


def test_application_xid_is_counted_but_not_a_problem(
    started: tuple[NvmlHealthProbe, Collected], fake: FakeNvmlHealth
) -> None:
    _, got = started
    fake.inject_xid(fake.gpus[0].uuid, 13)
    fake.inject_xid(fake.gpus[0].uuid, 48)
    assert got.next_xid() == XidReport(device="gpu-0", xid=13, fatal=False)
    assert got.next_xid() == XidReport(device="gpu-0", xid=48, fatal=True)
    assert got.next_observation().value == "48"  # 13 produced none before it
    assert got.observations.empty()


def test_configured_ignore_list(fake: FakeNvmlHealth, tmp_path: Path) -> None:
    probe = NvmlHealthProbe(nvml=fake, event_timeout_ms=50, ignored_xids={79})
    got = Collected()
    probe.start(devices=discover(fake, tmp_path), emit=got.observations.put, xid=got.xids.put)
    try:
        fake.inject_xid(fake.gpus[0].uuid, 79)
        fake.inject_xid(fake.gpus[0].uuid, 13)
        assert got.next_xid().fatal is False
        assert got.next_xid().fatal is True
        assert got.next_observation().value == "13"
    finally:
        probe.stop()


def test_mig_event_goes_to_its_instance_and_whole_gpu_events_to_all(
    started: tuple[NvmlHealthProbe, Collected], fake: FakeNvmlHealth
) -> None:
    _, got = started
    a100 = fake.gpus[2].uuid
    fake.inject_xid(a100, 94, gi=7, ci=0)
    assert got.next_observation().device == "gpu-2-mig-1g5gb-19-0"
    fake.inject_event(a100, event_type=pynvml.nvmlEventTypeDoubleBitEccError)
    hit = {got.next_observation().device, got.next_observation().device}
    assert hit == {"gpu-2-mig-1g5gb-19-0", "gpu-2-mig-3g20gb-9-4"}


def test_lost_gpu_during_wait_marks_the_gpu_that_is_lost(
    started: tuple[NvmlHealthProbe, Collected], fake: FakeNvmlHealth
) -> None:
    _, got = started
    fake.lose(fake.gpus[2].uuid)
    seen = {got.next_observation(), got.next_observation()}
    assert {o.kind for o in seen} == {ProblemKind.GPU_LOST}
    assert {o.device for o in seen} == {"gpu-2-mig-1g5gb-19-0", "gpu-2-mig-3g20gb-9-4"}
    assert got.observations.empty()


def test_lost_gpu_nobody_owns_marks_every_device(
    started: tuple[NvmlHealthProbe, Collected], fake: FakeNvmlHealth
) -> None:
    _, got = started
    fake.event_sets[0].queue.put(pynvml.NVML_ERROR_GPU_IS_LOST)  # every GPU still answers
    seen = {got.next_observation() for _ in range(4)}
    assert {o.kind for o in seen} == {ProblemKind.GPU_LOST}
    assert {o.device for o in seen} == {"gpu-0", "gpu-1", "gpu-2-mig-1g5gb-19-0", "gpu-2-mig-3g20gb-9-4"}
    assert {o.message for o in seen} == {"NVML reports a lost GPU it cannot name"}


def test_stop_frees_the_event_set_and_shuts_nvml_down(fake: FakeNvmlHealth, tmp_path: Path) -> None:
    probe = NvmlHealthProbe(nvml=fake, event_timeout_ms=50)
    probe.start(devices=discover(fake, tmp_path), emit=lambda o: None, xid=lambda r: None)
    (event_set,) = fake.event_sets
    probe.stop()
    assert event_set.freed
    assert fake.shutdown_count == fake.init_count


def test_unsupported_events_leave_the_gpu_polled(fake: FakeNvmlHealth, tmp_path: Path) -> None:
    fake.health[fake.gpus[0].uuid].events_supported = 0
    probe = NvmlHealthProbe(nvml=fake, event_timeout_ms=50)
    probe.start(devices=discover(fake, tmp_path), emit=lambda o: None, xid=lambda r: None)
    try:
        assert fake.gpus[0].uuid not in fake.event_sets[0].registered
        result = probe.poll(devices=discover(fake, tmp_path), now=1.0)
        assert Observation(device="gpu-0", time=1.0) in result.observations
    finally:
        probe.stop()


def test_poll_reads_telemetry_in_base_units(fake: FakeNvmlHealth, tmp_path: Path) -> None:
    readings = fake.health[fake.gpus[0].uuid]
    readings.temperature = 71
    readings.power_mw = 312_500
    readings.memory_used = 5 << 30
    readings.ecc = {
        (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): 12,
        (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 0,
    }
    readings.remapped_rows = (3, 0, 0, 0)
    probe = NvmlHealthProbe(nvml=fake)
    fake.nvmlInitWithFlags(0)
    devices = discover(fake, tmp_path)
    result = probe.poll(devices=devices, now=5.0)
    telemetry = result.telemetry["gpu-0"]
    assert telemetry.temperature_celsius == 71.0
    assert telemetry.power_watts == 312.5
    assert telemetry.memory_used_bytes == 5 << 30
    assert telemetry.memory_total_bytes == fake.gpus[0].memory_total
    assert telemetry.ecc_errors[("corrected", "aggregate")] == 12
    assert telemetry.remapped_rows == {"correctable": 3, "uncorrectable": 0}
    assert telemetry.row_remap_failure is False
    assert "gpu-2-mig-1g5gb-19-0" not in result.telemetry  # MIG devices: health only
    assert {o.device for o in result.observations if o.kind is None} == {d.name for d in devices}


def test_poll_problems_row_remap_new_uncorrected_ecc_and_lost(fake: FakeNvmlHealth, tmp_path: Path) -> None:
    probe = NvmlHealthProbe(nvml=fake, temperature_limit=90)
    fake.nvmlInitWithFlags(0)
    devices = discover(fake, tmp_path)
    probe.poll(devices=devices, now=1.0)
    fake.health[fake.gpus[0].uuid].remapped_rows = (0, 1, 0, 1)
    fake.health[fake.gpus[1].uuid].ecc = {
        (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 2
    }
    fake.health[fake.gpus[2].uuid].temperature = 95
    result = probe.poll(devices=devices, now=2.0)
    problems = {(o.device, o.value) for o in result.observations if o.kind is not None}
    assert problems == {
        ("gpu-0", "row-remap-failure"),
        ("gpu-1", "ecc-uncorrected"),
        ("gpu-2-mig-1g5gb-19-0", "over-temperature"),
        ("gpu-2-mig-3g20gb-9-4", "over-temperature"),
    }
    # The ECC count did not move again: no new problem from it.
    fake.lose(fake.gpus[1].uuid, via_event=False)
    result = probe.poll(devices=devices, now=3.0)
    lost = [o for o in result.observations if o.device == "gpu-1"]
    assert [(o.kind, o.value) for o in lost] == [(ProblemKind.GPU_LOST, "")]
    assert result.telemetry["gpu-1"].temperature_celsius is None


def test_parse_xid_list() -> None:
    assert parse_xid_list("13, 31,,43") == {13, 31, 43}
    assert parse_xid_list([1, 2]) == {1, 2}
    assert parse_xid_list("") == frozenset()
    with pytest.raises(ValueError, match=r"XID list '13,x': 'x' is not a non-negative integer"):
        parse_xid_list("13,x")
