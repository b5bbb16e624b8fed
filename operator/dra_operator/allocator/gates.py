"""Feature gates that change allocation, by their Kubernetes names, with each release's defaults.

kube-scheduler allocates with the gates of its cluster; the operator allocates beside it, so it
takes the defaults of the cluster's release (:meth:`FeatureGates.for_kubernetes`, from the API
server's ``/version``) and lets ``--feature-gates`` override them where a cluster switches a gate.

Every allocation gate up to 1.38's development branch is modelled: the 1.37 ones
(DRADeviceCompatibilityGroups, DRAOptionalNodeOperations, DRADerivedAttributes: alpha and off;
DRAFractionalCapacityRange: beta, off unless the cluster's minimum compatibility version is 1.37)
with their defaults as in 1.37. :data:`NOT_MODELLED` holds a gate whose "on" behaviour the
allocator does not implement (none at present): such a gate is accepted set to false and refused
set to true, rather than pretended.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace

# Kubernetes gate name -> FeatureGates field.
GATE_FIELDS: dict[str, str] = {
    "DRAPrioritizedList": "prioritized_list",
    "DRAAdminAccess": "admin_access",
    "DRAPartitionableDevices": "partitionable_devices",
    "DRADeviceTaints": "device_taints",
    "DRAConsumableCapacity": "consumable_capacity",
    "DRADeviceBindingConditions": "device_binding_conditions",
    "DRAResourceClaimDeviceStatus": "resource_claim_device_status",
    "DRAListTypeAttributes": "list_type_attributes",
    "DRADeviceCompatibilityGroups": "compatibility_groups",
    "DRAOptionalNodeOperations": "optional_node_operations",
    "DRADerivedAttributes": "derived_attributes",
    "DRAFractionalCapacityRange": "fractional_capacity_range",
}

# Allocation gates whose "on" behaviour is not implemented -> what it would do (none at present).
NOT_MODELLED: dict[str, str] = {}


@dataclass(frozen=True, slots=True)
class FeatureGates:
    """Allocation feature gates; the defaults are those of Kubernetes 1.36 and 1.37."""

    prioritized_list: bool = True
    admin_access: bool = True
    partitionable_devices: bool = True
    device_taints: bool = True
    consumable_capacity: bool = True
    device_binding_conditions: bool = True
    resource_claim_device_status: bool = True
    list_type_attributes: bool = False
    # 1.37 (alpha, off): counter-set compatibility groups. Off, a slice that declares them is ignored,
    # which leaves its pool incomplete.
    compatibility_groups: bool = False
    # 1.37 (alpha, off): devices of slices with skipNodeOperations, on nodes that declare the feature.
    optional_node_operations: bool = False
    # 1.37 (alpha, off): a request's derivedAttributes, CEL per device, seen by its constraints.
    derived_attributes: bool = False
    # 1.37 (beta, off unless --min-compatibility-version is 1.37), 1.38 (GA, on): consumable-capacity
    # ranges worked in milli-units.
    fractional_capacity_range: bool = False

    @property
    def device_binding_and_status(self) -> bool:
        """The allocator's DeviceBindingAndStatus flag (both gates on)."""
        return self.device_binding_conditions and self.resource_claim_device_status

    @classmethod
    def defaults(cls) -> FeatureGates:
        return cls()

    @classmethod
    def all_off(cls) -> FeatureGates:
        return cls(**{f.name: False for f in fields(cls)})

    @classmethod
    def from_mapping(cls, gates: Mapping[str, bool], *, base: FeatureGates | None = None) -> FeatureGates:
        """Override ``base`` (default: 1.36 defaults) with ``{"DRAAdminAccess": False, ...}``.

        Gates that do not affect allocation are ignored; a misspelt DRA gate is an error, and so is
        a gate of :data:`NOT_MODELLED` switched on.
        """
        changes: dict[str, bool] = {}
        for name, value in gates.items():
            attr = GATE_FIELDS.get(name)
            if name in NOT_MODELLED:
                if value:
                    raise ValueError(
                        f"feature gate {name} is not modelled by this allocator ({NOT_MODELLED[name]}); "
                        "it allocates as Kubernetes does with the gate off"
                    )
                continue
            if attr is None:
                if name.startswith("DRA"):
                    raise ValueError(
                        f"unknown feature gate {name!r}; known: {', '.join(sorted(GATE_FIELDS))}"
                    )
                continue
            changes[attr] = bool(value)
        return replace(base or cls(), **changes)

    @classmethod
    def only(cls, enabled: Iterable[str]) -> FeatureGates:
        """Exactly these gates on, everything else off; ``"A+B"`` names two gates at once."""
        names = [part for item in enabled for part in item.split("+") if part]
        return cls.from_mapping(dict.fromkeys(names, True), base=cls.all_off())

    @classmethod
    def from_flag(cls, text: str, *, base: FeatureGates | None = None) -> FeatureGates:
        """Parse a ``--feature-gates`` value, e.g. ``DRAAdminAccess=false,DRADeviceTaints=true``."""
        gates: dict[str, bool] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, value = item.partition("=")
            if not sep or value.lower() not in ("true", "false"):
                raise ValueError(f"invalid feature gate setting {item!r}; expected Name=true or Name=false")
            gates[name.strip()] = value.lower() == "true"
        return cls.from_mapping(gates, base=base)

    def to_mapping(self) -> dict[str, bool]:
        return {name: getattr(self, attr) for name, attr in GATE_FIELDS.items()}

    @classmethod
    def for_kubernetes(cls, version: str) -> KubernetesGates:
        """The allocation gates a Kubernetes release turns on by default.

        ``version`` is what ``/version`` reports (``v1.34.12``, ``v1.35.0-eks-113cf36``...). A
        release newer than the newest known one gets the newest known defaults, an older one the
        oldest; :attr:`KubernetesGates.known` says whether the release was in the table."""
        minor = kubernetes_minor(version)
        if minor is None:
            raise ValueError(f"not a Kubernetes version: {version!r}")
        known = sorted(RELEASE_DEFAULTS)
        if minor in RELEASE_DEFAULTS:
            return KubernetesGates(minor=minor, gates=RELEASE_DEFAULTS[minor], known=True)
        nearest = known[-1] if minor > known[-1] else known[0]
        return KubernetesGates(minor=minor, gates=RELEASE_DEFAULTS[nearest], known=False, used=nearest)


@dataclass(frozen=True, slots=True)
class KubernetesGates:
    """The default allocation gates chosen for a cluster's release."""

    minor: tuple[int, int]
    gates: FeatureGates
    known: bool
    used: tuple[int, int] | None = None
    """The release whose defaults stand in when :attr:`known` is false."""

    def describe(self) -> str:
        """``Kubernetes 1.34 defaults`` or ``Kubernetes 1.39 (not known; 1.38 defaults)``."""
        name = f"{self.minor[0]}.{self.minor[1]}"
        if self.known or self.used is None:
            return f"Kubernetes {name} defaults"
        return f"Kubernetes {name} (not known to this release; {self.used[0]}.{self.used[1]} defaults)"


_VERSION = re.compile(r"v?(\d+)\.(\d+)")


def kubernetes_minor(version: str) -> tuple[int, int] | None:
    """``(1, 34)`` for ``v1.34.12`` or ``v1.34.0-gke.1``; None for text that names no release."""
    match = _VERSION.match(version.strip())
    return (int(match[1]), int(match[2])) if match else None


# Each release's defaults, read in its pkg/features/kube_features.go: alpha gates are off, beta and
# GA on. 1.34 and 1.35: prioritized list, admin access and device status beta; partitionable
# devices, device taints, consumable capacity and binding conditions alpha. 1.36: those four beta.
# 1.37: the same allocation gates on (device taints and device status GA); list-type attributes
# alpha in 1.36 and 1.37; compatibility groups, optional node operations and derived attributes
# alpha in 1.37 (not defined before); fractional capacity ranges beta in 1.37 but on only where
# the minimum compatibility version is 1.37, which a 1.37 cluster's is not by default. 1.38 (its
# development branch, read at v1.38.0-beta.0, lines 1336-1438): fractional capacity ranges GA and
# on; consumable capacity, binding conditions and partitionable devices GA; the alpha gates alpha.
# docs/notes/kubernetes-1.38.md has the whole table.
_BEFORE_1_36 = FeatureGates(
    partitionable_devices=False,
    device_taints=False,
    consumable_capacity=False,
    device_binding_conditions=False,
)
RELEASE_DEFAULTS: dict[tuple[int, int], FeatureGates] = {
    (1, 34): _BEFORE_1_36,
    (1, 35): _BEFORE_1_36,
    (1, 36): FeatureGates(),
    (1, 37): FeatureGates(),
    (1, 38): FeatureGates(fractional_capacity_range=True),
}
