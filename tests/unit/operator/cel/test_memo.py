"""Selectors are evaluated once per distinct projection of the device onto what they read."""

from __future__ import annotations

import time

import pytest

from dra_api.attributes import UnsupportedAttribute, Version
from dra_api.quantity import Quantity
from dra_operator.cel import CelRuntimeError, DeviceInput, compile_selector, evaluation_count
from dra_operator.cel.selector import MEMO_SIZE

from .conftest import DRIVER, make_device

A = f'device.attributes["{DRIVER}"]'


def fresh(expression: str) -> str:
    # compile_selector caches by text; a unique comment-free suffix gives each test its own memo.
    return f"({expression}) && true"


def test_8000_devices_differing_in_an_unread_attribute_cost_one_evaluation() -> None:
    selector = compile_selector(fresh(f'{A}.model == "A100" && {A}.numa == 0'))
    before = evaluation_count()
    results = [selector.matches(make_device(uuid=f"GPU-{i}")) for i in range(8000)]
    assert all(results)
    assert selector.evaluations == 1
    assert evaluation_count() - before == 1


def test_one_evaluation_per_distinct_value_of_a_read_attribute() -> None:
    selector = compile_selector(fresh(f"{A}.numa < 2"))
    devices = [make_device(numa=i % 4, uuid=f"GPU-{i}") for i in range(8000)]
    results = [selector.matches(d) for d in devices]
    assert results == [d.attributes["numa"] < 2 for d in devices]  # type: ignore[operator]
    assert selector.evaluations == 4


def test_values_of_different_types_are_not_confused() -> None:
    selector = compile_selector(fresh(f"{A}.flagOrInt == true"))
    assert selector.matches(make_device(flagOrInt=True)) is True
    assert selector.matches(make_device(flagOrInt=1)) is False  # int is never equal to bool in CEL
    assert selector.evaluations == 2


def test_unqualified_and_qualified_names_share_a_projection() -> None:
    selector = compile_selector(fresh(f'{A}.model == "A100"'))
    unqualified = DeviceInput(driver=DRIVER, attributes={"model": "A100", "x": 1}, capacity={})
    qualified = DeviceInput(driver=DRIVER, attributes={f"{DRIVER}/model": "A100", "x": 2}, capacity={})
    assert selector.matches(unqualified)
    assert selector.matches(qualified)
    assert selector.evaluations == 1


def test_the_driver_is_part_of_the_projection_only_when_read() -> None:
    reads_driver = compile_selector(fresh('device.driver == "a.example.com"'))
    blind = compile_selector(fresh('device.attributes["shared.example.com"].x == 1'))
    for driver in ("a.example.com", "b.example.com", "c.example.com"):
        device = DeviceInput(driver=driver, attributes={"shared.example.com/x": 1}, capacity={})
        assert reads_driver.matches(device) is (driver == "a.example.com")
        assert blind.matches(device)
    assert reads_driver.evaluations == 3
    assert blind.evaluations == 1


def test_whole_domain_reads_widen_the_projection() -> None:
    selector = compile_selector(fresh(f'{A}.exists(k, k == "special")'))
    assert selector.reads.domains == {("attributes", DRIVER)}
    for i in range(10):
        assert not selector.matches(make_device(uuid=f"GPU-{i}"))
    assert selector.evaluations == 10
    # A different domain is not read.
    for i in range(10):
        device = make_device(**{"other.example.com/serial": f"S{i}"})
        assert not selector.matches(device)
    assert selector.evaluations == 11


def test_unanalysable_use_of_device_projects_onto_the_whole_device() -> None:
    selector = compile_selector(fresh('cel.bind(d, device, d.driver == "x")'))
    assert selector.reads.whole_device
    for i in range(5):
        selector.matches(make_device(uuid=f"GPU-{i}"))
    assert selector.evaluations == 5


def test_runtime_index_widens_to_the_whole_map() -> None:
    selector = compile_selector(fresh("device.attributes[device.driver].numa == 0"))
    assert selector.reads.driver
    assert "attributes" in selector.reads.whole_kind
    assert selector.matches(make_device())


def test_capacity_projection() -> None:
    selector = compile_selector(fresh(f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'))
    for size in ("80Gi", "16Gi", "80Gi", "85899345920", "16Gi", "81920Mi"):
        device = DeviceInput(driver=DRIVER, attributes={}, capacity={"memory": Quantity.parse(size)})
        assert selector.matches(device) is (size != "16Gi")
    # 80Gi and 85899345920 are equal values in different formats: counted apart, which is harmless.
    assert selector.evaluations == 3


def test_errors_are_memoized_per_projection() -> None:
    selector = compile_selector(fresh(f"{A}.missing == 1"))
    for i in range(100):
        with pytest.raises(CelRuntimeError, match="no such key: missing"):
            selector.matches(make_device(uuid=f"GPU-{i}"))
    assert selector.evaluations == 1


def test_presence_test_reads_one_entry() -> None:
    selector = compile_selector(fresh(f'"numa" in {A}'))
    assert selector.reads.entries == {("attributes", DRIVER, "numa")}
    assert not selector.reads.domains
    for i in range(20):
        assert selector.matches(make_device(uuid=f"GPU-{i}"))
    assert selector.evaluations == 1


def test_optional_selection_reads_one_entry() -> None:
    selector = compile_selector(fresh(f'{A}.?model.orValue("") == "A100" && {A}[?"numa"].hasValue()'))
    assert selector.reads.entries == {("attributes", DRIVER, "model"), ("attributes", DRIVER, "numa")}
    for i in range(20):
        assert selector.matches(make_device(uuid=f"GPU-{i}"))
    assert selector.evaluations == 1


def test_unsupported_attribute_fails_every_selector_without_evaluating() -> None:
    selector = compile_selector(fresh('device.driver == "gpu.example.com"'))
    device = make_device(broken=UnsupportedAttribute("unsupported attribute value"))
    with pytest.raises(CelRuntimeError, match="attribute broken: unsupported attribute value"):
        selector.matches(device)
    assert selector.evaluations == 0


def test_memo_is_bounded() -> None:
    selector = compile_selector(fresh(f"{A}.serial >= 0"))
    for i in range(MEMO_SIZE + 50):
        assert selector.matches(make_device(serial=i))
    assert selector.memo_size() == MEMO_SIZE
    # The oldest entry was evicted, the newest kept.
    count = selector.evaluations
    selector.matches(make_device(serial=MEMO_SIZE + 49))
    assert selector.evaluations == count
    selector.matches(make_device(serial=0))
    assert selector.evaluations == count + 1


def test_report_evaluation_time() -> None:
    """Prints the cost of one real evaluation (not asserted: wall-clock time is not a test)."""
    expression = f'{A}.model == "A100" && {A}.driverVersion.isGreaterThan(semver("1.0.0"))'
    selector = compile_selector(fresh(expression))
    devices = [make_device(numa=i, driverVersion=Version(f"1.{i}.0")) for i in range(300)]
    start = time.perf_counter()
    for d in devices:
        selector.matches(d)
    elapsed = time.perf_counter() - start
    assert selector.evaluations == 300
    start = time.perf_counter()
    for d in devices:
        selector.matches(d)
    hit = time.perf_counter() - start
    assert selector.evaluations == 300
    print(
        f"\nCEL evaluation: {elapsed / 300 * 1e6:.0f} us per real evaluation,"
        f" {hit / 300 * 1e6:.1f} us per memo hit"
    )
