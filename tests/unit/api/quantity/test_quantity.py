"""Kubernetes Quantity parsing, canonical formatting, ordering and arithmetic."""

from __future__ import annotations

import fractions
import pickle

import pytest

from dra_api.quantity import Format, Quantity, is_on_step, round_up_to_step


@pytest.mark.parametrize(
    ("text", "canonical", "value"),
    [
        ("0", "0", 0),
        ("000", "0", 0),
        ("80Gi", "80Gi", 80 * 2**30),
        ("1024Mi", "1Gi", 2**30),
        ("1000Mi", "1000Mi", 1000 * 2**20),
        ("1.5Gi", "1536Mi", 1536 * 2**20),
        ("0.5Gi", "512Mi", 512 * 2**20),
        ("0.5Ki", "512", 512),
        ("-1Ki", "-1Ki", -1024),
        ("1023", "1023", 1023),
        ("1000", "1k", 1000),
        ("2k", "2k", 2000),
        ("1.5", "1500m", fractions.Fraction(3, 2)),
        ("0.5", "500m", fractions.Fraction(1, 2)),
        ("500m", "500m", fractions.Fraction(1, 2)),
        ("1000000m", "1k", 1000),
        ("0.000001", "1u", fractions.Fraction(1, 10**6)),
        ("3.14159", "3141590u", fractions.Fraction(314159, 100000)),
        ("1e3", "1e3", 1000),
        ("1E3", "1e3", 1000),
        ("1e+3", "1e3", 1000),
        ("1.5e3", "1500", 1500),
        ("1e1", "10", 10),
        ("1e-3", "1e-3", fractions.Fraction(1, 1000)),
        ("1E", "1E", 10**18),
        ("12E", "12E", 12 * 10**18),
        ("1n", "1n", fractions.Fraction(1, 10**9)),
        ("+5", "5", 5),
        ("1.", "1", 1),
        ("-0.5", "-500m", fractions.Fraction(-1, 2)),
        ("-1.5Gi", "-1536Mi", -1536 * 2**20),
    ],
)
def test_parse_and_canonical(text: str, canonical: str, value: fractions.Fraction | int) -> None:
    q = Quantity.parse(text)
    assert str(q) == canonical
    assert q.value == value
    # The canonical form parses back to the same value and prints identically.
    assert Quantity.parse(canonical) == q
    assert str(Quantity.parse(canonical)) == canonical


def test_sub_nano_precision_rounds_up_away_from_zero() -> None:
    assert str(Quantity.parse("0.1n")) == "1n"
    assert str(Quantity.parse("1e-20")) == "1e-9"
    assert str(Quantity.parse("-0.1n")) == "-1n"
    assert Quantity.parse("1.0000000001").value == fractions.Fraction(1000000001, 10**9)


def test_binary_is_capped_at_int64_max() -> None:
    q = Quantity.parse("8Ei")
    assert q.value == 2**63 - 1
    assert str(q) == "9223372036854775807"


def test_binary_below_one_becomes_decimal() -> None:
    q = Quantity.parse("0.0001Ki")
    assert q.format is Format.DECIMAL_SI
    assert str(q) == "102400u"


@pytest.mark.parametrize(
    "bad", ["", ".", "Gi", "1x", "1 Gi", "1e", "1.2.3", "e3", "1Gii", "1ki", "abc", "1e99999"]
)
def test_parse_rejects_bad_input(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        Quantity.parse(bad)


def test_parse_int_and_rejects_bool() -> None:
    assert Quantity.parse(3) == Quantity.parse("3")
    assert str(Quantity.parse(2048)) == "2048"
    with pytest.raises(ValueError, match="bool"):
        Quantity.parse(True)


def test_equality_ordering_and_hash_by_value() -> None:
    a, b, c = Quantity.parse("1Gi"), Quantity.parse("1024Mi"), Quantity.parse("1073741824")
    assert a == b == c
    assert len({a, b, c}) == 1
    assert Quantity.parse("1k") < Quantity.parse("1Ki")
    assert Quantity.parse("999m") < Quantity.parse("1") <= Quantity.parse("1000m")
    assert max(Quantity.parse("2"), Quantity.parse("1500m")) == Quantity.parse("2")
    assert Quantity.parse("1") != 1  # not equal to plain numbers
    assert Quantity.parse("1").compare(Quantity.parse("2")) == -1
    assert Quantity.parse("2").compare(Quantity.parse("2000m")) == 0


def test_arithmetic_keeps_format_unless_zero() -> None:
    total = Quantity.parse("1Gi") + Quantity.parse("1Gi")
    assert str(total) == "2Gi"
    assert str(Quantity.parse("0") + Quantity.parse("512Mi")) == "512Mi"
    assert str(Quantity.parse("1Gi") - Quantity.parse("512Mi")) == "512Mi"
    assert str(Quantity.parse("1") - Quantity.parse("1500m")) == "-500m"
    assert str(-Quantity.parse("2Gi")) == "-2Gi"
    assert str(Quantity.parse("3Gi") * 2) == "6Gi"


def test_accessors() -> None:
    q = Quantity.parse("1500m")
    assert q.as_int() is None
    assert not q.is_integer()
    assert q.as_approximate_float() == 1.5
    assert q.sign() == 1
    assert (-q).sign() == -1
    assert Quantity.parse("0").sign() == 0
    assert Quantity.parse("0").is_zero()
    assert Quantity.parse("2k").as_int() == 2000
    assert Quantity.parse("9223372036854775807").as_int() == 2**63 - 1
    assert Quantity.parse("9223372036854775808").as_int() is None
    assert Quantity.parse("-9223372036854775808").as_int() == -(2**63)


def test_immutable_and_picklable() -> None:
    q = Quantity.parse("80Gi")
    with pytest.raises(AttributeError):
        q._nanos = 5
    again = pickle.loads(pickle.dumps(q))
    assert again == q
    assert str(again) == "80Gi"


def test_round_up_to_step() -> None:
    gi = Quantity.parse("1Gi")
    assert round_up_to_step(value=Quantity.parse("1.5Gi"), minimum=gi, step=gi) == Quantity.parse("2Gi")
    assert round_up_to_step(value=Quantity.parse("2Gi"), minimum=gi, step=gi) == Quantity.parse("2Gi")
    assert round_up_to_step(value=Quantity.parse("100Mi"), minimum=gi, step=gi) == gi
    assert round_up_to_step(
        value=Quantity.parse("3"), minimum=Quantity.parse("1"), step=None
    ) == Quantity.parse("3")
    assert str(
        round_up_to_step(value=Quantity.parse("5"), minimum=Quantity.parse("2"), step=Quantity.parse("2"))
    ) == ("6")
    assert is_on_step(value=Quantity.parse("3Gi"), minimum=gi, step=gi)
    assert not is_on_step(value=Quantity.parse("1.5Gi"), minimum=gi, step=gi)
    assert not is_on_step(value=Quantity.parse("512Mi"), minimum=gi, step=gi)


def test_from_fraction_rounds_up_to_nano() -> None:
    assert Quantity.from_fraction(fractions.Fraction(1, 3)).value == fractions.Fraction(333333334, 10**9)
    assert Quantity.from_fraction(fractions.Fraction(-1, 3)).value == fractions.Fraction(-333333334, 10**9)
    assert str(Quantity.from_fraction(2, format=Format.BINARY_SI)) == "2"
    assert str(Quantity.from_int(2048, format=Format.BINARY_SI)) == "2Ki"
