"""Feature gates that change allocation, by their Kubernetes names, with 1.36 defaults.

The gates 1.37 added and the allocator implements (DRADeviceCompatibilityGroups,
DRAOptionalNodeOperations) are alpha and off by default in 1.37, as here. Two other 1.37 gates that
change allocation are not modelled (:data:`NOT_MODELLED`): the allocator does what upstream does with
them off, accepts them set to false, and refuses to pretend they are on.
"""

from __future__ import annotations

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
}

# Allocation gates of Kubernetes 1.37 whose "on" behaviour is not implemented -> what it would do.
NOT_MODELLED: dict[str, str] = {
    "DRADerivedAttributes": "requests with derived attributes (CEL per device, used by constraints)",
    "DRAFractionalCapacityRange": "milli-unit arithmetic for consumable-capacity ranges",
}


@dataclass(frozen=True, slots=True)
class FeatureGates:
    """Allocation feature gates; the defaults are those of Kubernetes 1.36."""

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
