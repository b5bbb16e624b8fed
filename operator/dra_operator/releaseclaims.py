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
from typing import Any, Final

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException

from dra_api.kube import (
    ClusterConfigError,
    ClusterUnreachable,
    UnsupportedServer,
    first_resource_version,
    make_api_client,
)
from dra_api.names import OPERATOR_FINALIZER, RESOURCE_GROUP

PLURAL: Final = "resourceclaims"
MERGE_PATCH: Final = "application/merge-patch+json"


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


async def _release(custom: Any, version: str, claim: HeldClaim) -> None:
    # ``custom`` is a CustomObjectsApi, typed as Any: its stubs do not know ``_content_type``.
    """Deallocate (status first, preconditioned on the version read), then drop the finalizer."""
    resource_version = claim.resource_version
    if claim.allocated:
        written: Any = await custom.patch_namespaced_custom_object_status(
            RESOURCE_GROUP,
            version,
            claim.namespace,
            PLURAL,
            claim.name,
            {
                "metadata": {"resourceVersion": resource_version},
                "status": {"allocation": None, "devices": None, "reservedFor": None},
            },
            _content_type=MERGE_PATCH,
        )
        resource_version = str(written["metadata"]["resourceVersion"])
    finalizers = [f for f in claim.finalizers if f != OPERATOR_FINALIZER]
    await custom.patch_namespaced_custom_object(
        RESOURCE_GROUP,
        version,
        claim.namespace,
        PLURAL,
        claim.name,
        {"metadata": {"resourceVersion": resource_version, "finalizers": finalizers}},
        _content_type=MERGE_PATCH,
    )


STOP_TIMEOUT_S: Final = 120.0
FIRST_REQUEST_TIMEOUT_S: Final = 60.0
"""An API server that does not answer the first request in this long is reported as unreachable."""


async def _stop_operator(api: client.ApiClient, target: str) -> None:
    """Scale the operator's Deployment to 0 and wait until none of its pods is left, terminating
    ones included: the Deployment stops counting a pod once it is terminating, but until it is
    gone its operator may still take over from the other and allocate a claim released meanwhile."""
    namespace, _, name = target.partition("/")
    apps: Any = client.AppsV1Api(api)
    core: Any = client.CoreV1Api(api)
    await apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": 0}})
    deadline = asyncio.get_running_loop().time() + STOP_TIMEOUT_S
    while True:
        deployment: Any = await apps.read_namespaced_deployment(name, namespace)
        selector = ",".join(f"{k}={v}" for k, v in (deployment.spec.selector.match_labels or {}).items())
        pods: Any = await core.list_namespaced_pod(namespace, label_selector=selector)
        if not deployment.status.replicas and not pods.items:
            print(f"stopped the operator ({target} scaled to 0, its pods gone)")
            return
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(
                f"the operator {target} still runs {STOP_TIMEOUT_S:.0f} s after scaling it to 0"
            )
        await asyncio.sleep(1)


async def _held(custom: Any, version: str) -> list[HeldClaim]:
    listed: Any = await custom.list_cluster_custom_object(RESOURCE_GROUP, version, PLURAL)
    return held_claims(listed.get("items") or [])


async def run(*, release: bool, kubeconfig: str | None, stop_operator: str | None = None) -> int:
    api = await make_api_client(kubeconfig=kubeconfig)
    try:
        version = await first_resource_version(api, request_timeout_s=FIRST_REQUEST_TIMEOUT_S)
        custom: Any = client.CustomObjectsApi(api)
        held = await _held(custom, version)
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
            await _stop_operator(api, stop_operator)
            held = await _held(custom, version)  # what the operator did until it stopped
            in_use = [c for c in held if c.users]
        for claim in held:
            if claim.users:
                continue
            try:
                await _release(custom, version, claim)
            except ApiException as exc:
                if exc.status == 404:
                    continue  # deleted meanwhile
                if exc.status == 409:
                    in_use.append(claim)  # changed meanwhile: say so rather than guess
                    continue
                raise
            print(f"released {claim.key}: deallocated, finalizer {OPERATOR_FINALIZER} removed")
        return not_released(in_use) if in_use else 0
    finally:
        await api.close()


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
    except (ClusterConfigError, ClusterUnreachable, UnsupportedServer) as exc:
        print(f"dra-operator release-claims: {exc}", file=sys.stderr)
        return 2
    except ApiException as exc:
        body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body)
        print(
            f"dra-operator release-claims: the API server refused: {exc.status} {exc.reason}: {body}",
            file=sys.stderr,
        )
        return 2
    except (ConfigException, OSError, RuntimeError) as exc:
        reason = getattr(exc, "reason", None) or exc
        print(f"dra-operator release-claims: cannot ask the API server: {reason}", file=sys.stderr)
        return 2
