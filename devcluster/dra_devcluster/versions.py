"""The Kubernetes versions the local cluster can run, and what the cluster does differently on each.

One entry per supported minor release, at one exact patch: the Go wrapper module under ``gomod/``
that pins it (and the etcd its ``go.mod`` requires), the feature gates the cluster names on every
component's ``--feature-gates``, and the kube-controller-manager controllers it switches off.

Which version a cluster runs: an explicit argument (``dra-local-cluster --kubernetes 1.34``,
``LocalCluster(kubernetes=...)``), else the environment variable ``DRA_KUBERNETES_VERSION``, else
:data:`DEFAULT`. ``1.34``, ``1.34.x``, ``v1.34`` and ``v1.34.12`` all name the 1.34 entry.

The gate facts below were read in each release's ``pkg/features/kube_features.go``
(``k8s.io/kubernetes@<version>`` in the Go module cache, map ``defaultVersionedKubernetesFeatureGates``);
``line`` is the line of the spec in effect for that release, so a reader can check it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

VERSION_ENV = "DRA_KUBERNETES_VERSION"

Stage = Literal["alpha", "beta", "ga"]


@dataclass(frozen=True)
class Gate:
    """A feature gate as one release defines it."""

    stage: Stage
    default: bool
    locked: bool = False
    """LockToDefault: naming the gate with any other value is an error, and naming it at all only
    warns; the cluster never names a locked gate."""
    line: int = 0
    """Line of the spec in effect in that release's ``pkg/features/kube_features.go``."""


def _alpha(line: int) -> Gate:
    return Gate("alpha", False, line=line)


def _beta(line: int, *, default: bool = True) -> Gate:
    return Gate("beta", default, line=line)


def _ga(line: int, *, locked: bool) -> Gate:
    return Gate("ga", True, locked=locked, line=line)


@dataclass(frozen=True)
class KubernetesVersion:
    """One supported Kubernetes release and how the local cluster runs it."""

    version: str
    """The exact release, ``v1.36.3``: stamped into the binaries (``--version``, the Node's
    ``kubeletVersion``) and part of the cache folders' names."""
    etcd: str
    """The etcd server built with it: the version this release's ``go.mod`` requires."""
    module: str
    """The Go wrapper module folder under ``dra_devcluster/gomod/`` that pins this release; the
    control plane, kubectl, the kubelet and etcd are all built from it."""
    upstream_gates: Mapping[str, Gate]
    """The DRA gates (and the device-health gates in pod status) this release defines, as read in
    its ``kube_features.go``."""
    feature_gates: Mapping[str, bool]
    """What the cluster names on every component's ``--feature-gates`` and in the kubelet's
    configuration: each beta gate of :attr:`upstream_gates` switched on, except those in
    :attr:`gates_left_at_default`. Alpha gates keep their default (off), GA gates are never named."""
    gates_left_at_default: Mapping[str, str]
    """Beta gates the cluster does not switch on, with the reason."""
    gate_dependencies: Mapping[str, tuple[str, ...]]
    """Gate -> the gates it needs on, from the release's ``defaultKubernetesFeatureGateDependencies``
    (1.35 on): a component refuses a gate that is on while one it needs is off. Only gates with a
    dependency other than DynamicResourceAllocation (GA and on in every supported release) are
    listed; 1.34 checks none."""
    disabled_controllers: tuple[str, ...]
    """kube-controller-manager controllers switched off (``--controllers=*,-name,...``): those that
    need kubelet heartbeats or a cloud. Only names the release registers: an unknown name stops
    kube-controller-manager at start-up."""

    @property
    def minor(self) -> str:
        """``1.36`` for ``v1.36.3``."""
        return ".".join(self.version.removeprefix("v").split(".")[:2])

    @property
    def git_major(self) -> str:
        return self.version.removeprefix("v").split(".")[0]

    @property
    def git_minor(self) -> str:
        return self.version.removeprefix("v").split(".")[1]

    def gate_enabled(self, name: str) -> bool:
        """Whether the gate ``name`` is on in a cluster of this version: as named, else upstream's
        default; False for a gate this release does not define."""
        if name in self.feature_gates:
            return self.feature_gates[name]
        gate = self.upstream_gates.get(name)
        return gate is not None and gate.default

    def __str__(self) -> str:
        return self.version


# kube-controller-manager controllers the cluster runs without. The node-lifecycle controller would
# taint and evict on Node objects that no kubelet heartbeats (the cluster's fake nodes); the cloud
# provider controllers need a cloud. 1.37 no longer registers the three cloud ones, and refuses
# --controllers naming a controller it does not know.
_NODE_CONTROLLERS = (
    "node-lifecycle-controller",
    "node-ipam-controller",
    "persistentvolume-attach-detach-controller",
)
_CLOUD_CONTROLLERS = ("cloud-node-lifecycle-controller", "service-lb-controller", "node-route-controller")

# Beta gates named on: the cluster turns on every beta DRA gate of its release (and the beta gates
# for device health in pod status), so the product is tested with what a cluster that enables beta
# features runs. Those on by default are named too, so that a binary built without version stamps
# (whose emulated version is not its release) still has them on. These are the exceptions.
_LEFT_AT_DEFAULT_1_37 = {
    "DRAWorkloadResourceClaims": (
        "it depends on GenericWorkload (beta and off, not a DRA gate, kube_features.go:1622-1625, "
        "2621), and a component refuses a gate whose dependency is off"
    ),
    "DRAFractionalCapacityRange": (
        "upstream turns it on only for clusters whose --min-compatibility-version is 1.37 "
        "(kube_features.go:1493-1496); the operator allocates with the release's defaults, so the "
        "cluster keeps it off for the scheduler beside it to allocate alike"
    ),
}
_LEFT_AT_DEFAULT_1_38 = {
    "DRAWorkloadResourceClaims": (
        "it depends on GenericWorkload (beta and off, not a DRA gate, kube_features.go:1499-1502, "
        "2417), and a component refuses a gate whose dependency is off"
    ),
}


def _named(upstream: Mapping[str, Gate], left_at_default: Mapping[str, str]) -> dict[str, bool]:
    return {
        name: True
        for name, gate in sorted(upstream.items())
        if gate.stage == "beta" and name not in left_at_default
    }


def _version(
    version: str,
    *,
    etcd: str,
    upstream_gates: Mapping[str, Gate],
    disabled_controllers: tuple[str, ...],
    gates_left_at_default: Mapping[str, str] | None = None,
    gate_dependencies: Mapping[str, tuple[str, ...]] | None = None,
) -> KubernetesVersion:
    left = dict(gates_left_at_default or {})
    return KubernetesVersion(
        version=version,
        etcd=etcd,
        module="k8s-" + ".".join(version.removeprefix("v").split(".")[:2]),
        upstream_gates=dict(upstream_gates),
        feature_gates=_named(upstream_gates, left),
        gates_left_at_default=left,
        gate_dependencies=dict(gate_dependencies or {}),
        disabled_controllers=disabled_controllers,
    )


# k8s.io/kubernetes@v1.34.12: go.mod:205 requires go.etcd.io/etcd/server/v3 v3.6.4; controllers
# registered in cmd/kube-controller-manager/app/controllermanager.go:572-580.
V1_34 = _version(
    "v1.34.12",
    etcd="v3.6.4",
    upstream_gates={
        "DRAAdminAccess": _beta(1204),
        "DRAConsumableCapacity": _alpha(1208),
        "DRADeviceBindingConditions": _alpha(1212),
        "DRADeviceTaints": _alpha(1216),
        "DRAExtendedResource": _alpha(1220),
        "DRAPartitionableDevices": _alpha(1224),
        "DRAPrioritizedList": _beta(1229),
        "DRAResourceClaimDeviceStatus": _beta(1234),
        "DRASchedulerFilterTimeout": _beta(1238),
        "DynamicResourceAllocation": _ga(1272, locked=False),
        "ResourceHealthStatus": _alpha(1659),
    },
    disabled_controllers=_NODE_CONTROLLERS + _CLOUD_CONTROLLERS,
)

# k8s.io/kubernetes@v1.35.8: go.mod:206 requires etcd server v3.6.5; controllers registered in
# cmd/kube-controller-manager/app/controller_descriptor.go:210-218.
V1_35 = _version(
    "v1.35.8",
    etcd="v3.6.5",
    upstream_gates={
        "DRAAdminAccess": _beta(1229),
        "DRAConsumableCapacity": _alpha(1233),
        "DRADeviceBindingConditions": _alpha(1237),
        "DRADeviceTaintRules": _alpha(1241),
        "DRADeviceTaints": _alpha(1245),
        "DRAExtendedResource": _alpha(1249),
        "DRAPartitionableDevices": _alpha(1253),
        "DRAPrioritizedList": _beta(1258),
        "DRAResourceClaimDeviceStatus": _beta(1263),
        "DRASchedulerFilterTimeout": _beta(1267),
        "DynamicResourceAllocation": _ga(1296, locked=True),
        "ResourceHealthStatus": _alpha(1717),
    },
    # kube_features.go:2211-2239.
    gate_dependencies={
        "DRADeviceBindingConditions": ("DynamicResourceAllocation", "DRAResourceClaimDeviceStatus"),
        "DRADeviceTaintRules": ("DRADeviceTaints",),
    },
    disabled_controllers=_NODE_CONTROLLERS + _CLOUD_CONTROLLERS,
)

# k8s.io/kubernetes@v1.36.3: go.mod:201 requires etcd server v3.6.8; controllers registered in
# cmd/kube-controller-manager/app/controller_descriptor.go:211-219. DRADeviceTaintRules is beta but
# off by default upstream (its API, DeviceTaintRule v1beta2, is off by default); the cluster turns
# it on with the other beta gates.
V1_36 = _version(
    "v1.36.3",
    etcd="v3.6.8",
    upstream_gates={
        "DRAAdminAccess": _ga(1351, locked=True),
        "DRAConsumableCapacity": _beta(1356),
        "DRADeviceBindingConditions": _beta(1361),
        "DRADeviceTaintRules": _beta(1366, default=False),
        "DRADeviceTaints": _beta(1371),
        "DRAExtendedResource": _beta(1376),
        "DRAListTypeAttributes": _alpha(1380),
        "DRANodeAllocatableResources": _alpha(1384),
        "DRAPartitionableDevices": _beta(1389),
        "DRAPrioritizedList": _ga(1395, locked=False),
        "DRAResourceClaimDeviceStatus": _beta(1400),
        "DRAResourceClaimGranularStatusAuthorization": _beta(1404),
        "DRAResourcePoolStatus": _alpha(1408),
        "DRASchedulerFilterTimeout": _beta(1412),
        "DRAWorkloadResourceClaims": _alpha(1416),
        "DynamicResourceAllocation": _ga(1447, locked=True),
        "ResourceHealthStatus": _beta(1896),
        "ResourceHealthStatusMessage": _beta(1900),
    },
    # kube_features.go:2433-2471, 2645-2647.
    gate_dependencies={
        "DRADeviceBindingConditions": ("DynamicResourceAllocation", "DRAResourceClaimDeviceStatus"),
        "DRADeviceTaintRules": ("DRADeviceTaints",),
        "DRAResourceClaimGranularStatusAuthorization": (
            "DynamicResourceAllocation",
            "DRAResourceClaimDeviceStatus",
        ),
        "DRAWorkloadResourceClaims": ("DynamicResourceAllocation", "GenericWorkload"),
        "ResourceHealthStatusMessage": ("ResourceHealthStatus",),
    },
    disabled_controllers=_NODE_CONTROLLERS + _CLOUD_CONTROLLERS,
)

# k8s.io/kubernetes@v1.37.2: go.mod:209 requires etcd server v3.7.0; controllers registered in
# cmd/kube-controller-manager/app/controller_descriptor.go:174-218, without the cloud ones.
# DRADeviceTaints and DRADeviceTaintRules are GA and on, not locked (LockToDefault: true in 1.38).
V1_37 = _version(
    "v1.37.2",
    etcd="v3.7.0",
    upstream_gates={
        "DRAAdminAccess": _ga(1454, locked=True),
        "DRAConsumableCapacity": _beta(1459),
        "DRADerivedAttributes": _alpha(1463),
        "DRADeviceBindingConditions": _beta(1468),
        "DRADeviceCompatibilityGroups": _alpha(1472),
        "DRADeviceTaintRules": _ga(1478, locked=False),
        "DRADeviceTaints": _ga(1484, locked=False),
        "DRAExtendedResource": _ga(1490, locked=True),
        "DRAFractionalCapacityRange": _beta(1494, default=False),
        "DRAListTypeAttributes": _alpha(1499),
        "DRANodeAllocatableResources": _alpha(1503),
        "DRAOptionalNodeOperations": _alpha(1507),
        "DRAPartitionableDevices": _beta(1512),
        "DRAPartitionableDevicesType": _alpha(1516),
        "DRAPrioritizedList": _ga(1523, locked=True),
        "DRAResourceClaimDeviceStatus": _ga(1530, locked=True),
        "DRAResourceClaimGranularStatusAuthorization": _beta(1534),
        "DRAResourcePoolStatus": _alpha(1538),
        "DRASchedulerFilterTimeout": _beta(1542),
        "DRAWorkloadResourceClaims": _beta(1547, default=False),
        "DynamicResourceAllocation": _ga(1583, locked=True),
        "ResourceHealthStatus": _beta(2070),
        "ResourceHealthStatusMessage": _beta(2074),
    },
    # kube_features.go:2583-2633, 2825-2827.
    gate_dependencies={
        "DRADeviceBindingConditions": ("DynamicResourceAllocation", "DRAResourceClaimDeviceStatus"),
        "DRADeviceCompatibilityGroups": ("DynamicResourceAllocation", "DRAPartitionableDevices"),
        "DRADeviceTaintRules": ("DRADeviceTaints",),
        "DRAFractionalCapacityRange": ("DRAConsumableCapacity",),
        "DRAOptionalNodeOperations": ("DynamicResourceAllocation", "NodeDeclaredFeatures"),
        "DRAPartitionableDevicesType": (
            "DynamicResourceAllocation",
            "DRAPartitionableDevices",
            "DRAResourcePoolStatus",
        ),
        "DRAResourceClaimGranularStatusAuthorization": (
            "DynamicResourceAllocation",
            "DRAResourceClaimDeviceStatus",
        ),
        "DRAWorkloadResourceClaims": ("DynamicResourceAllocation", "GenericWorkload"),
        "ResourceHealthStatusMessage": ("ResourceHealthStatus",),
    },
    disabled_controllers=_NODE_CONTROLLERS,
    gates_left_at_default=_LEFT_AT_DEFAULT_1_37,
)

# k8s.io/kubernetes@v1.38.0-beta.0, the newest tag of 1.38's development branch the Go module proxy
# has (1.38.0 is not released): go.mod:9 requires go 1.27.0 (.go-version 1.27.3: newer than the Go
# this project builds with), go.mod:201 etcd server v3.7.3; controllers registered in
# cmd/kube-controller-manager/app/controller_descriptor.go:174-227, the node ones at 201-204, no
# cloud ones. DynamicResourceAllocation is gone (GA and locked since 1.35). Consumable capacity,
# binding conditions, partitionable devices and fractional capacity ranges are GA; device taints and
# taint rules GA and locked. Not supported yet: there is no gomod/k8s-1.38. The day 1.38.0 is out,
# compare this table with its kube_features.go, add the wrapper module (and the Go it needs), and
# move the entry into SUPPORTED (docs/notes/kubernetes-1.38.md lists what else to check).
V1_38_DEVELOPMENT = _version(
    "v1.38.0-beta.0",
    etcd="v3.7.3",
    upstream_gates={
        "DRAAdminAccess": _ga(1339, locked=True),
        "DRAConsumableCapacity": _ga(1345, locked=False),
        "DRADerivedAttributes": _alpha(1349),
        "DRADeviceBindingConditions": _ga(1355, locked=True),
        "DRADeviceCompatibilityGroups": _alpha(1359),
        "DRADeviceTaintRules": _ga(1366, locked=True),
        "DRADeviceTaints": _ga(1373, locked=True),
        "DRAExtendedResource": _ga(1379, locked=True),
        "DRAFractionalCapacityRange": _ga(1385, locked=False),
        "DRAListTypeAttributes": _alpha(1389),
        "DRANodeAllocatableResources": _alpha(1393),
        "DRAOptionalNodeOperations": _alpha(1397),
        "DRAPartitionableDevices": _ga(1403, locked=True),
        "DRAPartitionableDevicesType": _alpha(1407),
        "DRAPrioritizedList": _ga(1414, locked=True),
        "DRAResourceClaimDeviceStatus": _ga(1421, locked=True),
        "DRAResourceClaimGranularStatusAuthorization": _beta(1425),
        "DRAResourcePoolStatus": _alpha(1429),
        "DRASchedulerFilterTimeout": _beta(1433),
        "DRAWorkloadResourceClaims": _beta(1438, default=False),
        "ResourceHealthStatus": _beta(1893),
        "ResourceHealthStatusMessage": _beta(1897),
    },
    # kube_features.go:2379-2417, 2601.
    gate_dependencies={
        "DRADeviceBindingConditions": ("DRAResourceClaimDeviceStatus",),
        "DRADeviceCompatibilityGroups": ("DRAPartitionableDevices",),
        "DRADeviceTaintRules": ("DRADeviceTaints",),
        "DRAFractionalCapacityRange": ("DRAConsumableCapacity",),
        "DRAOptionalNodeOperations": ("NodeDeclaredFeatures",),
        "DRAPartitionableDevicesType": ("DRAPartitionableDevices", "DRAResourcePoolStatus"),
        "DRAResourceClaimGranularStatusAuthorization": ("DRAResourceClaimDeviceStatus",),
        "DRAWorkloadResourceClaims": ("GenericWorkload",),
        "ResourceHealthStatusMessage": ("ResourceHealthStatus",),
    },
    disabled_controllers=_NODE_CONTROLLERS,
    gates_left_at_default=_LEFT_AT_DEFAULT_1_38,
)

SUPPORTED: tuple[KubernetesVersion, ...] = (V1_34, V1_35, V1_36, V1_37)
DEFAULT = V1_37
"""What a cluster runs when nothing is asked for: the newest supported release, on which CI runs
the whole suite (the oldest, 1.34, runs the end-to-end and install tests)."""
UPCOMING: tuple[KubernetesVersion, ...] = (V1_38_DEVELOPMENT,)
"""Releases whose gate tables are recorded from their development branch but that the cluster cannot
run yet (no wrapper module): what to compare with the release the day it is out."""

_REQUEST = re.compile(r"v?(?P<major>\d+)\.(?P<minor>\d+)(?:\.(?P<patch>\d+|x))?")


class UnsupportedVersion(ValueError):
    """A requested Kubernetes version is not one the local cluster can run."""


def supported_list() -> str:
    """``v1.34.12, v1.35.8, v1.36.3, v1.37.2 (default)``."""
    return ", ".join(f"{v.version}{' (default)' if v is DEFAULT else ''}" for v in SUPPORTED)


def resolve(requested: str | None = None, *, environ: Mapping[str, str] | None = None) -> KubernetesVersion:
    """The supported version that ``requested`` names, else the one ``DRA_KUBERNETES_VERSION``
    names, else :data:`DEFAULT`. An empty value counts as not given.

    A minor release (``1.34``, ``1.34.x``, with or without ``v``) names its entry; a full version
    must be the entry's exact patch. Anything else raises :class:`UnsupportedVersion` listing the
    supported versions."""
    source = "requested"
    text = (requested or "").strip()
    if not text:
        text = (os.environ if environ is None else environ).get(VERSION_ENV, "").strip()
        source = VERSION_ENV
    if not text:
        return DEFAULT
    match = _REQUEST.fullmatch(text)
    if match is not None:
        minor = f"{int(match['major'])}.{int(match['minor'])}"
        patch = match["patch"]
        for candidate in SUPPORTED:
            if candidate.minor != minor:
                continue
            if patch in (None, "x") or candidate.version == f"v{minor}.{int(patch)}":
                return candidate
    raise UnsupportedVersion(
        f"{'' if source == 'requested' else source + '='}{text!r} is not a supported Kubernetes version; "
        f"supported: {supported_list()} (a minor version such as {SUPPORTED[0].minor} names its patch)"
    )
