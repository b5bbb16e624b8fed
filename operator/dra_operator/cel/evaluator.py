"""cel-python's tree-walking evaluator, extended for the Kubernetes DRA environment.

Additions over cel-python 0.5.0:

* ``cel.bind(var, value, body)`` and namespaced functions (``sets.contains``, ``lists.range``,
  ``strings.quote``) are recognised in the parse tree (cel-python would look up a variable ``cel``);
* the comprehension macros are reimplemented with CEL's error rules (``all``/``exists`` absorb
  errors when the result is decided by another element), with two-variable forms, and
  ``map(x, predicate, transform)``; ``min`` is a list function, not a macro;
* ``has()`` tests the presence of a map key instead of "evaluates without error";
* missing map keys report ``no such key: <key>`` and list indexes ``index out of range``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import lark
from celpy import celtypes
from celpy.evaluation import Activation, CELEvalError, Evaluator

from .checker import NAMESPACES, Tree, as_tree, bare_ident, unwrap
from .values import cel_kind

__all__ = ["DomainMap", "DraEvaluator"]


class DomainMap(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain reads as an empty map."""

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str) and not dict.__contains__(self, key):
            return celtypes.MapType()
        return super().__getitem__(key)


def _no_such_key(key: Any) -> CELEvalError:
    return CELEvalError(f"no such key: {key}")


class DraEvaluator(Evaluator):
    """Evaluator with the DRA environment's macros, namespaces and error messages."""

    def sub_evaluator(self, ast: Tree) -> DraEvaluator:
        return DraEvaluator(ast, activation=self.activation)

    def _eval_with(self, ast: Tree, bindings: dict[str, Any]) -> Any:
        nested = DraEvaluator(ast, activation=self.activation)
        try:
            return nested.evaluate(bindings)
        except CELEvalError as exc:
            return exc

    # ---- field selection and indexing ------------------------------------------------------------

    def member_dot(self, tree: Tree) -> Any:
        target_tree, name_token = tree.children
        target = self.visit(as_tree(target_tree))
        name = str(name_token)
        if isinstance(target, CELEvalError):
            return target
        if isinstance(target, celtypes.MapType):
            try:
                return target[celtypes.StringType(name)]
            except KeyError:
                return _no_such_key(name)
        return CELEvalError(f"type '{cel_kind(target)}' does not support field selection")

    def member_index(self, tree: Tree) -> Any:
        target_tree, index_tree = tree.children
        target = self.visit(as_tree(target_tree))
        index = self.visit(as_tree(index_tree))
        for value in (target, index):
            if isinstance(value, CELEvalError):
                return value
        if isinstance(target, dict):
            try:
                return target[index]
            except KeyError:
                return _no_such_key(index)
            except TypeError:
                return CELEvalError(f"unsupported key type: {cel_kind(index)}")
        if isinstance(target, list):
            if not isinstance(index, int) or isinstance(index, celtypes.BoolType):
                return CELEvalError(f"no such overload: list[{cel_kind(index)}]")
            if not 0 <= index < len(target):
                return CELEvalError(f"index out of range: {index}")
            return target[index]
        return CELEvalError(f"no such overload: {cel_kind(target)}[{cel_kind(index)}]")

    def function_eval(self, name_token: lark.Token, exprlist: Any = None) -> Any:
        if isinstance(exprlist, CELEvalError):
            return exprlist
        return self._call(str(name_token), list(exprlist or []))

    # ---- has() -------------------------------------------------------------------------------------

    def macro_has_eval(self, exprlist: Tree) -> Any:
        selection = unwrap(cast(Tree, exprlist.children[0]))
        if selection.data != "member_dot":
            return CELEvalError("invalid argument to has() macro")
        target_tree, name_token = selection.children
        target = self.visit(as_tree(target_tree))
        if isinstance(target, CELEvalError):
            return target
        if isinstance(target, celtypes.MapType):
            return celtypes.BoolType(dict.__contains__(target, celtypes.StringType(str(name_token))))
        return CELEvalError(f"invalid type for field selection: {cel_kind(target)}")

    # ---- methods, macros and namespaces --------------------------------------------------------

    def member_dot_arg(self, tree: Tree) -> Any:
        target_tree = cast(Tree, tree.children[0])
        name = str(tree.children[1])
        arg_trees: list[Tree] = []
        if len(tree.children) > 2:
            arg_trees = [c for c in cast(Tree, tree.children[2]).children if isinstance(c, lark.Tree)]
        namespace = bare_ident(target_tree)
        if namespace in NAMESPACES and not self._is_variable(namespace):
            if namespace == "cel" and name == "bind":
                return self._bind(arg_trees)
            return self._call(f"{namespace}.{name}", [self.visit(a) for a in arg_trees])
        if name in ("all", "exists", "exists_one", "existsOne", "map", "filter"):
            return self._comprehension(name, target_tree, arg_trees)
        target = self.visit(target_tree)
        return self._call(name, [target, *(self.visit(a) for a in arg_trees)])

    def _is_variable(self, name: str) -> bool:
        try:
            self.activation.identifiers.resolve_name(None, name)
        except KeyError:
            return False
        return True

    def _call(self, name: str, args: list[Any]) -> Any:
        for arg in args:
            if isinstance(arg, CELEvalError):
                return arg
        try:
            function = self.activation.resolve_function(name)
        except KeyError:
            return CELEvalError(f"undeclared reference to '{name}'")
        try:
            return function(*args)
        except (TypeError, AttributeError):
            kinds = ", ".join(cel_kind(a) for a in args)
            return CELEvalError(f"no such overload: {name}({kinds})")
        except ValueError as exc:
            return CELEvalError(f"{name}: {exc}")

    def _bind(self, arg_trees: list[Tree]) -> Any:
        var_tree, value_tree, body_tree = arg_trees
        value = self.visit(value_tree)
        if isinstance(value, CELEvalError):
            return value
        return self._eval_with(body_tree, {str(bare_ident(var_tree)): value})

    def _comprehension(self, name: str, target_tree: Tree, arg_trees: list[Tree]) -> Any:
        target = self.visit(target_tree)
        if isinstance(target, CELEvalError):
            return target
        if not isinstance(target, list | dict):
            return CELEvalError(f"no such overload: {name} over {cel_kind(target)}")
        var_names = [str(bare_ident(t)) for t in arg_trees[:-1]]
        body = arg_trees[-1]
        if name == "filter" or (name == "map" and len(arg_trees) == 3):
            return self._map_filter(
                name, target, var_names[0], arg_trees[1], arg_trees[2] if name == "map" else None
            )
        if name == "map":
            out = []
            for bindings in _iterate(target, var_names):
                value = self._eval_with(body, bindings)
                if isinstance(value, CELEvalError):
                    return value
                out.append(value)
            return celtypes.ListType(out)
        results = (self._eval_with(body, bindings) for bindings in _iterate(target, var_names))
        if name == "all":
            return _fold(results, decided=False, name=name)
        if name == "exists":
            return _fold(results, decided=True, name=name)
        count = 0
        for value in results:
            if isinstance(value, CELEvalError):
                return value
            if not isinstance(value, celtypes.BoolType):
                return CELEvalError(f"no such overload: {name} predicate returned {cel_kind(value)}")
            count += bool(value)
        return celtypes.BoolType(count == 1)

    def _map_filter(self, name: str, target: Any, var: str, predicate: Tree, transform: Tree | None) -> Any:
        out = []
        for bindings in _iterate(target, [var]):
            keep = self._eval_with(predicate, bindings)
            if isinstance(keep, CELEvalError):
                return keep
            if not isinstance(keep, celtypes.BoolType):
                return CELEvalError(f"no such overload: {name} predicate returned {cel_kind(keep)}")
            if not keep:
                continue
            value = bindings[var] if transform is None else self._eval_with(transform, bindings)
            if isinstance(value, CELEvalError):
                return value
            out.append(value)
        return celtypes.ListType(out)


def _iterate(target: Any, names: list[str]) -> Iterator[dict[str, Any]]:
    if isinstance(target, dict):
        for key in list(dict.keys(target)):
            if len(names) == 1:
                yield {names[0]: key}
            else:
                yield {names[0]: key, names[1]: dict.__getitem__(target, key)}
    else:
        for i, item in enumerate(target):
            if len(names) == 1:
                yield {names[0]: item}
            else:
                yield {names[0]: celtypes.IntType(i), names[1]: item}


def _fold(results: Iterable[Any], *, decided: bool, name: str) -> Any:
    """all (decided=False) / exists (decided=True): one decisive element wins over errors."""
    error: Any = None
    for value in results:
        if isinstance(value, celtypes.BoolType):
            if bool(value) == decided:
                return celtypes.BoolType(decided)
        elif isinstance(value, CELEvalError):
            error = error or value
        else:
            error = error or CELEvalError(f"no such overload: {name} predicate returned {cel_kind(value)}")
    return error if error is not None else celtypes.BoolType(not decided)


def new_activation(functions: dict[str, Callable[..., Any]]) -> Activation:
    """The base activation: cel-python's standard functions plus the DRA library."""
    return Activation(functions=functions)
