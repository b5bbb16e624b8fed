"""``kubectl-dra``: flags as kubectl spells them, exit codes, one-line errors.

Exit codes: 0 done (for ``explain``: the claim is allocated, or would be), 1 ``explain``: the claim
cannot be allocated (there), 2 a bad argument, an unknown claim, a bad kubeconfig or context, a
server that cannot be reached or refuses the lists. Errors are one line on stderr starting with
``error:``, as kubectl prints them; never a traceback.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import yaml

from dra_api.oneline import OneLineParser
from dra_operator.base.settings import PLACEMENT_POLICIES, add_search_budget_argument

# The subcommands' modules, the client and the allocator are imported when a command needs them:
# importing all of them took about 1.5 s of every run (--help included), and only explain needs the
# planner and allocator, only devices the CEL evaluator.
if TYPE_CHECKING:
    from dra_operator.kubectl_dra.cluster import ClusterObjects

# What each command lists: a large cluster's slices and nodes are most of the bytes, and a command
# lists only what it shows. devices: nodes only for --node (which slices reach it); claims: no
# slices (a row names its devices as the allocation does), nodes only for an allocation not pinned
# to one node by name (see cluster.needs_nodes).
DEVICES_LISTS = ("deviceclasses", "resourceslices", "resourceclaims", "pods")
CLAIMS_LISTS = ("deviceclasses", "resourceclaims", "pods")

PROG = "kubectl dra"
USAGE_ERROR = 2


class UsageError(Exception):
    """A bad argument or configuration, an unknown object, an unreachable server: one line."""


class _Parser(OneLineParser):
    error_class = UsageError
    hint = "; see '{prog} --help'"  # kubectl's words


def _common(parser: argparse.ArgumentParser, *, namespaced: bool) -> None:
    parser.add_argument(
        "--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument("--context", help="the kubeconfig context to use (default: its current context)")
    if namespaced:
        parser.add_argument("-n", "--namespace", help="the namespace (default: the context's, or 'default')")
    parser.add_argument(
        "-o", "--output", choices=("wide", "json", "yaml"), help="output format (default: a table)"
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="give up reading the cluster after this long (default: 30)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Devices, claims and allocation explanations of a cluster running the accel-dra driver.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    devices = sub.add_parser(
        "devices",
        help="devices per node: health, taints, the claim and pod holding each; totals per class",
        description="List every device of every ResourceSlice with its health (its taints), the claim "
        "and pods holding it, and totals per DeviceClass.",
    )
    _common(devices, namespaced=False)
    devices.add_argument("--node", help="only the devices this node can reach")
    claims = sub.add_parser(
        "claims",
        help="claims: state, allocator (scheduler or operator), node, devices, consumers, age",
        description="List ResourceClaims with their state, who allocated them (kube-scheduler or the "
        "operator; for a pending claim, who is expected to), node, devices, consumers and age.",
    )
    _common(claims, namespaced=True)
    claims.add_argument("-A", "--all-namespaces", action="store_true", help="claims of every namespace")
    explain = sub.add_parser(
        "explain",
        help="why a claim is pending (the operator's explanation), or where it went and why it fits",
        description="For a pending claim: the operator's allocator run on the cluster's current objects "
        "and its explanation (the text of 'dra-operator simulate'). For an allocated claim: its node, "
        "devices and why they fit. Exit code 0: allocated (or would be), 1: cannot be allocated, "
        "2: error.",
    )
    explain.add_argument("claim", metavar="CLAIM", help="the ResourceClaim's name")
    _common(explain, namespaced=True)
    explain.add_argument("--node", help="what if: allocate on this node only")
    explain.add_argument(
        "--policy",
        choices=PLACEMENT_POLICIES,
        default=PLACEMENT_POLICIES[0],
        help="how to choose among nodes",
    )
    explain.add_argument(
        "--feature-gates",
        default="",
        metavar="Name=true,...",
        help="DRA feature gates (Kubernetes 1.36 defaults)",
    )
    add_search_budget_argument(explain)
    return parser


# ---- configuration -------------------------------------------------------------------------------


def kubeconfig_path(flag: str | None, *, environ: dict[str, str] | None = None) -> str | None:
    """The kubeconfig kubectl would use: the flag, the first existing file of $KUBECONFIG, or
    ~/.kube/config; None (in-cluster) when there is none and the pod's ServiceAccount is there."""
    env = os.environ if environ is None else environ
    if flag:
        if not Path(flag).is_file():
            raise UsageError(f"stat {flag}: no such file or directory")
        return flag
    for entry in (env.get("KUBECONFIG") or "").split(os.pathsep):
        if entry and Path(entry).is_file():
            return entry
    default = Path(env.get("HOME") or Path.home()) / ".kube" / "config"
    if default.is_file():
        return str(default)
    if env.get("KUBERNETES_SERVICE_HOST"):
        return None
    raise UsageError("no configuration has been provided, try setting KUBECONFIG or --kubeconfig")


def context_namespace(path: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig's context (``default`` when it names none)."""
    if path is None:
        try:
            return Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip()
        except OSError:
            return "default"
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read kubeconfig {path}: {' '.join(str(exc).split())}") from exc
    if not isinstance(doc, dict):
        raise UsageError(f"kubeconfig {path} is not a kubeconfig")
    name = context or doc.get("current-context")
    for entry in doc.get("contexts") or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return str((entry.get("context") or {}).get("namespace") or "default")
    if context:
        raise UsageError(f'context "{context}" does not exist')
    return "default"


def read_cluster(
    args: argparse.Namespace,
    *,
    kubeconfig: str | None,
    kinds: Collection[str] | None = None,
    nodes_if_needed: bool = False,
) -> ClusterObjects:
    """The cluster's objects of ``kinds`` (None: all of them)."""
    from dra_operator.kubectl_dra.cluster import KINDS, CannotRead, read

    try:
        return read(
            kubeconfig=kubeconfig,
            context=args.context,
            kinds=kinds or KINDS,
            nodes_if_needed=nodes_if_needed,
            timeout_s=args.request_timeout,
        )
    except CannotRead as exc:
        raise UsageError(str(exc)) from exc


# ---- subcommands ---------------------------------------------------------------------------------


def _devices(args: argparse.Namespace, *, kubeconfig: str | None, out: TextIO, err: TextIO) -> int:
    from dra_operator.kubectl_dra.devices import device_rows, render_devices

    kinds = [*DEVICES_LISTS, *(["nodes"] if args.node else [])]
    cluster = _read(args, kubeconfig=kubeconfig, err=err, kinds=kinds)
    rows = device_rows(cluster=cluster, node=args.node)
    output = args.output or "table"
    if not rows and output not in ("json", "yaml"):
        print("No resources found" + (f" on node {args.node}." if args.node else "."), file=err)
        return 0
    out.write(render_devices(rows, output=output))
    return 0


def _claims(args: argparse.Namespace, *, kubeconfig: str | None, out: TextIO, err: TextIO) -> int:
    from dra_operator.kubectl_dra.claims_command import claim_rows, render_claims

    cluster = _read(args, kubeconfig=kubeconfig, err=err, kinds=CLAIMS_LISTS, nodes_if_needed=True)
    namespace = None if args.all_namespaces else args.namespace
    rows = claim_rows(cluster=cluster, namespace=namespace, now=datetime.datetime.now(datetime.UTC))
    output = args.output or "table"
    if not rows and output not in ("json", "yaml"):
        print("No resources found" + (f" in {namespace} namespace." if namespace else "."), file=err)
        return 0
    out.write(render_claims(rows, output=output, all_namespaces=args.all_namespaces))
    return 0


def _explain(args: argparse.Namespace, *, kubeconfig: str | None, out: TextIO, err: TextIO) -> int:
    from dra_operator.kubectl_dra.explain import explain_claim
    from dra_operator.kubectl_dra.output import dump

    cluster = _read(args, kubeconfig=kubeconfig, err=err)
    obj = cluster.claim(args.namespace, args.claim)
    if obj is None:
        raise UsageError(
            f'resourceclaims.resource.k8s.io "{args.claim}" not found in namespace "{args.namespace}"'
        )
    explained = explain_claim(
        cluster=cluster, obj=obj, node=args.node, gates=args.gates, policy=args.policy, budget_s=args.budget_s
    )
    if args.output in ("json", "yaml"):
        out.write(dump(explained.data, args.output))
    else:
        out.write(explained.text)
    return explained.code


def _read(
    args: argparse.Namespace,
    *,
    kubeconfig: str | None,
    err: TextIO,
    kinds: Collection[str] | None = None,
    nodes_if_needed: bool = False,
) -> ClusterObjects:
    cluster = read_cluster(args, kubeconfig=kubeconfig, kinds=kinds, nodes_if_needed=nodes_if_needed)
    for warning in cluster.warnings:
        print(f"warning: {warning}", file=err)
    return cluster


_COMMANDS = {"devices": _devices, "claims": _claims, "explain": _explain}


def run(argv: Sequence[str], *, out: TextIO, err: TextIO) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(list(argv))
    if extra:
        where = f"kubectl dra {args.command}" if args.command else PROG
        raise UsageError(f"unrecognized arguments: {' '.join(extra)}; see '{where} --help'")
    if args.command is None:
        parser.print_help(out)
        return USAGE_ERROR
    if args.command == "explain":
        from dra_operator.allocator import FeatureGates

        try:
            args.gates = FeatureGates.from_flag(args.feature_gates)
        except ValueError as exc:
            raise UsageError(f"--feature-gates: {exc}") from exc
    kubeconfig = kubeconfig_path(args.kubeconfig)
    if hasattr(args, "namespace"):
        args.namespace = args.namespace or context_namespace(kubeconfig, args.context)
    elif args.context is not None:
        context_namespace(kubeconfig, args.context)  # an unknown context fails before any request
    # The lists become millions of small objects, none of them in a reference cycle; the cyclic
    # collector walked them all again and again while they were read (half the command's time at
    # 1,000 nodes). A short-lived command can leave it off; main() may run in-process, so it is
    # turned back on.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _COMMANDS[args.command](args, kubeconfig=kubeconfig, out=out, err=err)
    finally:
        if enabled:
            gc.enable()


def main(
    argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        return run(sys.argv[1:] if argv is None else argv, out=out, err=err)
    except UsageError as exc:
        print(f"error: {exc}", file=err)
        return USAGE_ERROR
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug must still not print a traceback at the user
        print(f"error: internal error: {type(exc).__name__}: {' '.join(str(exc).split())}", file=err)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
