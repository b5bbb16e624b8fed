"""What the ComputeDomain controller knows, kept current by Kopf's watch events on both instances.

Domains by UID (and the error of each that cannot be read), the cliques and daemon pods of the
driver's namespace by domain, and which node carries which domain's label. Each event says which
domain it concerns, so that only that domain is reconciled again. The standby keeps the same state
as the active instance, so a takeover starts from it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_api import computedomains as cd
from dra_operator.computedomains.status import DaemonPod

logger = logging.getLogger(__name__)


@dataclass
class DomainState:
    domains: dict[str, cd.ComputeDomain] = field(default_factory=dict)
    # ComputeDomains that cannot be read (an older CRD without its validation): key -> why.
    invalid: dict[str, str] = field(default_factory=dict)
    cliques: dict[str, cd.Clique] = field(default_factory=dict)
    pods: dict[str, DaemonPod] = field(default_factory=dict)
    # Nodes labelled with a domain: node name -> the label's value.
    node_labels: dict[str, str] = field(default_factory=dict)

    def by_key(self, key: str) -> cd.ComputeDomain | None:
        return next((d for d in self.domains.values() if d.key == key), None)

    def cliques_of(self, uid: str) -> list[cd.Clique]:
        return [c for c in self.cliques.values() if c.domain_uid == uid]

    def pods_of(self, uid: str) -> list[DaemonPod]:
        return [p for p in self.pods.values() if p.domain_uid == uid]

    def nodes_of(self, uid: str) -> list[str]:
        return sorted(node for node, value in self.node_labels.items() if value == uid)

    def in_namespace(self, namespace: str) -> list[cd.ComputeDomain]:
        return [d for d in self.domains.values() if d.namespace == namespace]

    # -- events: each returns the UIDs of the domains to look at again ------------------------------

    def domain_event(self, kind: str | None, obj: Mapping[str, Any]) -> set[str]:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        uid = str(meta.get("uid") or "")
        if kind == "DELETED":
            self.invalid.pop(key, None)
            gone = self.domains.pop(uid, None)
            # The namespace's other domains may fit under its limit now.
            return {uid} | {d.uid for d in self.in_namespace(gone.namespace)} if gone else set()
        try:
            domain = cd.ComputeDomain.from_json(obj)
        except cd.DomainError as exc:
            self.invalid[key] = str(exc)
            self.domains.pop(uid, None)
            return set()
        self.invalid.pop(key, None)
        self.domains[domain.uid] = domain
        return {domain.uid}

    def clique_event(self, kind: str | None, obj: Mapping[str, Any]) -> set[str]:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if kind == "DELETED":
            gone = self.cliques.pop(name, None)
            return {gone.domain_uid} if gone else set()
        try:
            clique = cd.Clique.from_json(obj)
        except cd.DomainError as exc:
            logger.warning("ignoring a ComputeDomainClique: %s", exc)
            return set()
        self.cliques[name] = clique
        return {clique.domain_uid}

    def pod_event(self, kind: str | None, obj: Mapping[str, Any]) -> set[str]:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        before = self.pods.pop(key, None)
        touched = {before.domain_uid} if before else set()
        if kind != "DELETED":
            pod = DaemonPod.from_json(obj)
            if pod is not None:
                self.pods[key] = pod
                touched.add(pod.domain_uid)
        return touched

    def node_event(self, kind: str | None, obj: Mapping[str, Any]) -> set[str]:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        before = self.node_labels.pop(name, None)
        value = (meta.get("labels") or {}).get(cd.DOMAIN_LABEL)
        if kind != "DELETED" and isinstance(value, str):
            self.node_labels[name] = value
        touched = {v for v in (before, value) if isinstance(v, str) and v in self.domains}
        return touched if before != value or kind == "DELETED" else set()
