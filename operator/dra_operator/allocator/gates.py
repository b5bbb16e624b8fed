"""Feature gates that change allocation, by their Kubernetes names, with 1.36 defaults."""

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

        Gates that do not affect allocation are ignored; a misspelt DRA gate is an error.
        """
        changes: dict[str, bool] = {}
        for name, value in gates.items():
            attr = GATE_FIELDS.get(name)
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
