"""NVIDIA's ComputeDomains in the operator: the controller of ``compute-domain.nvidia.com``.

A ComputeDomain gets its workload's channel claim template, its IMEX daemons (one DaemonSet whose
pods run wherever a node agent prepared one of the domain's channels) and a status gathered from
the daemons; deleting it removes all of that once no node holds its channels. The node side (the
channel and daemon devices, the node labels) is the node agent's; the daemon is
``compute-domain-daemon`` in the product's image. See docs/compatibility.md, "ComputeDomains".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from dra_operator.base.settings import Settings
from dra_operator.client import computedomains as client
from dra_operator.computedomains import desired
from dra_operator.computedomains.controller import ComputeDomainController, DomainMetrics, EventPoster
from dra_operator.computedomains.reconcile import ApiPaths, Reconciler
from dra_operator.computedomains.state import DomainState

__all__ = ["ComputeDomainController", "build_controller"]


def build_controller(
    *,
    settings: Settings,
    api_client: Any,
    events: EventPoster,
    active: Callable[[], bool],
    registry: CollectorRegistry,
) -> ComputeDomainController:
    """The controller as the settings ask for it (blocking: reads the daemon overrides file)."""
    api = client.ComputeDomainApi(api_client, may_write=active, request_timeout_s=settings.request_timeout_s)
    state = DomainState()
    options = desired.DaemonOptions(
        namespace=settings.daemon_namespace(),
        image=settings.daemon_image(),
        image_pull_policy=settings.compute_domain_daemon_image_pull_policy,
        max_nodes_per_imex_domain=settings.max_nodes_per_imex_domain,
        overrides=desired.load_overrides(settings.compute_domain_daemon_overrides),
    )
    controller: ComputeDomainController

    def tell(domain: Any, type_: str, reason: str, message: str) -> None:
        controller.tell(domain, type_, reason, message)

    reconciler = Reconciler(
        api=api,
        paths=ApiPaths(
            template=client.template_path, daemonset=client.daemonset_path, clique=client.clique_path
        ),
        state=state,
        options=options,
        tell=tell,
        host_managed=settings.compute_domain_imex_mode == "hostManaged",
        max_per_namespace=settings.max_compute_domains_per_namespace,
    )
    controller = ComputeDomainController(
        state=state,
        reconciler=reconciler,
        api=api,
        events=events,
        active=active,
        metrics=DomainMetrics(registry, state),
        resync_s=settings.compute_domain_resync_s,
        label_sweep_s=settings.compute_domain_resync_s,
    )
    return controller
