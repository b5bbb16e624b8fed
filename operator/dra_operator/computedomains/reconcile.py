"""One ComputeDomain's reconcile: make what it needs, keep its status, clean up after it.

A domain that is not being deleted gets, in order: the controller's finalizer; (driver-managed
IMEX) its daemons' claim template and DaemonSet in the driver's namespace; its workload's claim
template in its own namespace; its status from its cliques and daemon pods, with daemons whose pod
is gone pruned from the cliques after a short grace. A domain being deleted loses its workload's
template at once; its DaemonSet, its daemons' template and its cliques once no node holds one of
its channels any more (unlike NVIDIA's controller, which removes the daemons under a running
workload), and only once they are gone its finalizer. Each step is one idempotent call, so a
reconcile interrupted anywhere (the operator killed, a failover) is finished by the next one.

Every domain is a tenant's: a namespace holds at most ``max_per_namespace`` of them (the oldest
first), a template name another object holds is refused with an Event, not adopted, and what the
controller writes never depends on more than the domain's own spec.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from dra_api import computedomains as cd
from dra_operator.computedomains import desired
from dra_operator.computedomains import status as domain_status
from dra_operator.computedomains.state import DomainState

logger = logging.getLogger(__name__)

# A clique's daemon whose pod is gone is pruned once it has been gone this long (the pod watch may
# lag the daemon's own write by a moment).
STALE_DAEMON_GRACE_S = 10.0
# How soon a domain is looked at again while something it waits for is not there yet.
SOON_S = 1.0
# How soon after a refusal (a template name taken) it is tried again.
LATER_S = 30.0


class DomainApi(Protocol):
    """The calls a reconcile makes (``client.computedomains.ComputeDomainApi``)."""

    async def patch_domain(self, *, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def patch_domain_status(
        self, *, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]: ...

    async def get(self, path: str) -> dict[str, Any] | None: ...

    async def create(self, collection: str, body: Mapping[str, Any]) -> dict[str, Any] | None: ...

    async def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def put(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def delete(self, path: str, *, uid: str = "") -> bool: ...

    async def list_labelled(self, collection: str, *, label: str, value: str) -> list[dict[str, Any]]: ...

    async def remove_node_label(self, *, node: str, value: str) -> bool: ...


Paths = Callable[..., str]


@dataclass(frozen=True)
class ApiPaths:
    """Where each kind of object lives (``client.computedomains``'s path functions)."""

    template: Paths
    daemonset: Paths
    clique: Paths


Tell = Callable[[cd.ComputeDomain, str, str, str], None]
"""Posts an Event about a domain: (domain, type, reason, message)."""


@dataclass
class Reconciler:
    api: DomainApi
    paths: ApiPaths
    state: DomainState
    options: desired.DaemonOptions
    tell: Tell
    host_managed: bool = False
    max_per_namespace: int = 32
    clock: Callable[[], float] = time.monotonic
    # (clique name, node) -> when its daemon was first seen without a pod.
    _stale_since: dict[tuple[str, str], float] = field(default_factory=dict)

    async def reconcile(self, uid: str) -> float | None:
        """Reconcile one domain; seconds until it should be looked at again, or None."""
        domain = self.state.domains.get(uid)
        if domain is None:
            return None
        if domain.deleting:
            return await self._clean_up(domain)
        refusal = self._over_limit(domain)
        if refusal:
            self.tell(domain, "Warning", "TooManyComputeDomains", refusal)
            return None
        domain = await self._ensure_finalizer(domain)
        if not self.host_managed:
            await self._ensure_daemons(domain)
        waiting = await self._ensure_workload_template(domain)
        pruning = await self._write_status(domain)
        return min((d for d in (waiting, pruning) if d is not None), default=None)

    # -- limits -------------------------------------------------------------------------------------

    def _over_limit(self, domain: cd.ComputeDomain) -> str:
        """Why ``domain`` is beyond its namespace's limit ("" when it is within it). The oldest
        domains of a namespace are served first; the others wait for one to go."""
        ranked = sorted(self.state.in_namespace(domain.namespace), key=lambda d: (d.creation, d.name))
        position = next(i for i, d in enumerate(ranked) if d.uid == domain.uid)
        if position < self.max_per_namespace:
            return ""
        return (
            f"ComputeDomain {domain.key}: namespace {domain.namespace} has {len(ranked)} ComputeDomains, "
            f"more than the {self.max_per_namespace} the operator serves per namespace "
            "(--max-compute-domains-per-namespace); this one waits until an older one is deleted"
        )

    # -- making -------------------------------------------------------------------------------------

    async def _ensure_finalizer(self, domain: cd.ComputeDomain) -> cd.ComputeDomain:
        if cd.FINALIZER in domain.finalizers:
            return domain
        body = {
            "metadata": {
                "finalizers": [*domain.finalizers, cd.FINALIZER],
                "resourceVersion": domain.resource_version,
            }
        }
        updated = await self.api.patch_domain(namespace=domain.namespace, name=domain.name, body=body)
        self.state.domain_event("MODIFIED", updated)
        logger.info("ComputeDomain %s (%s): finalizer added", domain.key, domain.uid)
        return self.state.domains.get(domain.uid, domain)

    async def _ensure_daemons(self, domain: cd.ComputeDomain) -> None:
        options = self.options
        name = cd.daemon_name(domain.uid)
        template = desired.daemon_template(domain, options=options)
        if await self.api.get(self.paths.template(options.namespace, name)) is None:
            await self.api.create(self.paths.template(options.namespace), template)
        wanted = desired.daemonset(domain, options=options)
        current = await self.api.get(self.paths.daemonset(options.namespace, name))
        if current is None:
            if await self.api.create(self.paths.daemonset(options.namespace), wanted) is not None:
                logger.info("ComputeDomain %s: created DaemonSet %s/%s", domain.key, options.namespace, name)
        elif desired.drifted_daemonset(current, wanted):
            await self.api.patch(
                self.paths.daemonset(options.namespace, name),
                {"spec": {"template": wanted["spec"]["template"]}},
            )
            logger.info("ComputeDomain %s: updated DaemonSet %s/%s", domain.key, options.namespace, name)

    async def _ensure_workload_template(self, domain: cd.ComputeDomain) -> float | None:
        path = self.paths.template(domain.namespace, domain.template_name)
        current = await self.api.get(path)
        if current is None:
            made = await self.api.create(
                self.paths.template(domain.namespace),
                desired.workload_template(domain, host_managed=self.host_managed),
            )
            if made is None:
                return SOON_S  # made by someone else meanwhile: judged on the next pass
            self.tell(
                domain,
                "Normal",
                "ResourceClaimTemplateCreated",
                f"ComputeDomain {domain.key}: created ResourceClaimTemplate {domain.template_name} for its "
                "workload's channel claims",
            )
            return None
        owner = ((current.get("metadata") or {}).get("labels") or {}).get(cd.DOMAIN_LABEL)
        if owner != domain.uid:
            self.tell(
                domain,
                "Warning",
                "ResourceClaimTemplateTaken",
                f"ComputeDomain {domain.key}: ResourceClaimTemplate "
                f"{domain.namespace}/{domain.template_name} exists and is not this domain's; the "
                "controller does not take it over. Delete it, or create the domain again with another "
                "spec.channel.resourceClaimTemplate.name",
            )
            return LATER_S
        return None

    async def _write_status(self, domain: cd.ComputeDomain) -> float | None:
        pods = self.state.pods_of(domain.uid)
        pruning = None if self.host_managed else await self._prune_cliques(domain, pods)
        if self.host_managed:
            # The host runs IMEX: the domain is Ready as soon as its template exists.
            computed = domain_status.DomainStatus(nodes=(), status=cd.READY)
        else:
            computed = domain_status.compute(domain, cliques=self.state.cliques_of(domain.uid), pods=pods)
        if domain_status.same_status(domain, computed):
            return pruning
        updated = await self.api.patch_domain_status(
            namespace=domain.namespace, name=domain.name, body={"status": computed.to_json()}
        )
        self.state.domain_event("MODIFIED", updated)
        if computed.status != domain.status:
            ready = sum(1 for n in computed.nodes if n.ready)
            self.tell(
                domain,
                "Normal",
                "ComputeDomainReady" if computed.status == cd.READY else "ComputeDomainNotReady",
                f"ComputeDomain {domain.key}: {computed.status} ({ready} of {len(computed.nodes)} nodes "
                f"ready, numNodes {domain.num_nodes})",
            )
        return pruning

    async def _prune_cliques(
        self, domain: cd.ComputeDomain, pods: list[domain_status.DaemonPod]
    ) -> float | None:
        """Drop daemons whose pod has been gone for the grace period from the domain's cliques."""
        now = self.clock()
        again: float | None = None
        for clique in self.state.cliques_of(domain.uid):
            stale = domain_status.stale_daemons(clique, pods=pods)
            for key in [k for k in self._stale_since if k[0] == clique.name and k[1] not in stale]:
                del self._stale_since[key]
            due = []
            for node in stale:
                since = self._stale_since.setdefault((clique.name, node), now)
                if now - since >= STALE_DAEMON_GRACE_S:
                    due.append(node)
                else:
                    wait = STALE_DAEMON_GRACE_S - (now - since)
                    again = wait if again is None else min(again, wait)
            if due:
                await self._drop_daemons(clique, due)
                again = SOON_S if again is None else min(again, SOON_S)
        return again

    async def _drop_daemons(self, clique: cd.Clique, nodes: list[str]) -> None:
        body = {
            "metadata": {"resourceVersion": clique.resource_version},
            "daemons": [d.to_clique_json() for d in clique.daemons if d.name not in nodes],
        }
        await self.api.patch(self.paths.clique(clique.namespace, clique.name), body)
        for node in nodes:
            self._stale_since.pop((clique.name, node), None)
        logger.info(
            "clique %s: removed the daemons of %s, whose pods are gone", clique.name, ", ".join(nodes)
        )

    # -- cleaning up --------------------------------------------------------------------------------

    async def _clean_up(self, domain: cd.ComputeDomain) -> float | None:
        """A domain being deleted: its workload template goes at once (no new pod joins); its
        daemons stay for as long as a node still holds one of its channels (the node agent removes
        the node's label when it releases the channel), then they, their template and cliques go,
        and only then the finalizer."""
        if cd.FINALIZER not in domain.finalizers:
            return None
        ns = self.options.namespace
        name = cd.daemon_name(domain.uid)
        left = await self._remove(self.paths.template(domain.namespace, domain.template_name), domain.uid)
        in_use = self.state.nodes_of(domain.uid)
        if in_use:
            self.tell(
                domain,
                "Normal",
                "WaitingForWorkload",
                f"ComputeDomain {domain.key}: being deleted; its IMEX daemons stay while its channels are "
                f"in use on {len(in_use)} node(s) ({', '.join(in_use[:5])}), until the workload's pods end",
            )
            return LATER_S
        left |= await self._remove(self.paths.template(ns, name), domain.uid)
        left |= await self._remove(self.paths.daemonset(ns, name), domain.uid)
        for clique in await self.api.list_labelled(
            self.paths.clique(ns), label=cd.DOMAIN_LABEL, value=domain.uid
        ):
            await self.api.delete(self.paths.clique(ns, str(clique["metadata"]["name"])))
        if left:
            return SOON_S  # until they are gone
        body = {
            "metadata": {
                "finalizers": [f for f in domain.finalizers if f != cd.FINALIZER],
                "resourceVersion": domain.resource_version,
            }
        }
        await self.api.patch_domain(namespace=domain.namespace, name=domain.name, body=body)
        logger.info("ComputeDomain %s (%s): cleaned up; finalizer removed", domain.key, domain.uid)
        return None

    async def _remove(self, path: str, uid: str) -> bool:
        """Delete the object at ``path`` if it is the domain's (its finalizer first); True while it
        is still there."""
        current = await self.api.get(path)
        if current is None:
            return False
        meta = current.get("metadata") or {}
        if (meta.get("labels") or {}).get(cd.DOMAIN_LABEL) != uid:
            return False  # not the domain's: never touched
        finalizers = meta.get("finalizers") or []
        if cd.FINALIZER in finalizers:
            await self.api.patch(
                path,
                {
                    "metadata": {
                        "finalizers": [f for f in finalizers if f != cd.FINALIZER],
                        "resourceVersion": meta.get("resourceVersion"),
                    }
                },
            )
        if not meta.get("deletionTimestamp"):
            await self.api.delete(path, uid=str(meta.get("uid") or ""))
        return await self.api.get(path) is not None
