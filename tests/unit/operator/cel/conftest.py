"""A device with every kind of attribute and capacity the selector tests read."""

from __future__ import annotations

import pytest

from dra_api.attributes import Version
from dra_api.quantity import Quantity
from dra_operator.cel import DeviceInput

DRIVER = "gpu.example.com"


def make_device(**overrides: object) -> DeviceInput:
    attributes: dict[str, object] = {
        "model": "A100",
        "numa": 0,
        "sharing": False,
        "driverVersion": Version("1.2.3"),
        "uuid": "GPU-1234",
        "resource.kubernetes.io/pcieRoot": "pci0000:00",
        "cores": (0, 1, 2, 3),
        "tags": ("a", "b"),
        "versions": (Version("1.0.0"), Version("2.0.0-rc.1")),
        "big": tuple(range(49)),
        "other.example.com/flag": True,
        "csv": "x,y,z",
        "padded": "  text  ",
    }
    attributes.update(overrides)
    return DeviceInput(
        driver=DRIVER,
        attributes=attributes,  # type: ignore[arg-type]
        capacity={"memory": Quantity.parse("80Gi"), "example.com/bandwidth": Quantity.parse("10G")},
        allow_multiple_allocations=True,
    )


@pytest.fixture
def device() -> DeviceInput:
    return make_device()
