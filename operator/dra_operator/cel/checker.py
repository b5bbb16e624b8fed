"""Static checks of a parsed selector, standing in for cel-go's type checker.

cel-python has no checker: an unknown variable or function only fails when evaluated. Kubernetes
rejects such selectors when they are compiled, so this module walks the parse tree with a small type
inference and reports, as compile errors: undeclared references, unknown fields of ``device``,
functions and macros used with the wrong receiver or number of arguments, operators applied to types
that have no such overload, and a result that cannot be a bool. Anything not known precisely is
``dyn`` and left to evaluation, as attribute values are in the upstream declarations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TypeAlias

import lark

from .declarations import ANY_RECEIVER, DYN, OPTIONAL, Overload
from .errors import CelCompileError
from .library import DECLARATIONS

__all__ = ["NAMESPACES", "Tree", "as_tree", "bare_ident", "check", "infer", "literal_string", "unwrap"]

# Parse trees of cel-python's lark grammar.
Tree: TypeAlias = "lark.Tree[lark.Token]"

# Types: CEL type names, DYN, OPTIONAL, and DRA-specific map types.
DEVICE: Final = "DRADevice"
ATTRIBUTES: Final = "map(string, map(string, dyn))"
CAPACITY: Final = "map(string, map(string, Quantity))"
ATTR_DOMAIN: Final = "map(string, dyn)"
CAP_DOMAIN: Final = "map(string, Quantity)"

_DEVICE_FIELDS: Final = {
    "driver": "string",
    "attributes": ATTRIBUTES,
    "capacity": CAPACITY,
    "allowMultipleAllocations": "bool",
}
_MAP_TYPES: Final = frozenset({"map", ATTRIBUTES, CAPACITY, ATTR_DOMAIN, CAP_DOMAIN})
_NUMERIC: Final = frozenset({"int", "uint", "double"})
_ORDERED: Final = frozenset({"int", "uint", "double", "string", "bytes", "bool", "timestamp", "duration"})
_TYPE_NAMES: Final = frozenset(
    {"int", "uint", "double", "string", "bool", "bytes", "list", "map", "null_type", "type"}
)
# Namespaces of functions called as ``ns.name(...)``.
NAMESPACES: Final = frozenset({"cel", "sets", "lists", "strings", "optional"})


_MACROS: Final = {
    "all": (2, 3),
    "exists": (2, 3),
    "exists_one": (2, 3),
    "existsOne": (2, 3),
    "map": (2, 3),
    "filter": (2,),
}


def as_tree(node: object) -> Tree:
    """Narrow a parse-tree child to a subtree (the grammar guarantees it where this is used)."""
    if not isinstance(node, lark.Tree):
        raise CelCompileError(f"compilation failed: unexpected token {node!r}")
    return node


def unwrap(node: Tree) -> Tree:
    """Descend through single-child wrapper nodes (expr -> ... -> member -> primary)."""
    while (
        node.data
        in ("expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary")
        or node.data in ("member", "primary", "paren_expr")
    ) and len(node.children) == 1:
        child = node.children[0]
        if not isinstance(child, lark.Tree):
            break
        node = child
    return node


def literal_string(node: Tree) -> str | None:
    """The value of a string literal expression, or None if the node is anything else."""
    from celpy.evaluation import celstr  # local: only needed for literals

    inner = unwrap(node)
    if inner.data != "literal":
        return None
    token = inner.children[0]
    if isinstance(token, lark.Token) and token.type in ("STRING_LIT", "MLSTRING_LIT"):
        return str(celstr(token))
    return None


def bare_ident(node: Tree) -> str | None:
    inner = unwrap(node)
    if inner.data == "ident":
        token = inner.children[0]
        return str(token) if isinstance(token, lark.Token) else None
    return None


def _is_map(kind: str) -> bool:
    return kind in _MAP_TYPES


class _Checker:
    def __init__(self, text: str) -> None:
        self.text = text

    def fail(self, node: Tree | lark.Token, message: str) -> CelCompileError:
        line = (
            getattr(node, "line", None) if isinstance(node, lark.Token) else getattr(node.meta, "line", None)
        )
        column = (
            getattr(node, "column", None)
            if isinstance(node, lark.Token)
            else getattr(node.meta, "column", None)
        )
        where = f"<input>:{line}:{column}: " if line is not None else ""
        return CelCompileError(f"compilation failed: ERROR: {where}{message}")

    def check(self, node: Tree, scope: Mapping[str, str]) -> str:
        method = getattr(self, "_" + node.data, None)
        if method is None:
            raise self.fail(node, f"unsupported syntax ({node.data})")
        result: str = method(node, scope)
        return result

    def _children(self, node: Tree, scope: Mapping[str, str]) -> list[str]:
        return [self.check(c, scope) for c in node.children if isinstance(c, lark.Tree)]

    # ---- operators -----------------------------------------------------------------------------

    def _expr(self, node: Tree, scope: Mapping[str, str]) -> str:
        if len(node.children) == 1:
            return self.check(as_tree(node.children[0]), scope)
        cond, left, right = self._children(node, scope)
        self._want_bool(node, cond, "_?_:_")
        return left if left == right else DYN

    def _logical(self, node: Tree, scope: Mapping[str, str], op: str) -> str:
        if len(node.children) == 1:
            return self.check(as_tree(node.children[0]), scope)
        for kind in self._children(node, scope):
            self._want_bool(node, kind, op)
        return "bool"

    def _conditionalor(self, node: Tree, scope: Mapping[str, str]) -> str:
        return self._logical(node, scope, "_||_")

    def _conditionaland(self, node: Tree, scope: Mapping[str, str]) -> str:
        return self._logical(node, scope, "_&&_")

    def _want_bool(self, node: Tree, kind: str, op: str) -> None:
        if kind not in ("bool", DYN):
            raise self.fail(node, f"found no matching overload for '{op}' applied to '({kind})'")

    def _relation(self, node: Tree, scope: Mapping[str, str]) -> str:
        if len(node.children) == 1:
            return self.check(as_tree(node.children[0]), scope)
        op_node, right_node = node.children
        assert isinstance(op_node, lark.Tree)
        assert isinstance(right_node, lark.Tree)
        left = self.check(as_tree(op_node.children[0]), scope)
        right = self.check(right_node, scope)
        op = op_node.data
        symbol = {
            "relation_lt": "_<_",
            "relation_le": "_<=_",
            "relation_gt": "_>_",
            "relation_ge": "_>=_",
            "relation_eq": "_==_",
            "relation_ne": "_!=_",
            "relation_in": "@in",
        }[str(op)]
        if op == "relation_in":
            if right not in (DYN, "list") and not _is_map(right):
                raise self.fail(node, f"found no matching overload for '@in' applied to '({left}, {right})'")
            return "bool"
        if DYN in (left, right):
            return "bool"
        if op in ("relation_eq", "relation_ne"):
            compatible = (
                left == right
                or (left in _NUMERIC and right in _NUMERIC)
                or (_is_map(left) and _is_map(right))
                or "null" in (left, right)
            )
        else:
            compatible = (
                left in _ORDERED
                and right in _ORDERED
                and (left == right or (left in _NUMERIC and right in _NUMERIC))
            )
        if not compatible:
            raise self.fail(node, f"found no matching overload for '{symbol}' applied to '({left}, {right})'")
        return "bool"

    def _arith(self, node: Tree, scope: Mapping[str, str], allowed: Mapping[str, frozenset[str]]) -> str:
        if len(node.children) == 1:
            return self.check(as_tree(node.children[0]), scope)
        op_node, right_node = node.children
        assert isinstance(op_node, lark.Tree)
        assert isinstance(right_node, lark.Tree)
        left = self.check(as_tree(op_node.children[0]), scope)
        right = self.check(right_node, scope)
        kinds = allowed[str(op_node.data)]
        if DYN in (left, right):
            known = right if left == DYN else left
            if known != DYN and known not in kinds:
                raise self.fail(
                    node, f"found no matching overload for '{op_node.data}' applied to '({left}, {right})'"
                )
            return known
        if left != right or left not in kinds:
            raise self.fail(
                node, f"found no matching overload for '{op_node.data}' applied to '({left}, {right})'"
            )
        return left

    def _addition(self, node: Tree, scope: Mapping[str, str]) -> str:
        plus = frozenset({"int", "uint", "double", "string", "bytes", "list", "duration", "timestamp"})
        minus = frozenset({"int", "uint", "double", "duration", "timestamp"})
        return self._arith(node, scope, {"addition_add": plus, "addition_sub": minus})

    def _multiplication(self, node: Tree, scope: Mapping[str, str]) -> str:
        nums = frozenset({"int", "uint", "double"})
        ints = frozenset({"int", "uint"})
        return self._arith(
            node, scope, {"multiplication_mul": nums, "multiplication_div": nums, "multiplication_mod": ints}
        )

    def _unary(self, node: Tree, scope: Mapping[str, str]) -> str:
        if len(node.children) == 1:
            return self.check(as_tree(node.children[0]), scope)
        op_node, operand = node.children
        assert isinstance(op_node, lark.Tree)
        assert isinstance(operand, lark.Tree)
        kind = self.check(operand, scope)
        if op_node.data == "unary_not":
            self._want_bool(node, kind, "!_")
            return "bool"
        if kind not in (DYN, "int", "double", "duration"):
            raise self.fail(node, f"found no matching overload for '-_' applied to '({kind})'")
        return kind

    # ---- members -------------------------------------------------------------------------------

    def _member(self, node: Tree, scope: Mapping[str, str]) -> str:
        return self.check(as_tree(node.children[0]), scope)

    def _member_dot(self, node: Tree, scope: Mapping[str, str]) -> str:
        target_node, name_token = node.children
        assert isinstance(target_node, lark.Tree)
        name = str(name_token)
        ns = bare_ident(target_node)
        if ns in NAMESPACES and ns not in scope:
            raise self.fail(node, f"undeclared reference to '{ns}.{name}'")
        target = self.check(target_node, scope)
        return self._select(node, target, name)

    def _member_dot_opt(self, node: Tree, scope: Mapping[str, str]) -> str:
        target = self.check(as_tree(node.children[0]), scope)
        if target != OPTIONAL:
            self._select(node, target, str(node.children[1]))
        return OPTIONAL

    def _member_index_opt(self, node: Tree, scope: Mapping[str, str]) -> str:
        target = self.check(as_tree(node.children[0]), scope)
        self.check(as_tree(node.children[1]), scope)
        if target not in (OPTIONAL, DYN, "list") and not _is_map(target):
            raise self.fail(node, f"found no matching overload for '_[?_]' applied to '({target})'")
        return OPTIONAL

    def _select(self, node: Tree, target: str, name: str) -> str:
        if target == OPTIONAL:
            return OPTIONAL
        if target == DEVICE:
            if name not in _DEVICE_FIELDS:
                raise self.fail(node, f"undefined field '{name}'")
            return _DEVICE_FIELDS[name]
        if target == ATTRIBUTES:
            return ATTR_DOMAIN
        if target == CAPACITY:
            return CAP_DOMAIN
        if target == CAP_DOMAIN:
            return "Quantity"
        if target in (ATTR_DOMAIN, "map", DYN):
            return DYN
        raise self.fail(node, f"type '{target}' does not support field selection")

    def _member_index(self, node: Tree, scope: Mapping[str, str]) -> str:
        target_node, index_node = node.children
        assert isinstance(target_node, lark.Tree)
        assert isinstance(index_node, lark.Tree)
        target = self.check(target_node, scope)
        index = self.check(index_node, scope)
        if target == DEVICE:
            raise self.fail(node, f"found no matching overload for '_[_]' applied to '({DEVICE}, {index})'")
        if _is_map(target):
            if index not in ("string", DYN) and target != "map":
                raise self.fail(
                    node, f"found no matching overload for '_[_]' applied to '({target}, {index})'"
                )
            return self._select(node, target, "")
        if target == "list":
            if index not in ("int", "uint", DYN):
                raise self.fail(node, f"found no matching overload for '_[_]' applied to '(list, {index})'")
            return DYN
        if target in (DYN, OPTIONAL):
            return target
        raise self.fail(node, f"found no matching overload for '_[_]' applied to '({target}, {index})'")

    def _member_object(self, node: Tree, scope: Mapping[str, str]) -> str:
        raise self.fail(node, "message construction is not supported in device selectors")

    def _args(self, node: Tree) -> list[Tree]:
        if len(node.children) < 3:
            return []
        exprlist = node.children[2]
        assert isinstance(exprlist, lark.Tree)
        return [c for c in exprlist.children if isinstance(c, lark.Tree)]

    def _member_dot_arg(self, node: Tree, scope: Mapping[str, str]) -> str:
        target_node, name_token = node.children[:2]
        assert isinstance(target_node, lark.Tree)
        name = str(name_token)
        args = self._args(node)
        ns = bare_ident(target_node)
        if ns in NAMESPACES and ns not in scope:
            if ns == "cel" and name == "bind":
                return self._bind(node, args, scope)
            return self._call(node, f"{ns}.{name}", None, args, scope)
        if name in _MACROS:
            return self._macro(node, name, target_node, args, scope)
        target = self.check(target_node, scope)
        return self._call(node, name, target, args, scope)

    def _var_name(self, node: Tree, macro: str) -> str:
        name = bare_ident(node)
        if name is None:
            raise self.fail(node, f"{macro}() variable name must be a simple identifier")
        return name

    def _bind(self, node: Tree, args: list[Tree], scope: Mapping[str, str]) -> str:
        if len(args) != 3:
            raise self.fail(node, "cel.bind() takes exactly 3 arguments: variable, value, expression")
        var = self._var_name(args[0], "cel.bind")
        value = self.check(args[1], scope)
        return self.check(args[2], {**scope, var: value})

    def _macro(
        self,
        node: Tree,
        name: str,
        target_node: Tree,
        args: list[Tree],
        scope: Mapping[str, str],
    ) -> str:
        if len(args) not in _MACROS[name]:
            counts = " or ".join(str(n) for n in _MACROS[name])
            raise self.fail(node, f"{name}() macro takes {counts} arguments, got {len(args)}")
        target = self.check(target_node, scope)
        if target not in ("list", DYN) and not _is_map(target):
            raise self.fail(node, f"{name}() cannot iterate over type '{target}'")
        element = "string" if target in (ATTRIBUTES, CAPACITY, ATTR_DOMAIN, CAP_DOMAIN) else DYN
        if (name == "map" and len(args) == 3) or name == "filter":
            # map(x, filter, transform) and filter(x, predicate): one variable.
            var = self._var_name(args[0], name)
            inner = {**scope, var: element}
            self._want_bool(node, self.check(args[1], inner), name)
            if name == "map":
                self.check(args[2], inner)
            return "list"
        if name == "map":
            var = self._var_name(args[0], name)
            self.check(args[1], {**scope, var: element})
            return "list"
        # all / exists / exists_one / existsOne, with one or two variables.
        names = [self._var_name(a, name) for a in args[:-1]]
        if len(names) == 2:
            first = "int" if target == "list" else element
            second = DYN if target in ("list", DYN, "map", ATTRIBUTES, ATTR_DOMAIN) else "Quantity"
            if target == ATTRIBUTES:
                second = ATTR_DOMAIN
            elif target == CAPACITY:
                second = CAP_DOMAIN
            inner = {**scope, names[0]: first, names[1]: second}
        else:
            inner = {**scope, names[0]: element}
        self._want_bool(node, self.check(args[-1], inner), name)
        return "bool"

    def _call(
        self,
        node: Tree,
        name: str,
        receiver: str | None,
        args: list[Tree],
        scope: Mapping[str, str],
    ) -> str:
        arg_kinds = [self.check(a, scope) for a in args]
        # A function's overloads are declared with its implementation (the library package).
        declaration = DECLARATIONS.get(name)
        if declaration is None:
            raise self.fail(node, f"undeclared reference to '{name}' (in container '')")
        matches: list[Overload] = []
        for sig in declaration.overloads:
            if len(arg_kinds) not in sig.arities:
                continue
            if receiver is None and sig.receivers is None:
                matches.append(sig)
            elif receiver is not None and sig.receivers is not None:
                effective = receiver
                if _is_map(receiver):
                    effective = "map"
                if receiver == DYN or ANY_RECEIVER in sig.receivers or effective in sig.receivers:
                    matches.append(sig)
        if not matches:
            shown = ", ".join(arg_kinds)
            call = f"{receiver}.{name}({shown})" if receiver is not None else f"{name}({shown})"
            raise self.fail(node, f"found no matching overload for '{name}' applied to '{call}'")
        results = {sig.result for sig in matches}
        return results.pop() if len(results) == 1 else DYN

    # ---- primaries -----------------------------------------------------------------------------

    def _primary(self, node: Tree, scope: Mapping[str, str]) -> str:
        return self.check(as_tree(node.children[0]), scope)

    def _paren_expr(self, node: Tree, scope: Mapping[str, str]) -> str:
        return self.check(as_tree(node.children[0]), scope)

    def _literal(self, node: Tree, scope: Mapping[str, str]) -> str:
        token = node.children[0]
        assert isinstance(token, lark.Token)
        return {
            "INT_LIT": "int",
            "UINT_LIT": "uint",
            "FLOAT_LIT": "double",
            "STRING_LIT": "string",
            "MLSTRING_LIT": "string",
            "BYTES_LIT": "bytes",
            "BOOL_LIT": "bool",
            "NULL_LIT": "null",
        }.get(token.type, DYN)

    def _list_lit(self, node: Tree, scope: Mapping[str, str]) -> str:
        self._children(node, scope)
        return "list"

    def _map_lit(self, node: Tree, scope: Mapping[str, str]) -> str:
        self._children(node, scope)
        return "map"

    def _exprlist(self, node: Tree, scope: Mapping[str, str]) -> str:
        self._children(node, scope)
        return "list"

    def _mapinits(self, node: Tree, scope: Mapping[str, str]) -> str:
        self._children(node, scope)
        return "map"

    def _ident(self, node: Tree, scope: Mapping[str, str]) -> str:
        name = str(node.children[0])
        if name in scope:
            return scope[name]
        if name == "device":
            return DEVICE
        if name in _TYPE_NAMES:
            return "type"
        raise self.fail(node, f"undeclared reference to '{name}' (in container '')")

    def _dot_ident(self, node: Tree, scope: Mapping[str, str]) -> str:
        return self._ident(node, {})

    def _dot_ident_arg(self, node: Tree, scope: Mapping[str, str]) -> str:
        return self._ident_arg(node, scope)

    def _ident_arg(self, node: Tree, scope: Mapping[str, str]) -> str:
        name = str(node.children[0])
        args: list[Tree] = []
        if len(node.children) > 1:
            exprlist = node.children[1]
            assert isinstance(exprlist, lark.Tree)
            args = [c for c in exprlist.children if isinstance(c, lark.Tree)]
        if name == "has":
            if len(args) != 1 or unwrap(args[0]).data != "member_dot":
                raise self.fail(node, "invalid argument to has() macro")
            self.check(args[0], scope)
            return "bool"
        return self._call(node, name, None, args, scope)


def infer(tree: Tree, text: str) -> str:
    """Check a parsed expression of any result type; return that type or raise CelCompileError."""
    return _Checker(text).check(tree, {})


def check(tree: Tree, text: str) -> str:
    """Check a parsed selector; return its result type or raise CelCompileError."""
    kind = infer(tree, text)
    if kind not in ("bool", DYN):
        raise CelCompileError(f"compilation failed: expression must evaluate to bool, not {kind}")
    return kind
