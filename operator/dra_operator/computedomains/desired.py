"""What the controller makes for a ComputeDomain, as NVIDIA's controller makes it (pure; no I/O).

- the workload's ResourceClaimTemplate, in the domain's namespace, named as the spec says: one
  request ``channel`` of class ``compute-domain-default-channel.nvidia.com`` with a
  ``ComputeDomainChannelConfig`` naming the domain (and its allocation mode);
- the daemons' ResourceClaimTemplate and DaemonSet, in the driver's namespace, both named
  ``computedomain-daemon-<domain UID>``: a request ``daemon`` of class
  ``compute-domain-daemon.nvidia.com`` with a ``ComputeDomainDaemonConfig``, and pods that run
  ``compute-domain-daemon`` only on nodes labelled with the domain (the node agent labels a node when
  it prepares a channel claim there), tolerating every taint.

Each carries the domain's label; the DaemonSet also the controller's finalizer, so that it is not
deleted before the controller has cleaned up after the domain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from dra_api import computedomains as cd

DAEMON_CONTAINER: Final = "compute-domain-daemon"
DAEMON_SERVICE_ACCOUNT: Final = "compute-domain-daemon"
DAEMON_CLAIM: Final = "compute-domain-daemon"
# What a cluster may add to the daemon pods (--compute-domain-daemon-overrides), nothing else.
OVERRIDE_KEYS: Final = ("hostAliases", "env", "imagePullSecrets", "priorityClassName", "resources")
MAX_OVERRIDES_BYTES: Final = 64 * 1024


class OverridesError(ValueError):
    """The daemon overrides file cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class DaemonOptions:
    """How the daemons run: what the operator's settings say."""

    namespace: str
    image: str
    image_pull_policy: str = "IfNotPresent"
    max_nodes_per_imex_domain: int = cd.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN
    overrides: Mapping[str, Any] = field(default_factory=dict)


def load_overrides(path: str) -> dict[str, Any]:
    """The daemon pods' additions from a YAML file (blocking read); empty without a path."""
    if not path:
        return {}
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise OverridesError(f"compute_domain_daemon_overrides: {path}: {exc.strerror}") from None
    if len(text.encode()) > MAX_OVERRIDES_BYTES:
        raise OverridesError(
            f"compute_domain_daemon_overrides: {path}: larger than {MAX_OVERRIDES_BYTES} bytes"
        )
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise OverridesError(f"compute_domain_daemon_overrides: {path}: not YAML: {exc}") from None
    return check_overrides(data, where=f"compute_domain_daemon_overrides: {path}")


def check_overrides(data: Any, *, where: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise OverridesError(f"{where}: must be a mapping of {', '.join(OVERRIDE_KEYS)}")
    unknown = sorted(set(data) - set(OVERRIDE_KEYS))
    if unknown:
        raise OverridesError(f"{where}: {unknown[0]!r} is not one of {', '.join(OVERRIDE_KEYS)}")
    for key, kind in (("hostAliases", list), ("env", list), ("imagePullSecrets", list), ("resources", dict)):
        if key in data and not isinstance(data[key], kind):
            raise OverridesError(f"{where}: {key} must be a {kind.__name__}")
    if "priorityClassName" in data and not isinstance(data["priorityClassName"], str):
        raise OverridesError(f"{where}: priorityClassName must be a string")
    for i, entry in enumerate(data.get("env") or []):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise OverridesError(f"{where}: env[{i}] must have a name")
    return dict(data)


def _labels(domain: cd.ComputeDomain, target: str | None = None) -> dict[str, str]:
    labels = {cd.DOMAIN_LABEL: domain.uid}
    if target:
        labels[cd.TARGET_LABEL] = target
    return labels


def _template(
    *,
    namespace: str,
    name: str,
    labels: dict[str, str],
    request: str,
    device_class: str,
    parameters: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        # No finalizer: a template is immutable, and the server compares its opaque parameters as
        # the bytes it was sent, so the merge patch that would remove one (re-encoded by the server)
        # is refused as a change of spec. The controller deletes the templates itself.
        "metadata": {"namespace": namespace, "name": name, "labels": labels},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": request, "exactly": {"deviceClassName": device_class}}],
                    "config": [
                        {"requests": [request], "opaque": {"driver": cd.DRIVER, "parameters": parameters}}
                    ],
                }
            }
        },
    }


def workload_template(domain: cd.ComputeDomain, *, host_managed: bool = False) -> dict[str, Any]:
    """The channel claim template the workload's pods name (host-managed IMEX: Single only)."""
    return _template(
        namespace=domain.namespace,
        name=domain.template_name,
        labels=_labels(domain, cd.TARGET_WORKLOAD),
        request=cd.CHANNEL_REQUEST,
        device_class=cd.CHANNEL_CLASS,
        parameters={
            "apiVersion": cd.API_VERSION,
            "kind": cd.CHANNEL_CONFIG_KIND,
            "domainID": domain.uid,
            "allocationMode": cd.SINGLE if host_managed else domain.allocation_mode,
        },
    )


def daemon_template(domain: cd.ComputeDomain, *, options: DaemonOptions) -> dict[str, Any]:
    """The claim template of the domain's daemon pods."""
    return _template(
        namespace=options.namespace,
        name=cd.daemon_name(domain.uid),
        labels=_labels(domain, cd.TARGET_DAEMON),
        request=cd.DAEMON_REQUEST,
        device_class=cd.DAEMON_CLASS,
        parameters={"apiVersion": cd.API_VERSION, "kind": cd.DAEMON_CONFIG_KIND, "domainID": domain.uid},
    )


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _probe(*, period: int, failures: int) -> dict[str, Any]:
    return {
        "exec": {"command": ["compute-domain-daemon", "check"]},
        "periodSeconds": period,
        "timeoutSeconds": 10,
        "failureThreshold": failures,
    }


def _container(options: DaemonOptions) -> dict[str, Any]:
    env: list[dict[str, Any]] = [
        {"name": "MAX_NODES_PER_IMEX_DOMAIN", "value": str(options.max_nodes_per_imex_domain)},
        _field_env("NODE_NAME", "spec.nodeName"),
        _field_env("POD_IP", "status.podIP"),
        _field_env("POD_UID", "metadata.uid"),
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        # The runtime's own NVIDIA hook must add nothing: the claim's CDI spec says what it gets.
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
    ]
    extra = [dict(e) for e in options.overrides.get("env") or []]
    names = {e["name"] for e in extra}
    container: dict[str, Any] = {
        "name": DAEMON_CONTAINER,
        "image": options.image,
        "imagePullPolicy": options.image_pull_policy,
        "command": ["compute-domain-daemon", "run"],
        "env": [e for e in env if e["name"] not in names] + extra,
        "resources": {"claims": [{"name": DAEMON_CLAIM}]},
        # Checked every second while starting (for up to 20 min), so the pod turns Ready as soon
        # as IMEX is; then every 10 s for readiness and every minute for liveness.
        "startupProbe": _probe(period=1, failures=1200),
        "readinessProbe": _probe(period=10, failures=1),
        "livenessProbe": _probe(period=60, failures=20),
        # Root owns what IMEX writes (the domain's folder, the pod's /etc/hosts); no capability is
        # needed beyond a root user's file access.
        "securityContext": {
            "runAsUser": 0,
            "runAsGroup": 0,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if "resources" in options.overrides:
        container["resources"] = {**options.overrides["resources"], "claims": [{"name": DAEMON_CLAIM}]}
    return container


def daemonset(domain: cd.ComputeDomain, *, options: DaemonOptions) -> dict[str, Any]:
    """The DaemonSet of the domain's IMEX daemons."""
    name = cd.daemon_name(domain.uid)
    labels = _labels(domain)
    pod_spec: dict[str, Any] = {
        "serviceAccountName": DAEMON_SERVICE_ACCOUNT,
        "nodeSelector": {cd.DOMAIN_LABEL: domain.uid},
        "terminationGracePeriodSeconds": 30,
        "containers": [_container(options)],
        # A domain's daemon must run wherever its workload landed, whatever the taints.
        "tolerations": [
            {"operator": "Exists", "effect": effect}
            for effect in ("NoSchedule", "NoExecute", "PreferNoSchedule")
        ],
        "resourceClaims": [{"name": DAEMON_CLAIM, "resourceClaimTemplateName": name}],
    }
    for key in ("hostAliases", "imagePullSecrets", "priorityClassName"):
        if key in options.overrides:
            pod_spec[key] = options.overrides[key]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "namespace": options.namespace,
            "name": name,
            "labels": labels,
            "finalizers": [cd.FINALIZER],
        },
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def drifted_daemonset(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the DaemonSet's pod template differs from the desired one in what the controller
    decides (image, command, selector, claims): then it is updated (a new image after an upgrade)."""

    def keep(ds: Mapping[str, Any]) -> tuple[Any, ...]:
        spec = (ds.get("spec") or {}).get("template", {}).get("spec", {})
        containers: Sequence[Mapping[str, Any]] = spec.get("containers") or [{}]
        first = containers[0]
        return (
            first.get("image"),
            first.get("command"),
            spec.get("nodeSelector"),
            spec.get("resourceClaims"),
            spec.get("hostAliases"),
        )

    return keep(actual) != keep(desired)
