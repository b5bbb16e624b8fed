"""Device attribute values: JSON decoding and encoding, versions, type-strict equality."""

from __future__ import annotations

from typing import Any

import pytest

from dra_api.attributes import (
    UnsupportedAttribute,
    Version,
    attribute_from_json,
    attribute_to_json,
    attribute_values_equal,
    device_attribute_from_json,
)


@pytest.mark.parametrize(
    ("obj", "value"),
    [
        ({"int": 5}, 5),
        ({"int": -(2**63)}, -(2**63)),
        ({"bool": True}, True),
        ({"string": "A100"}, "A100"),
        ({"version": "1.2.3-rc.1+build.5"}, Version("1.2.3-rc.1+build.5")),
        ({"ints": [0, 1]}, (0, 1)),
        ({"bools": [True, False]}, (True, False)),
        ({"strings": ["a", "b"]}, ("a", "b")),
        ({"versions": ["1.0.0", "2.0.0"]}, (Version("1.0.0"), Version("2.0.0"))),
        ({"int": 7, "string": None}, 7),
    ],
)
def test_round_trip(obj: dict[str, Any], value: object) -> None:
    decoded = attribute_from_json(obj)
    assert decoded == value
    assert type(decoded) is type(value)
    expected = {k: v for k, v in obj.items() if v is not None}
    assert attribute_to_json(decoded) == expected


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({}, "exactly one"),
        ({"int": 1, "string": "x"}, "several"),
        ({"int": True}, "integer"),
        ({"int": "5"}, "integer"),
        ({"int": 2**63}, "int64"),
        ({"bool": 1}, "true or false"),
        ({"string": 5}, "string"),
        ({"version": "v1.0.0"}, "SemVer"),
        ({"version": "1.0"}, "SemVer"),
        ({"version": "01.0.0"}, "SemVer"),
        ({"ints": []}, "non-empty"),
        ({"strings": ["a", 1]}, "string"),
        ({"float": 1.5}, "unknown field"),
    ],
)
def test_bad_attributes(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        attribute_from_json(obj)


def test_device_attribute_keeps_unusable_values_for_evaluation_errors() -> None:
    assert device_attribute_from_json({}) == UnsupportedAttribute("unsupported attribute value")
    bad = device_attribute_from_json({"version": "not-semver"})
    assert isinstance(bad, UnsupportedAttribute)
    assert "not-semver" in bad.reason
    assert isinstance(device_attribute_from_json({"versions": ["1.0.0", "x"]}), UnsupportedAttribute)
    assert device_attribute_from_json({"int": 3}) == 3
    with pytest.raises(ValueError, match="integer"):
        device_attribute_from_json({"int": "3"})


def test_version_parts_and_precedence() -> None:
    v = Version("1.22.3-alpha.1+meta")
    assert (v.major, v.minor, v.patch) == (1, 22, 3)
    assert v.prerelease == ("alpha", "1")
    assert v.build == ("meta",)
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.2.0",
        "1.10.0",
        "2.0.0",
    ]
    versions = [Version(t) for t in ordered]
    shuffled = versions[5:] + versions[:5]
    assert sorted(shuffled, key=Version.precedence_key) == versions
    assert Version("1.0.0+a").compare(Version("1.0.0+b")) == 0
    assert Version("1.10.0").compare(Version("1.9.0")) == 1


def test_type_strict_equality() -> None:
    assert not attribute_values_equal(True, 1)
    assert not attribute_values_equal("1.0.0", Version("1.0.0"))
    assert attribute_values_equal(Version("1.0.0+x"), Version("1.0.0"))
    assert attribute_values_equal((1, 2), (1, 2))
    assert not attribute_values_equal((1, 2), 1)
    assert not attribute_values_equal((True,), (1,))
