"""``dra-operator simulate``: allocate claims offline, as the scheduler would, and explain the result.

Input: YAML or JSON files (``-f -`` reads stdin) holding DeviceClass, ResourceSlice, ResourceClaim
and Node objects (``resource.k8s.io`` v1, v1beta2 or v1beta1), one per document or in a ``List`` as
``kubectl get -o yaml`` prints it. Claims with ``status.allocation`` hold their devices; the
others are pending and are allocated together, in input order, like a pod's claims. Output:
``-o json`` / ``yaml`` (one object: outcome, node, claims with their v1 allocations, explanation,
error) or ``table``. Exit code 0: allocated, 1: unallocatable, 2: error. Bad input gives one line
on stderr naming the file, the object and the field; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import yaml

from dra_api.model import (
    V1BETA1,
    AllocationResult,
    DeviceClass,
    ModelError,
    Node,
    ResourceClaim,
    ResourceSlice,
)
from dra_api.oneline import OneLineParser
from dra_operator.allocator import FeatureGates
from dra_operator.base.settings import SEARCH_BUDGET_S, add_search_budget_argument
from dra_operator.cel import CelCompileError, WorkBudget, compile_selector
from dra_operator.planner import (
    POLICIES,
    NotPlaced,
    OutOfBudget,
    PlanError,
    Planned,
    Planner,
    PlanOutcome,
)

PROG = "dra-operator simulate"
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_KINDS = ("DeviceClass", "ResourceSlice", "ResourceClaim", "Node")


class InputError(Exception):
    """Bad input or flags: one line for stderr."""


class _Parser(OneLineParser):
    error_class = InputError


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Allocate pending ResourceClaims offline and explain the result.",
    )
    parser.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        metavar="FILE",
        help="YAML or JSON file of DeviceClass, ResourceSlice, ResourceClaim and Node objects "
        "('-': stdin); repeatable",
    )
    parser.add_argument(
        "--node", help="allocate on this node only (its Node object, if given, supplies labels)"
    )
    parser.add_argument(
        "--feature-gates",
        default="",
        metavar="Name=true,...",
        help="DRA feature gates (Kubernetes 1.36 defaults)",
    )
    parser.add_argument("--policy", choices=POLICIES, default=POLICIES[0], help="how to choose among nodes")
    add_search_budget_argument(parser)
    parser.add_argument("-o", "--output", choices=("json", "yaml", "table"), default="table")
    return parser


# ---- input ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class Loaded:
    """The objects of all files, each with the file it came from (for messages)."""

    classes: dict[str, DeviceClass] = field(default_factory=dict)
    slices: list[ResourceSlice] = field(default_factory=list)
    nodes: dict[str, Node] = field(default_factory=dict)
    claims: list[tuple[ResourceClaim, str, Mapping[str, Any]]] = field(default_factory=list)
    class_files: dict[str, str] = field(default_factory=dict)


def _read(path: str, stdin: TextIO) -> str:
    if path == "-":
        return stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text: {exc.reason}") from exc


def _documents(path: str, text: str) -> list[Any]:
    name = "<stdin>" if path == "-" else path
    if text.lstrip().startswith(("{", "[")):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            pass  # YAML flow style also starts with a brace; let the YAML parser judge
        else:
            return doc if isinstance(doc, list) else [doc]
    try:
        # libyaml's loader where PyYAML has it: the pure-Python one takes about 8 times as long
        # (1.6 s over the YAML export of 50 nodes of 8 GPUs, growing with the cluster).
        return [d for d in yaml.load_all(text, Loader=_SAFE_LOADER) if d is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise InputError(f"{name}: invalid YAML{where}: {exc.problem or exc}") from exc
    except yaml.YAMLError as exc:
        raise InputError(f"{name}: invalid YAML: {exc}") from exc


def _objects(name: str, docs: Sequence[Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(location, object) with List documents expanded."""
    for n, doc in enumerate(docs, 1):
        where = f"{name}: document {n}"
        if not isinstance(doc, Mapping):
            raise InputError(f"{where}: expected an object, not {type(doc).__name__}")
        kind = doc.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and "items" in doc:
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise InputError(f"{where} ({kind}): items: must be a list")
            item_kind = kind[: -len("List")] if kind != "List" else None
            for i, item in enumerate(items):
                if not isinstance(item, Mapping):
                    raise InputError(f"{where} ({kind}): items[{i}]: expected an object")
                if item_kind and "kind" not in item:  # typed lists may leave kind out of items
                    item = {
                        **item,
                        "kind": item_kind,
                        "apiVersion": item.get("apiVersion", doc.get("apiVersion")),
                    }
                yield f"{where}, items[{i}]", item
        else:
            yield where, doc


def load(paths: Sequence[str], *, stdin: TextIO) -> Loaded:
    out = Loaded()
    for path in paths:
        name = "<stdin>" if path == "-" else path
        for where, obj in _objects(name, _documents(path, _read(path, stdin))):
            kind = obj.get("kind")
            try:
                if kind == "DeviceClass":
                    cls = DeviceClass.from_json(obj)
                    out.classes[cls.name] = cls
                    out.class_files[cls.name] = name
                elif kind == "ResourceSlice":
                    out.slices.append(ResourceSlice.from_json(obj))
                elif kind == "ResourceClaim":
                    out.claims.append((ResourceClaim.from_json(obj), name, obj))
                elif kind == "Node":
                    node = Node.from_json(obj)
                    out.nodes[node.name] = node
                else:
                    raise InputError(
                        f"{where}: unsupported kind {kind!r}; expected one of {', '.join(_KINDS)} "
                        "(or a List of them)"
                    )
            except ModelError as exc:
                raise InputError(f"{name}: {exc}") from exc
    return out


def validate(loaded: Loaded) -> None:
    """Selectors that do not compile and missing classes, named by file, object and field."""
    for cls in loaded.classes.values():
        for i, selector in enumerate(cls.selectors):
            problem = _compile_problem(selector.cel)
            if problem:
                raise InputError(
                    f"{loaded.class_files[cls.name]}: DeviceClass {cls.name}: "
                    f"spec.selectors[{i}].cel.expression: {problem}"
                )
    for claim, name, raw in loaded.claims:
        if claim.status.allocation is not None:
            continue
        beta1 = raw.get("apiVersion") == V1BETA1
        for ri, request in enumerate(claim.spec.requests):
            base = f"spec.devices.requests[{ri}]"
            if request.exactly is not None:
                specs = [(base if beta1 else f"{base}.exactly", request.exactly)]
            else:
                specs = [
                    (f"{base}.firstAvailable[{si}]", s.spec) for si, s in enumerate(request.first_available)
                ]
            for path, spec in specs:
                what = f"{name}: ResourceClaim {claim.ref}: {path}"
                if spec.device_class_name not in loaded.classes:
                    raise InputError(
                        f"{what}.deviceClassName: DeviceClass {spec.device_class_name!r} "
                        "not found in the input"
                    )
                for si, selector in enumerate(spec.selectors):
                    problem = _compile_problem(selector.cel)
                    if problem:
                        raise InputError(f"{what}.selectors[{si}].cel.expression: {problem}")


def _compile_problem(expression: str | None) -> str | None:
    if expression is None:
        return "not a CEL selector (unsupported selector type)"
    try:
        compile_selector(expression)
    except CelCompileError as exc:
        return f"CEL compile error: {' '.join(str(exc).split())}"
    return None


# ---- output --------------------------------------------------------------------------------------


def _table(result: dict[str, Any]) -> str:
    header = ("CLAIM", "REQUEST", "DRIVER", "POOL", "DEVICE", "NODE")
    rows: list[tuple[str, ...]] = []
    for claim in result["claims"]:
        allocation = claim["allocation"]
        if not allocation:
            continue
        for r in allocation.get("devices", {}).get("results", []):
            rows.append(
                (
                    f"{claim['namespace']}/{claim['name']}",
                    r["request"],
                    r["driver"],
                    r["pool"],
                    r["device"],
                    result["node"] or "<any>",
                )
            )
    lines: list[str] = []
    if rows:
        widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
        for row in (header, *rows):
            lines.append("   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        lines.append("")
    # An error goes to stderr as well; an explanation kept beside it (invalid pools) is printed.
    text = result["explanation"] or (result["error"] if result["outcome"] == "error" else "")
    if text:
        lines.append(text)
    return "\n".join(lines) + "\n"


def render(result: dict[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(result, indent=2) + "\n"
    if output == "yaml":
        return str(yaml.safe_dump(result, sort_keys=False, default_flow_style=False))
    return _table(result)


# ---- entry point ---------------------------------------------------------------------------------


def simulate(args: argparse.Namespace, *, stdin: TextIO) -> tuple[dict[str, Any], int]:
    try:
        gates = FeatureGates.from_flag(args.feature_gates)
    except ValueError as exc:
        raise InputError(f"--feature-gates: {exc}") from exc
    loaded = load(args.files, stdin=stdin)
    validate(loaded)
    pending = [c for c, _, _ in loaded.claims if c.status.allocation is None]
    if not pending:
        raise InputError(
            f"{', '.join(args.files)}: no pending ResourceClaim (one without status.allocation) in the input"
        )
    outcome = plan(
        classes=loaded.classes,
        slices=loaded.slices,
        nodes=loaded.nodes.values(),
        allocated=[c.status.allocation for c, _, _ in loaded.claims if c.status.allocation is not None],
        pending=pending,
        node=args.node,
        gates=gates,
        policy=args.policy,
        budget_s=args.budget_s,
    )
    return result_of(outcome, pending=pending, policy=args.policy)


def plan(
    *,
    classes: Mapping[str, DeviceClass],
    slices: Sequence[ResourceSlice],
    nodes: Iterable[Node],
    allocated: Iterable[AllocationResult],
    pending: Sequence[ResourceClaim],
    node: str | None,
    gates: FeatureGates,
    policy: str,
    budget_s: float = SEARCH_BUDGET_S,
) -> PlanOutcome:
    """Allocate ``pending`` together, on ``node`` only when given, against the other objects (the
    devices of ``allocated`` are taken), within ``budget_s`` seconds of this thread's CPU time, as
    the operator would. Nodes known only from their slices, or from ``node``, take part without
    labels. Shared with ``kubectl dra explain``, which feeds it the live cluster."""
    by_name = {n.name: n for n in nodes}
    for s in slices:
        if s.node_name and s.node_name not in by_name:
            by_name[s.node_name] = Node.make(s.node_name)  # a node known only from its slices: no labels
    if node and node not in by_name:
        by_name[node] = Node.make(node)
    planner = Planner(
        classes=classes,
        slices=slices,
        nodes=by_name.values(),
        allocated=allocated,
        gates=gates,
        policy=policy,
    )
    return planner.plan(pending, node=node, budget=WorkBudget.thread_cpu(budget_s))


def result_of(
    outcome: PlanOutcome, *, pending: Sequence[ResourceClaim], policy: str
) -> tuple[dict[str, Any], int]:
    """The printed result of :func:`plan` and the exit code (0 allocated, 1 unallocatable, 2 error)."""
    result: dict[str, Any] = {
        "outcome": "error",
        "node": None,
        "claims": [{"namespace": c.namespace, "name": c.name, "allocation": None} for c in pending],
        "explanation": "",
        "error": None,
    }
    if isinstance(outcome, Planned):
        result["outcome"] = "allocated"
        result["node"] = outcome.node if outcome.node_bound else None
        for entry, allocation in zip(result["claims"], outcome.allocations, strict=True):
            entry["allocation"] = allocation.to_json()
        where = f"node {outcome.node}" if outcome.node_bound else "devices reachable from every node"
        result["explanation"] = (
            f"allocated {len(pending)} claim{'s' if len(pending) != 1 else ''} on {where} "
            f"({outcome.tried} node{'s' if outcome.tried != 1 else ''} searched, policy {policy})"
        )
        return result, 0
    if isinstance(outcome, NotPlaced):
        result["explanation"] = outcome.explanation.full
        if outcome.invalid_pools:
            # Upstream's allocator fails such a node with an error: the slices need fixing, not
            # more capacity. The explanation stays, for what the other nodes lacked.
            result["error"] = "invalid ResourceSlice pools: " + "; ".join(
                f"{pool} on node {node}" for node, pool in outcome.invalid_pools
            )
            return result, 2
        result["outcome"] = "unallocatable"
        return result, 1
    if isinstance(outcome, OutOfBudget):
        result["outcome"] = "unfinished"
        result["explanation"] = outcome.explanation.full
        return result, 1
    assert isinstance(outcome, PlanError)
    result["error"] = outcome.message
    return result, 2


def main(
    argv: Sequence[str] | None = None, *, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> int:
    out = stdout or sys.stdout
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        result, code = simulate(args, stdin=stdin or sys.stdin)
    except InputError as exc:
        print(f"{PROG}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except RecursionError:
        print(f"{PROG}: input nested too deeply", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug must still not print a traceback at the user
        print(f"{PROG}: internal error: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    out.write(render(result, args.output))
    if code == 2 and result["error"]:
        print(f"{PROG}: {' '.join(str(result['error']).split())}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
