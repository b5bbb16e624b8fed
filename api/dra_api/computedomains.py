"""NVIDIA's ComputeDomain API (``resource.nvidia.com/v1beta1``), as the operator, the node agent and
the IMEX daemon wrapper read it.

The names are NVIDIA's (``compute-domain.nvidia.com``, ``api/nvidia.com/resource/v1beta1``), so the
objects, labels and opaque configs written for NVIDIA's driver mean the same here:

- ``ComputeDomain`` (namespaced): ``spec.numNodes``, ``spec.channel.resourceClaimTemplate.name``,
  ``spec.channel.allocationMode`` (Single or All); ``status.status`` (Ready or NotReady) and
  ``status.nodes[]`` (name, ipAddress, cliqueID, index, status);
- ``ComputeDomainClique`` (in the driver's namespace, named ``<domain UID>.<clique ID>``):
  ``daemons[]`` (nodeName, ipAddress, cliqueID, index, status), one entry per IMEX daemon;
- the node label ``resource.nvidia.com/computeDomain=<domain UID>`` that pulls a domain's daemon
  onto a node, the same key as the domain's finalizer, and ``nvidia.com/gpu.clique``.

Parsing is strict and bounded: a value a tenant wrote is checked before anything acts on it, and a
bad one raises ``DomainError`` naming the object and the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

DRIVER: Final = "compute-domain.nvidia.com"
GROUP: Final = "resource.nvidia.com"
VERSION: Final = "v1beta1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
DOMAIN_KIND: Final = "ComputeDomain"
DOMAIN_PLURAL: Final = "computedomains"
CLIQUE_KIND: Final = "ComputeDomainClique"
CLIQUE_PLURAL: Final = "computedomaincliques"
CHANNEL_CONFIG_KIND: Final = "ComputeDomainChannelConfig"
DAEMON_CONFIG_KIND: Final = "ComputeDomainDaemonConfig"

# The node label that pulls a domain's daemon onto a node; also the domain's finalizer, and the
# label of everything made for a domain (its templates, DaemonSet, daemon pods and cliques).
DOMAIN_LABEL: Final = "resource.nvidia.com/computeDomain"
FINALIZER: Final = DOMAIN_LABEL
# A daemon pod's clique ("" without NVLink fabric), and a clique object's.
CLIQUE_LABEL: Final = "resource.nvidia.com/computeDomain.cliqueID"
# Which of a domain's two templates a ResourceClaimTemplate is.
TARGET_LABEL: Final = "resource.nvidia.com/computeDomainTarget"
TARGET_DAEMON: Final = "Daemon"
TARGET_WORKLOAD: Final = "Workload"
# The node's NVLink clique, kept by the node agent (pod affinity keeps a job inside one domain).
GPU_CLIQUE_LABEL: Final = "nvidia.com/gpu.clique"

CHANNEL_CLASS: Final = "compute-domain-default-channel.nvidia.com"
DAEMON_CLASS: Final = "compute-domain-daemon.nvidia.com"
CHANNEL_REQUEST: Final = "channel"
DAEMON_REQUEST: Final = "daemon"
# The one channel and the one daemon device each node publishes; the other channels are never
# published (a channel claim in allocationMode All gets all of them injected).
CHANNEL_DEVICE: Final = "channel-0"
DAEMON_DEVICE: Final = "daemon-0"
MAX_IMEX_CHANNELS: Final = 2048

READY: Final = "Ready"
NOT_READY: Final = "NotReady"
SINGLE: Final = "Single"
ALL: Final = "All"
ALLOCATION_MODES: Final = (SINGLE, ALL)

# A daemon's DaemonSet and ResourceClaimTemplate in the driver's namespace: <prefix><domain UID>.
DAEMON_NAME_PREFIX: Final = "computedomain-daemon-"
# Daemons per IMEX domain (NVIDIA's default): one NVL72 rack has 18 compute trays.
DEFAULT_MAX_NODES_PER_IMEX_DOMAIN: Final = 18
# A domain may name more nodes than this only by mistake; the bound keeps status work small.
MAX_NUM_NODES: Final = 100_000
# At most this many nodes in a domain's status (and daemons in a clique) are read.
MAX_STATUS_NODES: Final = 4096

_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A clique ID as NVML gives it: "<cluster UUID>.<clique number>".
_CLIQUE_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.[0-9]{1,10}$")


class DomainError(ValueError):
    """A ComputeDomain, clique or config that does not follow the API; the message names it."""


def is_uid(text: object) -> bool:
    """Whether ``text`` is a Kubernetes object UID (lower-case RFC 4122)."""
    return isinstance(text, str) and _UID.fullmatch(text) is not None


def is_clique_id(text: object) -> bool:
    """Whether ``text`` is a clique ID as the node agent writes it ("" is no clique, not one)."""
    return isinstance(text, str) and _CLIQUE_ID.fullmatch(text) is not None


def is_dns_subdomain(text: object) -> bool:
    return isinstance(text, str) and len(text) <= 253 and _DNS_SUBDOMAIN.fullmatch(text) is not None


def is_dns_label(text: object) -> bool:
    return isinstance(text, str) and len(text) <= 63 and _DNS_LABEL.fullmatch(text) is not None


def daemon_name(domain_uid: str) -> str:
    """The name of a domain's DaemonSet and of its daemons' claim template (NVIDIA's)."""
    return f"{DAEMON_NAME_PREFIX}{domain_uid}"


def clique_name(domain_uid: str, clique_id: str) -> str:
    """The name of a domain's ComputeDomainClique object for one NVLink clique."""
    return f"{domain_uid}.{clique_id}"


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DomainError(f"{where}: must be an object")
    return value


def _string(value: Any, where: str, *, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise DomainError(f"{where}: must be a string")
    return value


def _integer(value: Any, where: str, *, default: int) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise DomainError(f"{where}: must be an integer")
    return value


def _status(value: Any, where: str) -> str:
    text = _string(value, where) or NOT_READY
    if text not in (READY, NOT_READY):
        raise DomainError(f"{where}: {text!r} is not {READY} or {NOT_READY}")
    return text


@dataclass(frozen=True)
class DomainNode:
    """One node of a domain's status, or one daemon of a clique (the same five facts)."""

    name: str
    ip_address: str
    clique_id: str
    index: int
    status: str

    @property
    def ready(self) -> bool:
        return self.status == READY

    def to_status_json(self) -> dict[str, Any]:
        """As ``status.nodes[]`` writes it."""
        return {
            "name": self.name,
            "ipAddress": self.ip_address,
            "cliqueID": self.clique_id,
            "index": self.index,
            "status": self.status,
        }

    def to_clique_json(self) -> dict[str, Any]:
        """As a clique's ``daemons[]`` writes it."""
        return {
            "nodeName": self.name,
            "ipAddress": self.ip_address,
            "cliqueID": self.clique_id,
            "index": self.index,
            "status": self.status,
        }


def _nodes(raw: Any, where: str, *, name_key: str) -> tuple[DomainNode, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise DomainError(f"{where}: must be a list")
    if len(raw) > MAX_STATUS_NODES:
        raise DomainError(f"{where}: {len(raw)} entries, more than the {MAX_STATUS_NODES} read")
    nodes = []
    for i, item in enumerate(raw):
        entry = _mapping(item, f"{where}[{i}]")
        nodes.append(
            DomainNode(
                name=_string(entry.get(name_key), f"{where}[{i}].{name_key}", required=True),
                ip_address=_string(entry.get("ipAddress"), f"{where}[{i}].ipAddress"),
                clique_id=_string(entry.get("cliqueID"), f"{where}[{i}].cliqueID"),
                index=_integer(entry.get("index"), f"{where}[{i}].index", default=-1),
                status=_status(entry.get("status"), f"{where}[{i}].status"),
            )
        )
    return tuple(nodes)


@dataclass(frozen=True)
class ComputeDomain:
    """A ComputeDomain as the controller and the node agent use it."""

    namespace: str
    name: str
    uid: str
    num_nodes: int
    template_name: str
    allocation_mode: str
    status: str
    nodes: tuple[DomainNode, ...]
    deleting: bool
    finalizers: tuple[str, ...]
    resource_version: str = ""
    creation: str = ""
    # Whether the object has a status yet (the controller writes one on its first pass).
    has_status: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def involved(self) -> dict[str, str]:
        """The domain as an Event's involvedObject."""
        return {
            "apiVersion": API_VERSION,
            "kind": DOMAIN_KIND,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
        }

    def node(self, name: str) -> DomainNode | None:
        return next((n for n in self.nodes if n.name == name), None)

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> ComputeDomain:
        """Parse a ComputeDomain; ``DomainError`` names the field a tenant got wrong."""
        meta = _mapping(obj.get("metadata"), "metadata")
        namespace = _string(meta.get("namespace"), "metadata.namespace")
        name = _string(meta.get("name"), "metadata.name")
        where = f"ComputeDomain {namespace}/{name}"
        uid = _string(meta.get("uid"), f"{where}: metadata.uid")
        if not is_uid(uid):
            raise DomainError(f"{where}: metadata.uid {uid!r} is not a UID")
        spec = _mapping(obj.get("spec"), f"{where}: spec")
        channel = _mapping(spec.get("channel"), f"{where}: spec.channel")
        template = _mapping(
            channel.get("resourceClaimTemplate"), f"{where}: spec.channel.resourceClaimTemplate"
        )
        template_name = _string(
            template.get("name"), f"{where}: spec.channel.resourceClaimTemplate.name", required=True
        )
        if not is_dns_subdomain(template_name):
            raise DomainError(
                f"{where}: spec.channel.resourceClaimTemplate.name {template_name[:64]!r} is not a "
                "DNS subdomain (lower-case letters, digits, '-' and '.', at most 253 characters)"
            )
        mode = _string(channel.get("allocationMode"), f"{where}: spec.channel.allocationMode") or SINGLE
        if mode not in ALLOCATION_MODES:
            raise DomainError(f"{where}: spec.channel.allocationMode {mode[:32]!r} is not Single or All")
        num_nodes = _integer(spec.get("numNodes"), f"{where}: spec.numNodes", default=0)
        if not 0 <= num_nodes <= MAX_NUM_NODES:
            raise DomainError(f"{where}: spec.numNodes {num_nodes} is out of range (0 to {MAX_NUM_NODES})")
        status = _mapping(obj.get("status"), f"{where}: status")
        finalizers = meta.get("finalizers") or []
        return ComputeDomain(
            namespace=namespace,
            name=name,
            uid=uid,
            num_nodes=num_nodes,
            template_name=template_name,
            allocation_mode=mode,
            status=_status(status.get("status"), f"{where}: status.status"),
            nodes=_nodes(status.get("nodes"), f"{where}: status.nodes", name_key="name"),
            deleting=bool(meta.get("deletionTimestamp")),
            finalizers=tuple(str(f) for f in finalizers if isinstance(f, str)),
            resource_version=_string(meta.get("resourceVersion"), "metadata.resourceVersion"),
            creation=_string(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
            has_status=bool(obj.get("status")),
        )


@dataclass(frozen=True)
class Clique:
    """A ComputeDomainClique: the daemons of one domain in one NVLink clique."""

    namespace: str
    name: str
    domain_uid: str
    clique_id: str
    daemons: tuple[DomainNode, ...]
    resource_version: str = ""

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> Clique:
        meta = _mapping(obj.get("metadata"), "metadata")
        namespace = _string(meta.get("namespace"), "metadata.namespace")
        name = _string(meta.get("name"), "metadata.name")
        labels = _mapping(meta.get("labels"), "metadata.labels")
        where = f"ComputeDomainClique {namespace}/{name}"
        return Clique(
            namespace=namespace,
            name=name,
            domain_uid=_string(labels.get(DOMAIN_LABEL), f"{where}: label {DOMAIN_LABEL}"),
            clique_id=_string(labels.get(CLIQUE_LABEL), f"{where}: label {CLIQUE_LABEL}"),
            daemons=_nodes(obj.get("daemons"), f"{where}: daemons", name_key="nodeName"),
            resource_version=_string(meta.get("resourceVersion"), "metadata.resourceVersion"),
        )


def global_status(*, num_nodes: int, nodes: Sequence[DomainNode]) -> str:
    """A domain's ``status.status``: Ready once at least ``numNodes`` nodes joined and none of
    them is NotReady (NVIDIA's rule)."""
    if len(nodes) < num_nodes or any(not n.ready for n in nodes):
        return NOT_READY
    return READY
