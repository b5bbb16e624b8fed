"""Compile cel-python's parse tree into Python closures.

cel-python's own interpreter walks the lark tree on every evaluation (about 0.5 ms or more for a
typical selector, mostly in tree-walking overhead). Compiling the tree once into nested closures
keeps cel-python's value types (``celpy.celtypes``) and standard functions, and so its semantics for
arithmetic, comparison and conversions, while evaluating one to two orders of magnitude faster.

Each compiled node is a function ``env -> value``; evaluation errors are returned as
``CELEvalError`` values rather than raised, so ``&&``, ``||``, ``all`` and ``exists`` can absorb an
error when another operand decides the result, as CEL specifies. On top of cel-python this adds
``cel.bind``, namespaced functions (``sets.*``, ``lists.range``, ``strings.quote``), two-variable
comprehensions, ``map(x, predicate, transform)``, ``has()`` as a key-presence test, and the messages
``no such key: <key>`` / ``index out of range``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import lark
from celpy import celtypes
from celpy.evaluation import CELEvalError, Evaluator, base_functions

from .budget import check_current
from .checker import NAMESPACES, Tree, as_tree, bare_ident, unwrap
from .library import DECLARATIONS
from .values import NONE, CelOptional, cel_kind, cel_values_equal

__all__ = ["COST_KEY", "MAX_COST", "CostLimitExceeded", "DomainMap", "Program", "compile_program"]

# Upstream stops an evaluation whose runtime cost passes 1,000,000 units
# (CELSelectorExpressionMaxCost). Comprehensions are what can grow without bound here, so they are
# what is counted: each iteration costs two units (upstream's loop condition and step) plus the
# operands and operations of its body, about what upstream charges for the calls and operators in
# the loop; nested comprehensions multiply. The counter travels in the environment under a key no
# CEL identifier can spell. The limit is a second or two of evaluation here; the placement's budget
# (budget.py), checked at the start of every comprehension, stops it sooner when that runs out.
MAX_COST: Final = 1_000_000
COST_KEY: Final = "#cost"
# What an iteration costs upstream besides its body: the loop condition and the accumulating step.
_STEP: Final = 2


class CostLimitExceeded(Exception):
    """An evaluation ran past the cost limit; it is aborted, not absorbed by || or &&."""


Env = Mapping[str, Any]
Program = Callable[[Env], Any]

_TYPE_NAMES: Final = {
    "int": celtypes.IntType,
    "uint": celtypes.UintType,
    "double": celtypes.DoubleType,
    "string": celtypes.StringType,
    "bool": celtypes.BoolType,
    "bytes": celtypes.BytesType,
    "list": celtypes.ListType,
    "map": celtypes.MapType,
    "null_type": type(None),
    "type": celtypes.TypeType,
}
_TRUE: Final = celtypes.BoolType(True)
_FALSE: Final = celtypes.BoolType(False)


def _comparison(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    # cel-python's own comparison helpers rebuild a functools wrapper on every call; this is the
    # same logic (celtypes raise TypeError for mismatched types) without that cost.
    def compare(a: Any, b: Any) -> Any:
        result = op(a, b)
        if result is NotImplemented:
            raise TypeError("no such overload")
        return _TRUE if result else _FALSE

    return compare


def _equals(a: Any, b: Any) -> bool:
    """CEL heterogeneous equality: values of different built-in types are unequal, numbers compare
    by value; a quantity or semver compared with another type has no overload (as upstream)."""
    ka, kb = cel_kind(a), cel_kind(b)
    if ka != kb and "null" not in (ka, kb) and ({ka, kb} & {"Quantity", "Semver"}):
        raise TypeError("no such overload")
    return cel_values_equal(a, b)


def _in(item: Any, container: Any) -> Any:
    if isinstance(container, list):
        return _TRUE if any(cel_values_equal(item, c) for c in container) else _FALSE
    if isinstance(container, dict):
        try:
            return _TRUE if dict.__contains__(container, item) else _FALSE
        except TypeError:
            return _FALSE
    raise TypeError("no such overload")


_OPERATORS: Final[Mapping[str, Callable[..., Any]]] = {
    "_<_": _comparison(operator.lt),
    "_<=_": _comparison(operator.le),
    "_>_": _comparison(operator.gt),
    "_>=_": _comparison(operator.ge),
    "_==_": lambda a, b: _TRUE if _equals(a, b) else _FALSE,
    "_!=_": lambda a, b: _FALSE if _equals(a, b) else _TRUE,
    "_in_": _in,
}


class DomainMap(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain reads as an empty map."""

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str) and not dict.__contains__(self, key):
            return celtypes.MapType()
        return super().__getitem__(key)


def _err(message: str) -> CELEvalError:
    return CELEvalError(message)


def _overload(name: str, *values: Any) -> CELEvalError:
    return _err(f"no such overload: {name}({', '.join(cel_kind(v) for v in values)})")


def _select(target: Any, key: Any) -> Any:
    if isinstance(target, CELEvalError):
        return target
    if isinstance(target, CelOptional):
        # Selection through an optional stays optional: none.f is none, of(x).f is of(x.f).
        if not target.has_value:
            return target
        inner = _select(target.value, key)
        return inner if isinstance(inner, CELEvalError) else CelOptional(inner, has_value=True)
    if isinstance(target, dict):
        try:
            return target[key]
        except KeyError:
            return _err(f"no such key: {key}")
        except TypeError:
            return _err(f"unsupported key type: {cel_kind(key)}")
    if isinstance(target, list):
        if not isinstance(key, int) or isinstance(key, celtypes.BoolType):
            return _overload("_[_]", target, key)
        if not 0 <= key < len(target):
            return _err(f"index out of range: {key}")
        return target[key]
    return _err(f"type '{cel_kind(target)}' does not support field selection or indexing")


def _select_optional(target: Any, key: Any) -> Any:
    """``target.?key`` / ``target[?key]``: optional.of(the value) if present, else optional.none()."""
    if isinstance(target, CELEvalError):
        return target
    if isinstance(target, CelOptional):
        if not target.has_value:
            return target
        target = target.value
    if isinstance(target, dict):
        try:
            present = dict.__contains__(target, key) or (
                isinstance(target, DomainMap) and isinstance(key, str)
            )
        except TypeError:
            return _err(f"unsupported key type: {cel_kind(key)}")
        return CelOptional(target[key], has_value=True) if present else NONE
    if isinstance(target, list):
        if isinstance(key, int) and not isinstance(key, celtypes.BoolType) and 0 <= key < len(target):
            return CelOptional(target[key], has_value=True)
        return NONE
    return _err(f"type '{cel_kind(target)}' does not support optional field selection")


def _apply(name: str, fn: Callable[..., Any], args: list[Any]) -> Any:
    for arg in args:
        if isinstance(arg, CELEvalError):
            return arg
    try:
        return fn(*args)
    except (TypeError, AttributeError):
        return _overload(name, *args)
    except ZeroDivisionError:
        return _err("modulus or divide by zero")
    except (ValueError, OverflowError) as exc:
        return _err(f"{name}: {exc}")


class _Compiler:
    def __init__(self) -> None:
        self.constants: dict[Program, Any] = {}

    def constant(self, value: Any) -> Program:
        def const(env: Env) -> Any:
            return value

        self.constants[const] = value
        return const

    def compile(self, node: Tree) -> Program:
        method: Callable[[Tree], Program] | None = getattr(self, "_" + node.data, None)
        if method is None:
            raise ValueError(f"unsupported syntax ({node.data})")
        return method(node)

    def _single(self, node: Tree) -> Program:
        return self.compile(as_tree(node.children[0]))

    # ---- logic ---------------------------------------------------------------------------------

    def _expr(self, node: Tree) -> Program:
        if len(node.children) == 1:
            return self._single(node)
        cond, left, right = (self.compile(as_tree(c)) for c in node.children)

        def ternary(env: Env) -> Any:
            c = cond(env)
            if isinstance(c, CELEvalError):
                return c
            if not isinstance(c, celtypes.BoolType):
                return _overload("_?_:_", c)
            return left(env) if c else right(env)

        return ternary

    def _logical(self, node: Tree, *, decided: bool, name: str) -> Program:
        if len(node.children) == 1:
            return self._single(node)
        left, right = (self.compile(as_tree(c)) for c in node.children)
        decided_value = celtypes.BoolType(decided)

        def logical(env: Env) -> Any:
            a = left(env)
            if isinstance(a, celtypes.BoolType) and bool(a) == decided:
                return decided_value
            b = right(env)
            if isinstance(b, celtypes.BoolType):
                if bool(b) == decided:
                    return decided_value
                if isinstance(a, celtypes.BoolType):
                    return b
            if isinstance(a, CELEvalError):
                return a
            if isinstance(b, CELEvalError):
                return b
            return _overload(name, a, b)

        return logical

    def _conditionalor(self, node: Tree) -> Program:
        return self._logical(node, decided=True, name="_||_")

    def _conditionaland(self, node: Tree) -> Program:
        return self._logical(node, decided=False, name="_&&_")

    # ---- operators -----------------------------------------------------------------------------

    def _binary(self, node: Tree, names: Mapping[str, str]) -> Program:
        if len(node.children) == 1:
            return self._single(node)
        op_node = as_tree(node.children[0])
        left = self.compile(as_tree(op_node.children[0]))
        right = self.compile(as_tree(node.children[1]))
        name = names[str(op_node.data)]
        fn = _OPERATORS.get(name) or base_functions[name]

        def binary(env: Env) -> Any:
            return _apply(name, fn, [left(env), right(env)])

        return binary

    def _relation(self, node: Tree) -> Program:
        return self._binary(
            node,
            {
                "relation_lt": "_<_",
                "relation_le": "_<=_",
                "relation_gt": "_>_",
                "relation_ge": "_>=_",
                "relation_eq": "_==_",
                "relation_ne": "_!=_",
                "relation_in": "_in_",
            },
        )

    def _addition(self, node: Tree) -> Program:
        return self._binary(node, {"addition_add": "_+_", "addition_sub": "_-_"})

    def _multiplication(self, node: Tree) -> Program:
        return self._binary(
            node, {"multiplication_mul": "_*_", "multiplication_div": "_/_", "multiplication_mod": "_%_"}
        )

    def _unary(self, node: Tree) -> Program:
        if len(node.children) == 1:
            return self._single(node)
        op_node = as_tree(node.children[0])
        operand = self.compile(as_tree(node.children[1]))
        if op_node.data == "unary_not":

            def negate(env: Env) -> Any:
                value = operand(env)
                if isinstance(value, CELEvalError):
                    return value
                if not isinstance(value, celtypes.BoolType):
                    return _overload("!_", value)
                return _FALSE if value else _TRUE

            return negate

        def minus(env: Env) -> Any:
            return _apply("-_", operator.neg, [operand(env)])

        return minus

    # ---- members -------------------------------------------------------------------------------

    def _member(self, node: Tree) -> Program:
        return self._single(node)

    def _primary(self, node: Tree) -> Program:
        return self._single(node)

    def _paren_expr(self, node: Tree) -> Program:
        return self._single(node)

    def _member_dot(self, node: Tree) -> Program:
        target = self.compile(as_tree(node.children[0]))
        key = celtypes.StringType(str(node.children[1]))

        def member_dot(env: Env) -> Any:
            return _select(target(env), key)

        return member_dot

    def _member_index(self, node: Tree) -> Program:
        target = self.compile(as_tree(node.children[0]))
        index = self.compile(as_tree(node.children[1]))

        def member_index(env: Env) -> Any:
            key = index(env)
            if isinstance(key, CELEvalError):
                return key
            return _select(target(env), key)

        return member_index

    def _member_dot_opt(self, node: Tree) -> Program:
        target = self.compile(as_tree(node.children[0]))
        key = celtypes.StringType(str(node.children[1]))

        def member_dot_opt(env: Env) -> Any:
            return _select_optional(target(env), key)

        return member_dot_opt

    def _member_index_opt(self, node: Tree) -> Program:
        target = self.compile(as_tree(node.children[0]))
        index = self.compile(as_tree(node.children[1]))

        def member_index_opt(env: Env) -> Any:
            key = index(env)
            if isinstance(key, CELEvalError):
                return key
            return _select_optional(target(env), key)

        return member_index_opt

    def _member_object(self, node: Tree) -> Program:
        raise ValueError("message construction is not supported")

    def _arguments(self, exprlist: object) -> list[Tree]:
        if not isinstance(exprlist, lark.Tree):
            return []
        return [c for c in exprlist.children if isinstance(c, lark.Tree)]

    def _member_dot_arg(self, node: Tree) -> Program:
        target_tree = as_tree(node.children[0])
        name = str(node.children[1])
        args = self._arguments(node.children[2]) if len(node.children) > 2 else []
        namespace = bare_ident(target_tree)
        if namespace in NAMESPACES:
            if namespace == "cel" and name == "bind":
                return self._bind(args)
            return self._call(f"{namespace}.{name}", [self.compile(a) for a in args])
        if name in ("all", "exists", "exists_one", "existsOne", "map", "filter"):
            return self._comprehension(name, self.compile(target_tree), args)
        return self._call(name, [self.compile(target_tree), *(self.compile(a) for a in args)])

    def _call(self, name: str, args: list[Program]) -> Program:
        # A call runs the implementation declared with the function's overloads (the library package).
        declaration = DECLARATIONS.get(name)
        if declaration is None:
            raise ValueError(f"undeclared reference to '{name}'")
        function = declaration.implementation
        if declaration.pure and all(a in self.constants for a in args):
            value = _apply(name, function, [self.constants[a] for a in args])
            if not isinstance(value, CELEvalError):
                return self.constant(value)

        def call(env: Env) -> Any:
            return _apply(name, function, [a(env) for a in args])

        return call

    def _bind(self, args: list[Tree]) -> Program:
        var = str(bare_ident(args[0]))
        value = self.compile(args[1])
        body = self.compile(args[2])

        def bind(env: Env) -> Any:
            bound = value(env)
            if isinstance(bound, CELEvalError):
                return bound
            return body({**env, var: bound})

        return bind

    def _comprehension(self, name: str, target: Program, args: list[Tree]) -> Program:
        names = [str(bare_ident(a)) for a in args[:-1]]
        if name == "filter" or (name == "map" and len(args) == 3):
            predicate = self.compile(args[1])
            transform = self.compile(args[2]) if name == "map" else None
            step = _STEP + _size(args[1]) + (_size(args[2]) if name == "map" else 0)
            return self._map_filter(name, target, names[0], predicate, transform, step)
        body = self.compile(args[-1])
        step = _STEP + _size(args[-1])
        if name == "map":

            def map_(env: Env) -> Any:
                source = target(env)
                if not isinstance(source, list | dict):
                    return source if isinstance(source, CELEvalError) else _overload(name, source)
                out = []
                for bindings in _iterate(source, names, env, step):
                    value = body(bindings)
                    if isinstance(value, CELEvalError):
                        return value
                    out.append(value)
                return celtypes.ListType(out)

            return map_
        if name in ("all", "exists"):
            decided = name == "exists"

            def quantifier(env: Env) -> Any:
                source = target(env)
                if not isinstance(source, list | dict):
                    return source if isinstance(source, CELEvalError) else _overload(name, source)
                error: Any = None
                for bindings in _iterate(source, names, env, step):
                    value = body(bindings)
                    if isinstance(value, celtypes.BoolType):
                        if bool(value) == decided:
                            return celtypes.BoolType(decided)
                    elif error is None:
                        error = value if isinstance(value, CELEvalError) else _overload(name, value)
                return error if error is not None else celtypes.BoolType(not decided)

            return quantifier

        def exists_one(env: Env) -> Any:
            source = target(env)
            if not isinstance(source, list | dict):
                return source if isinstance(source, CELEvalError) else _overload(name, source)
            count = 0
            for bindings in _iterate(source, names, env, step):
                value = body(bindings)
                if isinstance(value, CELEvalError):
                    return value
                if not isinstance(value, celtypes.BoolType):
                    return _overload(name, value)
                count += bool(value)
            return celtypes.BoolType(count == 1)

        return exists_one

    def _map_filter(
        self,
        name: str,
        target: Program,
        var: str,
        predicate: Program,
        transform: Program | None,
        step: int,
    ) -> Program:
        def map_filter(env: Env) -> Any:
            source = target(env)
            if not isinstance(source, list | dict):
                return source if isinstance(source, CELEvalError) else _overload(name, source)
            out = []
            for bindings in _iterate(source, [var], env, step):
                keep = predicate(bindings)
                if isinstance(keep, CELEvalError):
                    return keep
                if not isinstance(keep, celtypes.BoolType):
                    return _overload(name, keep)
                if not keep:
                    continue
                value = bindings[var] if transform is None else transform(bindings)
                if isinstance(value, CELEvalError):
                    return value
                out.append(value)
            return celtypes.ListType(out)

        return map_filter

    # ---- primaries -----------------------------------------------------------------------------

    def _literal(self, node: Tree) -> Program:
        # cel-python's own literal conversion (escapes, uint, bytes), done once at compile time.
        return self.constant(Evaluator(node, activation=None).literal(node))  # type: ignore[arg-type]

    def _list_lit(self, node: Tree) -> Program:
        items = [self.compile(c) for c in self._arguments(node.children[0] if node.children else None)]

        def list_lit(env: Env) -> Any:
            values = [item(env) for item in items]
            for value in values:
                if isinstance(value, CELEvalError):
                    return value
            return celtypes.ListType(values)

        return list_lit

    def _map_lit(self, node: Tree) -> Program:
        parts = [self.compile(c) for c in self._arguments(node.children[0] if node.children else None)]
        pairs = list(zip(parts[0::2], parts[1::2], strict=True))

        def map_lit(env: Env) -> Any:
            out = celtypes.MapType()
            for key_fn, value_fn in pairs:
                key, value = key_fn(env), value_fn(env)
                for item in (key, value):
                    if isinstance(item, CELEvalError):
                        return item
                if not celtypes.MapType.valid_key_type(key):
                    return _err(f"unsupported key type: {cel_kind(key)}")
                if key in out:
                    return _err(f"Failed with repeated key: {key}")
                out[key] = value
            return out

        return map_lit

    def _ident(self, node: Tree) -> Program:
        name = str(node.children[0])
        type_value = _TYPE_NAMES.get(name)

        def ident(env: Env) -> Any:
            value = env.get(name, _MISSING)
            if value is _MISSING:
                return type_value if type_value is not None else _err(f"undeclared reference to '{name}'")
            return value

        return ident

    def _dot_ident(self, node: Tree) -> Program:
        return self._ident(node)

    def _ident_arg(self, node: Tree) -> Program:
        name = str(node.children[0])
        args = self._arguments(node.children[1]) if len(node.children) > 1 else []
        if name == "has":
            return self._has(args)
        return self._call(name, [self.compile(a) for a in args])

    def _dot_ident_arg(self, node: Tree) -> Program:
        return self._ident_arg(node)

    def _has(self, args: list[Tree]) -> Program:
        selection = unwrap(args[0])
        target = self.compile(as_tree(selection.children[0]))
        key = celtypes.StringType(str(selection.children[1]))

        def has(env: Env) -> Any:
            value = target(env)
            if isinstance(value, CELEvalError):
                return value
            if isinstance(value, dict):
                return celtypes.BoolType(dict.__contains__(value, key))
            return _err(f"invalid type for field selection: {cel_kind(value)}")

        return has


_MISSING: Final = object()


def _size(tree: Tree) -> int:
    """Operands and operations of an expression (tokens, and nodes joining two or more parts; the
    grammar's single-child wrappers are not counted): the per-iteration cost of a comprehension's body."""
    subtrees = list(as_tree(tree).iter_subtrees())
    tokens = sum(1 for t in subtrees for c in t.children if isinstance(c, lark.Token))
    return tokens + sum(1 for t in subtrees if len(t.children) > 1)


def _iterate(target: Any, names: list[str], env: Env, step: int) -> Iterator[dict[str, Any]]:
    # The whole comprehension is charged up front: a limit that stops one mid-way would cost as much.
    check_current()
    cost = env.get(COST_KEY)
    if cost is not None:
        cost[0] += len(target) * step
        if cost[0] > MAX_COST:
            raise CostLimitExceeded(f"operation cancelled: actual cost limit exceeded ({MAX_COST} units)")
    if isinstance(target, dict):
        for key in list(dict.keys(target)):
            if len(names) == 1:
                yield {**env, names[0]: key}
            else:
                yield {**env, names[0]: key, names[1]: dict.__getitem__(target, key)}
    else:
        for i, item in enumerate(target):
            if len(names) == 1:
                yield {**env, names[0]: item}
            else:
                yield {**env, names[0]: celtypes.IntType(i), names[1]: item}


def compile_program(tree: Tree) -> Program:
    """Compile a checked parse tree; ValueError for constructs the environment does not support."""
    return _Compiler().compile(tree)
