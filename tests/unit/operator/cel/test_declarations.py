"""The checker's overloads and the runtime's implementations describe the same functions.

Each CEL function is declared once in the ``library`` package, its overloads beside its
implementation, so neither table can lose a name the other has. What can still drift is what an
implementation really serves against what its overloads promise. EXAMPLES below, written by hand,
holds one call per declared overload (name, receiver type or None for a global call, number of
arguments); the tests ask the checker alone whether it accepts each call, and the runtime alone
(compiled, no checker) whether it evaluates it to a value of the declared type. Every declared
overload is served: by a function of the library's modules, or by cel-python's own implementation
where the library declares it with ``builtin``; there is no list of exceptions.

What a failure looks like, for instance after deleting ``member("list", [1], "int")`` from
``indexOf`` (the runtime still serves lists)::

    AssertionError: overloads with an example but no declaration: [('indexOf', 'list', 1)]

and after adding ``"list"`` to ``trim``'s receivers and an example for it (nothing serves it)::

    test_the_runtime_serves_every_declared_overload[trim:list/0]
    AssertionError: trim:list/0 failed at run time: no such overload: trim(list)

and a function written in a module of the library without its ``@declare`` line fails the last test
with ``library functions declared as no CEL function: {'sign'}``.
"""

from __future__ import annotations

import inspect
import pkgutil
from typing import Any, Final

import pytest
from celpy.evaluation import CELEvalError, base_functions

from dra_operator.cel import CelCompileError, library
from dra_operator.cel.checker import check
from dra_operator.cel.compiler import compile_program
from dra_operator.cel.declarations import ANY_RECEIVER, DYN
from dra_operator.cel.library import DECLARATIONS
from dra_operator.cel.parser import parse
from dra_operator.cel.values import cel_kind

Key = tuple[str, str | None, int]  # function, receiver type (None: global call), number of arguments

TS: Final = 'timestamp("2024-05-06T07:08:09Z")'
DUR: Final = 'duration("3723s")'
Q: Final = 'quantity("1Gi")'
S: Final = 'semver("1.2.3")'
GETTERS: Final = (
    "getDate",
    "getDayOfMonth",
    "getDayOfWeek",
    "getDayOfYear",
    "getFullYear",
    "getHours",
    "getMilliseconds",
    "getMinutes",
    "getMonth",
    "getSeconds",
)
# A duration has the getters of time units only, and none takes a time zone (as upstream CEL).
DURATION_GETTERS: Final = ("getHours", "getMilliseconds", "getMinutes", "getSeconds")

# One call per overload: (receiver expression or None, *argument expressions).
EXAMPLES: Final[dict[Key, tuple[str | None, ...]]] = {
    # core functions (cel-python's)
    ("size", None, 1): (None, '"abc"'),
    ("size", "string", 0): ('"abc"',),
    ("size", "bytes", 0): ('b"abc"',),
    ("size", "list", 0): ("[1, 2]",),
    ("size", "map", 0): ('{"k": 1}',),
    ("int", None, 1): (None, '"3"'),
    ("uint", None, 1): (None, "3"),
    ("double", None, 1): (None, "1"),
    ("string", None, 1): (None, "1"),
    ("bool", None, 1): (None, '"true"'),
    ("bytes", None, 1): (None, '"a"'),
    ("type", None, 1): (None, "1"),
    ("duration", None, 1): (None, '"1s"'),
    ("timestamp", None, 1): (None, '"2024-05-06T07:08:09Z"'),
    ("matches", None, 2): (None, '"abc"', '"^a"'),
    ("matches", "string", 1): ('"abc"', '"^a"'),
    ("contains", "string", 1): ('"abc"', '"b"'),
    ("startsWith", "string", 1): ('"abc"', '"a"'),
    ("endsWith", "string", 1): ('"abc"', '"c"'),
    **{(name, "timestamp", 0): (TS,) for name in GETTERS},
    **{(name, "timestamp", 1): (TS, '"Europe/Paris"') for name in GETTERS},
    **{(name, "duration", 0): (DUR,) for name in DURATION_GETTERS},
    ("dyn", None, 1): (None, "1"),
    # quantity
    ("quantity", None, 1): (None, '"1Gi"'),
    ("isQuantity", None, 1): (None, '"1Gi"'),
    ("add", "Quantity", 1): (Q, 'quantity("1Mi")'),
    ("sub", "Quantity", 1): (Q, 'quantity("1Mi")'),
    ("sign", "Quantity", 0): (Q,),
    ("isInteger", "Quantity", 0): (Q,),
    ("asInteger", "Quantity", 0): (Q,),
    ("asApproximateFloat", "Quantity", 0): (Q,),
    ("compareTo", "Quantity", 1): (Q, 'quantity("2Gi")'),
    ("isGreaterThan", "Quantity", 1): (Q, 'quantity("2Gi")'),
    ("isLessThan", "Quantity", 1): (Q, 'quantity("2Gi")'),
    # semver
    ("compareTo", "Semver", 1): (S, 'semver("1.3.0")'),
    ("isGreaterThan", "Semver", 1): (S, 'semver("1.3.0")'),
    ("isLessThan", "Semver", 1): (S, 'semver("1.3.0")'),
    ("semver", None, 1): (None, '"1.2.3"'),
    ("semver", None, 2): (None, '"v1.2"', "true"),
    ("isSemver", None, 1): (None, '"1.2.3"'),
    ("isSemver", None, 2): (None, '"v1.2"', "true"),
    ("major", "Semver", 0): (S,),
    ("minor", "Semver", 0): (S,),
    ("patch", "Semver", 0): (S,),
    # strings
    ("charAt", "string", 1): ('"abc"', "1"),
    ("indexOf", "string", 1): ('"abcb"', '"b"'),
    ("indexOf", "string", 2): ('"abcb"', '"b"', "2"),
    ("indexOf", "list", 1): ("[1, 2]", "2"),
    ("lastIndexOf", "string", 1): ('"abcb"', '"b"'),
    ("lastIndexOf", "string", 2): ('"abcb"', '"b"', "2"),
    ("lastIndexOf", "list", 1): ("[1, 2]", "2"),
    ("lowerAscii", "string", 0): ('"AbC"',),
    ("upperAscii", "string", 0): ('"AbC"',),
    ("replace", "string", 2): ('"aaa"', '"a"', '"b"'),
    ("replace", "string", 3): ('"aaa"', '"a"', '"b"', "1"),
    ("split", "string", 1): ('"a,b"', '","'),
    ("split", "string", 2): ('"a,b,c"', '","', "2"),
    ("substring", "string", 1): ('"abc"', "1"),
    ("substring", "string", 2): ('"abc"', "1", "2"),
    ("trim", "string", 0): ('" a "',),
    ("join", "list", 0): ('["a", "b"]',),
    ("join", "list", 1): ('["a", "b"]', '"-"'),
    ("format", "string", 1): ('"%d-%s"', '[1, "x"]'),
    ("reverse", "string", 0): ('"abc"',),
    ("reverse", "list", 0): ("[1, 2]",),
    ("strings.quote", None, 1): (None, '"a"'),
    # regex
    ("find", "string", 1): ('"a1b22"', '"[0-9]+"'),
    ("findAll", "string", 1): ('"a1b22"', '"[0-9]+"'),
    ("findAll", "string", 2): ('"a1b22"', '"[0-9]+"', "1"),
    # lists and sets
    ("isSorted", "list", 0): ("[2, 1, 2]",),
    ("sum", "list", 0): ("[2, 1, 2]",),
    ("min", "list", 0): ("[2, 1, 2]",),
    ("max", "list", 0): ("[2, 1, 2]",),
    ("distinct", "list", 0): ("[2, 1, 2]",),
    ("sort", "list", 0): ("[2, 1, 2]",),
    ("flatten", "list", 0): ("[[1], [2, [3]]]",),
    ("flatten", "list", 1): ("[[1], [2, [3]]]", "2"),
    ("slice", "list", 2): ("[1, 2, 3]", "0", "2"),
    ("lists.range", None, 1): (None, "3"),
    ("sets.contains", None, 2): (None, "[1, 2]", "[2]"),
    ("sets.equivalent", None, 2): (None, "[1, 2]", "[2, 1]"),
    ("sets.intersects", None, 2): (None, "[1, 2]", "[2]"),
    # DRA
    ("includes", ANY_RECEIVER, 1): ("[1, 2]", "2"),
    # optional
    ("hasValue", "optional", 0): ("optional.of(1)",),
    ("value", "optional", 0): ("optional.of(1)",),
    ("orValue", "optional", 1): ("optional.none()", "2"),
    ("or", "optional", 1): ("optional.none()", "optional.of(2)"),
    ("optional.of", None, 1): (None, "1"),
    ("optional.none", None, 0): (None,),
    ("optional.ofNonZeroValue", None, 1): (None, "1"),
}

# Entries of cel-python's function table that are type names for ``type(x) == list``, not functions.
TYPE_DENOTATIONS: Final = frozenset({"list", "map", "null_type"})

# cel_kind names Python classes it does not know by their class name.
_KIND_ALIASES: Final = {"TimestampType": "timestamp", "DurationType": "duration"}


def _declared() -> set[Key]:
    return {
        (name, receiver, arity)
        for name, declaration in DECLARATIONS.items()
        for overload in declaration.overloads
        for receiver in (overload.receivers or (None,))
        for arity in overload.arities
    }


def _call(key: Key) -> str:
    name, _, arity = key
    receiver, *rest = EXAMPLES[key]
    args = [a for a in rest if a is not None]
    assert len(args) == arity, f"example of {key} has {len(rest)} arguments, or a None among them"
    head = name if receiver is None else f"{receiver}.{name}"
    return f"{head}({', '.join(args)})"


def _kind(value: Any) -> str:
    kind = cel_kind(value)
    return _KIND_ALIASES.get(kind, kind)


def _run(expression: str) -> Any:
    """Evaluate with the runtime alone: compiled straight from the parse tree, no checker."""
    try:
        return compile_program(parse(expression))({})
    except Exception as exc:  # cel-python can raise where it has no overload (an assert)
        return CELEvalError(f"{type(exc).__name__}: {exc}")


def _result(key: Key) -> str:
    name, receiver, arity = key
    for overload in DECLARATIONS[name].overloads:
        receivers = overload.receivers or (None,)
        if receiver in receivers and arity in overload.arities:
            return overload.result
    raise AssertionError(f"{key} is not declared")


def _id(key: Key) -> str:
    name, receiver, arity = key
    return f"{name}:{receiver or 'global'}/{arity}"


ALL: Final = sorted(EXAMPLES, key=_id)


def test_every_declared_overload_has_an_example_and_every_example_is_declared() -> None:
    declared, examples = _declared(), set(EXAMPLES)
    assert not declared - examples, f"declared overloads without an example: {sorted(declared - examples)}"
    assert not examples - declared, (
        f"overloads with an example but no declaration: {sorted(examples - declared)}"
    )


@pytest.mark.parametrize("key", ALL, ids=_id)
def test_the_checker_accepts_every_example(key: Key) -> None:
    text = f"cel.bind(r, {_call(key)}, true)"
    try:
        check(parse(text), text)
    except CelCompileError as exc:
        raise AssertionError(f"{_id(key)}: the checker refuses {_call(key)}: {exc}") from None


@pytest.mark.parametrize("key", ALL, ids=_id)
def test_the_runtime_serves_every_declared_overload(key: Key) -> None:
    receiver = EXAMPLES[key][0]
    if receiver is not None and key[1] != ANY_RECEIVER:
        assert _kind(_run(receiver)) == key[1], f"the example's receiver {receiver} is not a {key[1]}"
    value = _run(_call(key))
    assert not isinstance(value, CELEvalError), f"{_id(key)} failed at run time: {value.args[0]}"
    expected = _result(key)
    if expected != DYN:
        assert _kind(value) == expected, f"{_call(key)} is a {_kind(value)}, declared {expected}"


@pytest.mark.parametrize(
    "call", [f"{DUR}.getDate()", f"{DUR}.getFullYear()", f'{DUR}.getHours("UTC")', f'{DUR}.getSeconds("UTC")']
)
def test_the_checker_refuses_duration_getters_that_nothing_serves(call: str) -> None:
    with pytest.raises(CelCompileError, match="found no matching overload"):
        check(parse(call), call)


LIBRARY_MODULES: Final = frozenset(m.__name__ for m in library.MODULES)


def test_the_library_modules_are_all_but_the_registry() -> None:
    found = {f"{library.__name__}.{m.name}" for m in pkgutil.iter_modules(library.__path__)}
    assert found - LIBRARY_MODULES == {f"{library.__name__}.registry"}
    assert found >= LIBRARY_MODULES


def test_every_declaration_is_served_by_the_library_or_by_cel_python() -> None:
    for name, declaration in DECLARATIONS.items():
        implementation = declaration.implementation
        wrapped = getattr(implementation, "__wrapped__", None)
        by_library = wrapped is not None and wrapped.__module__ in LIBRARY_MODULES
        assert by_library or implementation is base_functions.get(name), (
            f"{name}: its implementation is neither a library function nor cel-python's {name}"
        )


def test_every_function_the_runtime_has_is_declared() -> None:
    # cel-python's functions, less operators ("_+_", "!_", "-_") and type names.
    celpy = {n for n in base_functions if not n.startswith("_") and not n.endswith("_")} - TYPE_DENOTATIONS
    assert not celpy - set(DECLARATIONS), (
        f"cel-python functions not declared: {sorted(celpy - set(DECLARATIONS))}"
    )
    # Every public function of the library's modules is the implementation of a declaration.
    implemented = {
        name
        for module in library.MODULES
        for name, fn in inspect.getmembers(module, inspect.isfunction)
        if fn.__module__ == module.__name__ and not name.startswith("_")
    }
    served = {
        getattr(d.implementation, "__wrapped__", d.implementation).__name__ for d in DECLARATIONS.values()
    }
    assert not implemented - served, f"library functions declared as no CEL function: {implemented - served}"
