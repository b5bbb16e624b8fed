"""``dra-operator release-claims``: what stands in the way of uninstalling the operator, and, when
asked, clearing it.

Claims the operator allocated carry its finalizer; once the operator is gone nobody removes it, so
such a claim could never be deleted. Run before an uninstall (the Helm chart's pre-delete hook runs
it), the command lists those claims and fails, saying what to do; with ``--release`` it
deallocates each one that no pod uses and removes the finalizer, and still fails (naming the pods)
for those in use, because taking a device from under a running pod would lie to its node.

A running operator would allocate a released claim again at once, so ``--release`` first stops it
(``--stop-operator <namespace>/<deployment>``: scaled to 0, its pods gone), and only when no claim
is in use: a refusal leaves the operator running, for the user to delete claims with.

Exit status: 0 nothing holds the finalizer (any more); 1 claims remain, listed; 2 bad arguments or
the API server could not be asked.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_api.names import OPERATOR_FINALIZER
from dra_operator.client.finalizers import CannotAsk, ClaimChanged, ClaimGone, Refused, finalizer_api


@dataclass(frozen=True)
class HeldClaim:
    """A claim carrying the operator's finalizer: allocated or not, used by which pods."""

    namespace: str
    name: str
    resource_version: str
    finalizers: tuple[str, ...]
    allocated: bool
    users: tuple[str, ...]  # "<resource>/<name>" of status.reservedFor

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def held_claims(items: Sequence[Mapping[str, Any]]) -> list[HeldClaim]:
    """The claims among ``items`` that carry the operator's finalizer, by namespace and name."""
    held = []
    for item in items:
        metadata = item.get("metadata") or {}
        finalizers = tuple(metadata.get("finalizers") or ())
        if OPERATOR_FINALIZER not in finalizers:
            continue
        status = item.get("status") or {}
        held.append(
            HeldClaim(
                namespace=str(metadata.get("namespace", "")),
                name=str(metadata.get("name", "")),
                resource_version=str(metadata.get("resourceVersion", "")),
                finalizers=finalizers,
                allocated=status.get("allocation") is not None,
                users=tuple(
                    f"{ref.get('resource', 'pods')}/{ref.get('name', '')}"
                    for ref in status.get("reservedFor") or ()
                ),
            )
        )
    return sorted(held, key=lambda c: (c.namespace, c.name))


def describe(claim: HeldClaim) -> str:
    state = "allocated" if claim.allocated else "not allocated"
    used = f", in use by {', '.join(claim.users)}" if claim.users else ""
    return f"  {claim.key} ({state}{used})"


def not_released(in_use: Sequence[HeldClaim]) -> int:
    """Say which claims stay held because pods use them; the exit status (1)."""
    print(
        "not released, because pods use them (delete the pods, then run this again):\n"
        + "\n".join(describe(c) for c in in_use),
        file=sys.stderr,
    )
    return 1


def refusal(held: Sequence[HeldClaim]) -> str:
    lines = [f"{len(held)} ResourceClaims carry the operator's finalizer {OPERATOR_FINALIZER}:"]
    lines += [describe(c) for c in held]
    lines.append(
        "Delete these claims (and the pods using them) while the operator still runs, or release them: "
        "`dra-operator release-claims --release --stop-operator <namespace>/<deployment>` deallocates "
        "each claim no pod uses and removes the finalizer (Helm: after this refused uninstall, "
        "`helm rollback <release>`, `helm upgrade <release> <chart> --reuse-values --set "
        "uninstall.releaseClaims=true`, then `helm uninstall` again). Uninstalling with them in place "
        "would leave claims that can never be deleted."
    )
    return "\n".join(lines)


async def run(*, release: bool, kubeconfig: str | None, stop_operator: str | None = None) -> int:
    async with finalizer_api(kubeconfig) as api:
        held = held_claims(await api.claims())
        if not held:
            print(f"no ResourceClaim carries the operator's finalizer {OPERATOR_FINALIZER}")
            return 0
        if not release:
            print(refusal(held), file=sys.stderr)
            return 1
        in_use = [c for c in held if c.users]
        if in_use:
            return not_released(in_use)
        if stop_operator:
            await api.stop_operator(stop_operator)
            print(f"stopped the operator ({stop_operator} scaled to 0, its pods gone)")
            held = held_claims(await api.claims())  # what the operator did until it stopped
            in_use = [c for c in held if c.users]
        for claim in held:
            if claim.users:
                continue
            try:
                await api.release(
                    namespace=claim.namespace,
                    name=claim.name,
                    resource_version=claim.resource_version,
                    finalizers=claim.finalizers,
                    allocated=claim.allocated,
                )
            except ClaimGone:
                continue  # deleted meanwhile
            except ClaimChanged:
                in_use.append(claim)  # changed meanwhile: say so rather than guess
                continue
            print(f"released {claim.key}: deallocated, finalizer {OPERATOR_FINALIZER} removed")
        return not_released(in_use) if in_use else 0


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="dra-operator release-claims",
        description="List the ResourceClaims that carry the operator's finalizer (exit 1 if any), or "
        "release them with --release: deallocate each claim no pod uses and remove the finalizer. "
        "Run before uninstalling the operator.",
    )
    parser.add_argument("--release", action="store_true", help="deallocate and remove the finalizer")
    parser.add_argument(
        "--stop-operator",
        metavar="NAMESPACE/DEPLOYMENT",
        help="with --release: scale the operator's Deployment to 0 first, so it does not allocate again",
    )
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: $KUBECONFIG, else the in-cluster ServiceAccount)",
    )
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        return asyncio.run(
            run(release=args.release, kubeconfig=args.kubeconfig, stop_operator=args.stop_operator)
        )
    except CannotAsk as exc:
        print(f"dra-operator release-claims: {exc}", file=sys.stderr)
        return 2
    except Refused as exc:
        print(f"dra-operator release-claims: the API server refused: {exc}", file=sys.stderr)
        return 2
