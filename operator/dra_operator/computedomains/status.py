"""A domain's status from its daemons (pure): what the controller writes to ``status``.

As NVIDIA's controller computes it: ``status.nodes`` is every daemon of the domain's cliques plus
every daemon pod on a node without NVLink fabric (its pod says so with an empty clique label, and
its readiness is the pod's); a clique's daemon whose node runs no daemon pod of the domain any more
is left out (and pruned from the clique once that has lasted a moment). ``status.status`` is Ready
once at least ``numNodes`` nodes joined and none of them is NotReady.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_api import computedomains as cd


@dataclass(frozen=True)
class DaemonPod:
    """A daemon pod of a domain, as the status needs it."""

    namespace: str
    name: str
    domain_uid: str
    node: str
    ip: str
    ready: bool
    # The clique the daemon labelled its pod with: "" without fabric, None before it labelled it.
    clique: str | None

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> DaemonPod | None:
        """None for a pod that is no domain's daemon."""
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        uid = labels.get(cd.DOMAIN_LABEL)
        if not cd.is_uid(uid):
            return None
        status = obj.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        clique = labels.get(cd.CLIQUE_LABEL)
        return DaemonPod(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            domain_uid=str(uid),
            node=str((obj.get("spec") or {}).get("nodeName") or ""),
            ip=str(status.get("podIP") or ""),
            ready=ready and not meta.get("deletionTimestamp"),
            clique=None if clique is None else str(clique),
        )


@dataclass(frozen=True)
class DomainStatus:
    nodes: tuple[cd.DomainNode, ...]
    status: str

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "nodes": [n.to_status_json() for n in self.nodes]}


def daemon_nodes(pods: Iterable[DaemonPod]) -> set[str]:
    """The nodes that run a daemon pod."""
    return {p.node for p in pods if p.node}


def compute(
    domain: cd.ComputeDomain, *, cliques: Sequence[cd.Clique], pods: Sequence[DaemonPod]
) -> DomainStatus:
    """The status of ``domain`` from its cliques and its daemon pods."""
    running = daemon_nodes(pods)
    nodes: dict[str, cd.DomainNode] = {}
    for clique in sorted(cliques, key=lambda c: c.name):
        for daemon in clique.daemons:
            if daemon.name in running:
                nodes.setdefault(daemon.name, daemon)
    for pod in sorted(pods, key=lambda p: p.node):
        if pod.clique != "" or not pod.node or not pod.ip:
            continue
        nodes.setdefault(
            pod.node,
            cd.DomainNode(
                name=pod.node,
                ip_address=pod.ip,
                clique_id="",
                index=-1,
                status=cd.READY if pod.ready else cd.NOT_READY,
            ),
        )
    ordered = tuple(nodes[name] for name in sorted(nodes))
    return DomainStatus(nodes=ordered, status=cd.global_status(num_nodes=domain.num_nodes, nodes=ordered))


def same_status(domain: cd.ComputeDomain, status: DomainStatus) -> bool:
    """Whether ``status`` is what the domain already says (nodes compared by name)."""
    if not domain.has_status or domain.status != status.status:
        return False
    return {n.name: n for n in domain.nodes} == {n.name: n for n in status.nodes}


def stale_daemons(clique: cd.Clique, *, pods: Sequence[DaemonPod]) -> list[str]:
    """The nodes of ``clique``'s daemons that run no daemon pod of its domain."""
    running = daemon_nodes(pods)
    return [d.name for d in clique.daemons if d.name not in running]
