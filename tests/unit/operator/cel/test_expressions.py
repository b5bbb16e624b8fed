"""Selector expressions -> results or errors, covering the DRA CEL environment's functions."""

from __future__ import annotations

import pytest

from dra_operator.cel import CelCompileError, CelRuntimeError, DeviceInput, compile_selector

A = 'device.attributes["gpu.example.com"]'
C = 'device.capacity["gpu.example.com"]'


def expand(expression: str) -> str:
    return expression.replace("$A", A).replace("$C", C)


TRUE_EXPRESSIONS = [
    # device fields
    'device.driver == "gpu.example.com"',
    "device.allowMultipleAllocations",
    "device.allowMultipleAllocations == true",
    # attributes: qualified domain, unqualified names under the driver's domain, types
    '$A.model == "A100"',
    '$A["model"] == "A100"',
    "$A.numa == 0",
    "$A.sharing == false",
    "!$A.sharing",
    'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00"',
    'device.attributes["other.example.com"].flag',
    'device.attributes["other.example.com"].flag == true',
    '"model" in $A',
    '!("nope" in $A)',
    "has($A.model)",
    "!has($A.nope)",
    '"gpu.example.com" in device.attributes',
    # unknown domains read as empty maps
    'device.attributes["unknown.example.com"].size() == 0',
    '!has(device.attributes["unknown.example.com"].model)',
    '!("model" in device.attributes["unknown.example.com"])',
    'device.capacity["unknown.example.com"].size() == 0',
    # logic and short-circuit over errors
    "!has($A.nope) || $A.nope == 1",
    "has($A.nope) && $A.nope == 1 || true",
    "$A.nope == 1 || true",
    "false || $A.numa == 0",
    "$A.numa == 0 ? true : $A.nope",
    # semver
    '$A.driverVersion.isGreaterThan(semver("1.2.0"))',
    '$A.driverVersion.isLessThan(semver("1.10.0"))',
    '$A.driverVersion.compareTo(semver("1.2.3")) == 0',
    '$A.driverVersion == semver("1.2.3")',
    '$A.driverVersion == semver("1.2.3+build.7")',
    '$A.driverVersion != semver("1.2.4")',
    "$A.driverVersion.major() == 1 && $A.driverVersion.minor() == 2 && $A.driverVersion.patch() == 3",
    'semver("1.0.0-alpha").isLessThan(semver("1.0.0"))',
    'semver("v1.2", true) == semver("1.2.0")',
    'isSemver("1.2.3") && !isSemver("v1.2.3") && isSemver("v01.2", true)',
    # quantity
    '$C.memory.compareTo(quantity("40Gi")) >= 0',
    '$C.memory.compareTo(quantity("80Gi")) == 0',
    '$C.memory.isGreaterThan(quantity("79Gi"))',
    '$C.memory.isLessThan(quantity("81Gi"))',
    '$C.memory == quantity("81920Mi")',
    '$C["memory"].asInteger() == 85899345920',
    "$C.memory.isInteger()",
    "$C.memory.sign() == 1",
    '$C.memory.sub(quantity("80Gi")).sign() == 0',
    '$C.memory.add(quantity("1Gi")) == quantity("81Gi")',
    "$C.memory.add(1024).sub(1024) == $C.memory",
    "$C.memory.asApproximateFloat() > 8.5e10",
    'device.capacity["example.com"].bandwidth.compareTo(quantity("1G")) > 0',
    'isQuantity("1.5Gi") && !isQuantity("1.5 Gi")',
    '!quantity("500m").isInteger()',
    'quantity("-2").sign() == -1',
    # strings
    '$A.model.lowerAscii() == "a100"',
    '"AbC-é".upperAscii() == "ABC-é"',
    '$A.model.startsWith("A") && $A.model.endsWith("100") && $A.model.contains("10")',
    '$A.model.matches("^A[0-9]+$")',
    '$A.csv.split(",") == ["x", "y", "z"]',
    '$A.csv.split(",", 2) == ["x", "y,z"]',
    '$A.csv.split(",").join("-") == "x-y-z"',
    '["a", "b"].join() == "ab"',
    '$A.csv.replace(",", ";") == "x;y;z"',
    '$A.csv.replace(",", ";", 1) == "x;y,z"',
    '$A.padded.trim() == "text"',
    '$A.csv.indexOf(",") == 1',
    '$A.csv.indexOf(",", 2) == 3',
    '$A.csv.indexOf("q") == -1',
    '$A.csv.lastIndexOf(",") == 3',
    '$A.csv.lastIndexOf(",", 2) == 1',
    '$A.csv.substring(2) == "y,z"',
    '$A.csv.substring(0, 1) == "x"',
    '$A.csv.charAt(2) == "y"',
    '$A.csv.charAt(5) == ""',
    '"%s is %d".format([$A.model, $A.numa]) == "A100 is 0"',
    '"%.2f|%x|%b|%o|%s".format([1.5, 255, 5, 8, true]) == "1.50|ff|101|10|true"',
    '$A.uuid.find("[0-9]+") == "1234"',
    '"a1b22".findAll("[0-9]+") == ["1", "22"]',
    'strings.quote("a\\"b") == "\\"a\\\\\\"b\\""',
    '"abc".reverse() == "cba"',
    "size($A.model) == 4 && $A.model.size() == 4",
    # lists
    "$A.cores.size() == 4",
    "2 in $A.cores",
    "$A.cores.exists(c, c > 2)",
    "$A.cores.all(c, c >= 0)",
    "$A.cores.exists_one(c, c == 3)",
    "$A.cores.map(c, c * 2) == [0, 2, 4, 6]",
    "$A.cores.map(c, c > 1, c * 10) == [20, 30]",
    "$A.cores.filter(c, c % 2 == 1) == [1, 3]",
    "$A.cores.all(i, c, i == c)",
    "$A.cores.sum() == 6 && $A.cores.min() == 0 && $A.cores.max() == 3",
    "$A.cores.isSorted() && ![3, 1].isSorted()",
    "$A.cores.indexOf(2) == 2 && [1, 2, 1].lastIndexOf(1) == 2",
    "[1, 2, 2, 3, 1].distinct() == [1, 2, 3]",
    "[[1, 2], [3]].flatten() == [1, 2, 3]",
    "[1, [2, [3]]].flatten(2) == [1, 2, 3]",
    "[3, 1, 2].sort() == [1, 2, 3]",
    "[1, 2, 3].reverse() == [3, 2, 1]",
    "[1, 2, 3, 4].slice(1, 3) == [2, 3]",
    "lists.range(3) == [0, 1, 2]",
    "lists.range(200).all(i, lists.range(200).all(j, i + j >= 0))",
    "sets.contains([1, 2, 3], [3, 1]) && !sets.contains([1], [2])",
    "sets.equivalent([1, 2, 2], [2, 1]) && sets.intersects([1, 2], [2, 5])",
    # includes() on scalar and list-type attributes
    '$A.tags.includes("b")',
    '!$A.tags.includes("c")',
    '$A.model.includes("A100")',
    '!$A.model.includes("A")',
    "$A.cores.includes(3)",
    '$A.versions.includes(semver("2.0.0-rc.1"))',
    '$A.versions.exists(v, v.isGreaterThan(semver("1.5.0")))',
    # maps and comprehensions over domains
    '$A.exists(k, k == "model")',
    'device.attributes.exists(d, d == "other.example.com")',
    '$A.all(k, v, k != "")',
    '{"a": 1}.a == 1',
    # cel.bind
    'cel.bind(g, $A, g.model == "A100" && g.numa == 0)',
    "cel.bind(x, 2, cel.bind(y, 3, x * y == 6))",
    # optional field selection, as upstream's "no such key" message recommends
    '$A.?model.orValue("") == "A100"',
    '$A.?nope.orValue("none") == "none"',
    "!$A.?nope.hasValue() && $A.?model.hasValue()",
    '$A[?"model"].value() == "A100"',
    'device.attributes["unknown.example.com"].?model.orValue(1) == 1',
    '$A.?model.or(optional.of("x")).value() == "A100"',
    '$A.?nope.or(optional.of("x")).value() == "x"',
    "!optional.none().hasValue() && optional.of(1).hasValue() && !optional.ofNonZeroValue(0).hasValue()",
    "$A.cores[?9].orValue(-1) == -1 && $A.cores[?1].orValue(-1) == 1",
    '{"a": {"b": 1}}.?a.b.orValue(0) == 1',
    '{"a": {"b": 1}}.?x.b.orValue(0) == 0',
    "optional.of(1) == optional.of(1) && optional.none() == optional.none()",
    # conversions and arithmetic
    'int("42") == 42 && string(42) == "42" && double(1) == 1.0',
    "dyn($A.numa) == 0",
    "type($A.numa) == int",
    "7 / 2 == 3 && 7 % 2 == 1 && -7 / 2 == -3",
    "$A.numa == 0.0 && dyn(1u) == 1 && [1, 2.0] == [1.0, 2]",
    '$A.model != 1 && [1, "a"] != [1, "b"]',
]

FALSE_EXPRESSIONS = [
    'device.driver == "other"',
    '$A.model == "H100"',
    "has($A.nope)",
    '$A.driverVersion.isGreaterThan(semver("1.2.3"))',
    '$C.memory.compareTo(quantity("81Gi")) >= 0',
    "!device.allowMultipleAllocations",
    '"model" in device.attributes["unknown.example.com"]',
    # heterogeneous equality: different types are unequal, not an error
    "$A.model == 1",
    "$A.sharing == 0",
    '$A.numa == "0"',
    '"0" in $A.cores',
]


@pytest.mark.parametrize("expression", TRUE_EXPRESSIONS)
def test_true(expression: str, device: DeviceInput) -> None:
    assert compile_selector(expand(expression)).matches(device) is True


@pytest.mark.parametrize("expression", FALSE_EXPRESSIONS)
def test_false(expression: str, device: DeviceInput) -> None:
    assert compile_selector(expand(expression)).matches(device) is False


RUNTIME_ERRORS = [
    ("$A.nope == 1", "no such key: nope"),
    ('$A["nope"] == 1', "no such key: nope"),
    ('device.attributes["unknown.example.com"].model == "x"', "no such key: model"),
    ("$C.nope.isInteger()", "no such key: nope"),
    ("$A.numa == 0 && $A.nope", "no such key: nope"),
    ('$A.model == "A100" ? $A.nope : true', "no such key: nope"),
    ('quantity("bad") == quantity("1")', "quantity"),
    ('semver("1.2") == semver("1.2.0")', "semver"),
    ('$C.memory.add(quantity("0.5")).asInteger() == 1', "cannot convert"),
    ("$A.model", "not bool"),
    ('$A.driverVersion == "1.2.3"', "overload"),
    ("$A.big.includes(1)", "more than the limit of 48"),
    ('$A.csv.substring(5, 2) == ""', "invalid substring range"),
    ('$A.csv.charAt(9) == ""', "index out of range"),
    ("$A.cores[9] == 1", "index out of range"),
    ("[].max() == 1", "empty list"),
    ("1 / 0 == 1", "divide by zero"),
    ('"%d".format(["x"]) == ""', "format"),
    ("$A.?nope.value() == 1", "optional.none.. dereference"),
    # 1000 x 1000 iterations of (2 + 1) units each: three times upstream's limit of 1,000,000.
    ("lists.range(1000).all(i, lists.range(1000).all(j, true))", "cost limit exceeded"),
    ("lists.range(1000).all(i, lists.range(1000).all(j, true)) || true", "cost limit exceeded"),
    ("lists.range(2000000).size() > 0", "cost limit exceeded"),
]


@pytest.mark.parametrize(("expression", "message"), RUNTIME_ERRORS)
def test_runtime_errors(expression: str, message: str, device: DeviceInput) -> None:
    selector = compile_selector(expand(expression))
    with pytest.raises(CelRuntimeError, match=message):
        selector.matches(device)


COMPILE_ERRORS = [
    ("noSuchVar", "undeclared reference to 'noSuchVar'"),
    ("device.nope == 1", "undefined field 'nope'"),
    ("$A.model.nope()", "undeclared reference to 'nope'"),
    ("unknownFunction(1)", "undeclared reference to 'unknownFunction'"),
    ("device.driver", "must evaluate to bool, not string"),
    ("$A.numa + 1", "must evaluate to bool"),
    ('quantity("1") < quantity("2")', "no matching overload for '_<_'"),
    ('semver("1.0.0") > semver("0.1.0")', "no matching overload for '_>_'"),
    ("device.driver == 1", "no matching overload for '_==_'"),
    ('$C.memory == "80Gi"', "no matching overload for '_==_'"),
    ('device.driver.compareTo("x") == 0', "no matching overload for 'compareTo'"),
    ('quantity("1").major() == 1', "no matching overload for 'major'"),
    ('"a".split() == []', "no matching overload for 'split'"),
    ("has(device)", "invalid argument to has()"),
    ("cel.bind(x, 1)", "cel.bind() takes exactly 3"),
    ("cel.nope(1)", "undeclared reference to 'cel.nope'"),
    ("$A.cores.all(1, true)", "simple identifier"),
    ("$C.memory", "must evaluate to bool, not Quantity"),
    ("device.attributes", "must evaluate to bool, not map"),
    ('device["driver"] == "x"', "no matching overload for '_[_]'"),
    ("1 +", "Syntax error"),
    ("a b", "Syntax error"),
    ("$A.?model", "must evaluate to bool, not optional"),
    ('device.driver.orValue("") == ""', "no matching overload for 'orValue'"),
    ("[?1] == [1]", "Syntax error"),
    ("", "CEL expression empty"),
    ("   ", "CEL expression empty"),
]


@pytest.mark.parametrize(("expression", "message"), COMPILE_ERRORS)
def test_compile_errors(expression: str, message: str) -> None:
    with pytest.raises(CelCompileError, match=_literal(message)):
        compile_selector(expand(expression))


def _literal(text: str) -> str:
    import re

    return re.escape(text)


def test_expression_length_limit() -> None:
    padding = " " * (10240 - len("true"))
    assert compile_selector("true" + padding).expression.startswith("true")
    with pytest.raises(CelCompileError, match="too long"):
        compile_selector("true" + padding + " ")
    # The limit counts bytes, not characters.
    multibyte = '"' + "é" * 5119 + '" != ""'
    with pytest.raises(CelCompileError, match="too long"):
        compile_selector(multibyte)


def test_compile_is_cached_by_text() -> None:
    assert compile_selector('device.driver == "x"') is compile_selector('device.driver == "x"')
