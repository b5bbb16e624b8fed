"""The discovery interface: what every backend returns, and how a device renders into a ResourceSlice.

A backend (NVML, TPU sysfs, or the simulated one that runs those two over fake hardware) returns a
`DiscoveredInventory` for one driver. Each `DiscoveredDevice` renders itself as a
`resource.k8s.io/v1` device dict for the slice publisher and carries what prepare needs later: the
UUID, PCI bus ID and the per-device CDI container edits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

AttributeKind = Literal["string", "int", "bool", "version"]

# Limits from resource.k8s.io/v1 validation (dra-api.md 1.2, 1.3).
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING_ATTRIBUTE_LENGTH = 64
MAX_IDENTIFIER_LENGTH = 32

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_C_IDENTIFIER = re.compile(r"^[_a-zA-Z][_a-zA-Z0-9]*$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


@dataclass(frozen=True)
class Attribute:
    """One typed device attribute; renders as the v1 JSON union (`{"string": ...}` and so on)."""

    kind: AttributeKind
    value: str | int | bool

    def to_json(self) -> dict[str, str | int | bool]:
        return {self.kind: self.value}


def string_attr(value: str) -> Attribute:
    return Attribute("string", value)


def int_attr(value: int) -> Attribute:
    return Attribute("int", value)


def bool_attr(value: bool) -> Attribute:
    return Attribute("bool", value)


def version_attr(value: str) -> Attribute:
    """A version attribute; `value` is normalised to semver (see `to_semver`)."""
    return Attribute("version", to_semver(value))


def to_semver(raw: str) -> str:
    """Turn vendor version strings ("580.65.06", "12.4", "9.0") into semver 2.0.0.

    The apiserver rejects leading zeros and missing components, which NVIDIA's driver versions have.
    """
    parts = [p for p in raw.strip().split(".") if p != ""]
    if not parts or len(parts) > 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"version {raw!r}: expected up to three numeric components")
    numbers = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(numbers)


_BINARY_SUFFIXES = (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10))


def format_quantity(value: int) -> str:
    """Render a non-negative integer (bytes or a count) as a canonical Kubernetes quantity string."""
    if value < 0:
        raise ValueError(f"quantity {value}: must not be negative")
    if value == 0:
        return "0"
    for suffix, factor in _BINARY_SUFFIXES:
        if value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


@dataclass(frozen=True)
class DeviceNode:
    """A device node for a CDI spec: `path` inside the container, `host_path` on the node. With
    `device_type` and the numbers the runtime makes the node itself and reads nothing on the host
    (NVIDIA's IMEX channels and capabilities, which the host may not have as files)."""

    path: str
    host_path: str | None = None
    permissions: str | None = None
    device_type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.host_path is not None and self.host_path != self.path:
            out["hostPath"] = self.host_path
        if self.permissions is not None:
            out["permissions"] = self.permissions
        if self.device_type is not None:
            out["type"] = self.device_type
        if self.major is not None:
            out["major"] = self.major
        if self.minor is not None:
            out["minor"] = self.minor
        if self.file_mode is not None:
            out["fileMode"] = self.file_mode
        return out

    @property
    def numbered(self) -> bool:
        """Whether the runtime makes this node from its numbers (no host file is read)."""
        return self.device_type is not None and self.major is not None and self.minor is not None


@dataclass(frozen=True)
class Mount:
    """A bind mount for a CDI spec: `host_path` on the node at `container_path`, read-only unless
    the container must write there (an MPS claim's shm), and `noexec` where nothing is run from it
    (a daemon's socket, a claim's shm)."""

    host_path: str
    container_path: str
    read_only: bool = True
    noexec: bool = False

    def to_cdi(self) -> dict[str, Any]:
        options = ["ro" if self.read_only else "rw", "nosuid", "nodev", "bind"]
        if self.noexec:
            options.append("noexec")
        return {"hostPath": self.host_path, "containerPath": self.container_path, "options": options}


@dataclass(frozen=True)
class Hook:
    """An OCI hook for a CDI spec: the runtime runs `path` (a host binary) with `args` (argv[0]
    first) at `hook_name` (e.g. createContainer), as NVIDIA's generated specs run nvidia-cdi-hook."""

    hook_name: str
    path: str
    args: tuple[str, ...]

    def to_cdi(self) -> dict[str, Any]:
        return {"hookName": self.hook_name, "path": self.path, "args": list(self.args)}


@dataclass(frozen=True)
class ContainerEdits:
    """The subset of CDI containerEdits this driver uses: device nodes, environment ("K=V"), bind
    mounts and hooks."""

    device_nodes: tuple[DeviceNode, ...] = ()
    env: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()

    def is_empty(self) -> bool:
        return not self.device_nodes and not self.env and not self.mounts and not self.hooks

    def merged(self, other: ContainerEdits) -> ContainerEdits:
        """Union with `other`, keeping first occurrences (paths and env names are not duplicated)."""
        nodes = list(self.device_nodes)
        seen_paths = {n.path for n in nodes}
        for node in other.device_nodes:
            if node.path not in seen_paths:
                nodes.append(node)
                seen_paths.add(node.path)
        env = list(self.env)
        seen_names = {e.split("=", 1)[0] for e in env}
        for entry in other.env:
            name = entry.split("=", 1)[0]
            if name not in seen_names:
                env.append(entry)
                seen_names.add(name)
        mounts = list(self.mounts)
        targets = {m.container_path for m in mounts}
        for mount in other.mounts:
            if mount.container_path not in targets:
                mounts.append(mount)
                targets.add(mount.container_path)
        hooks = (*self.hooks, *(h for h in other.hooks if h not in self.hooks))
        return ContainerEdits(device_nodes=tuple(nodes), env=tuple(env), mounts=tuple(mounts), hooks=hooks)

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [n.to_cdi() for n in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_cdi() for m in self.mounts]
        if self.hooks:
            out["hooks"] = [h.to_cdi() for h in self.hooks]
        return out


DeviceKind = Literal["gpu", "mig", "vfio", "tpu", "nic", "channel", "daemon"]


@dataclass(frozen=True)
class MigPlacement:
    """Where a dynamic MIG device goes: a GPU-instance profile at one placement of one GPU, with
    the compute-instance profile that spans it. The instance exists only while a claim holds it."""

    parent_uuid: str
    parent_minor: int
    profile_id: int
    start: int
    size: int
    compute_profile: int


@dataclass(frozen=True)
class CounterSet:
    """A ResourceSlice ``sharedCounters`` entry: what partitionable devices consume (KEP-4815).

    ``guard``: the set only keeps apart two devices that are one piece of hardware (a GPU's CUDA and
    passthrough devices). Where the API server drops counters, such devices are published without
    them (as before counters, with prepare refusing the second claim), not withdrawn as the
    partitions of a GPU are."""

    name: str
    counters: Mapping[str, int]
    guard: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "counters": {k: {"value": format_quantity(self.counters[k])} for k in sorted(self.counters)},
        }


@dataclass(frozen=True)
class CapacityPolicy:
    """A consumable capacity's ``requestPolicy`` (KEP-5075), in base units: what a claim that names
    none consumes (``default``), and the range a request is rounded up into (``minimum`` to
    ``maximum`` in steps of ``step``). Only a device with ``allowMultipleAllocations`` has one."""

    default: int
    minimum: int
    maximum: int
    step: int

    def to_json(self) -> dict[str, Any]:
        return {
            "default": format_quantity(self.default),
            "validRange": {
                "min": format_quantity(self.minimum),
                "max": format_quantity(self.maximum),
                "step": format_quantity(self.step),
            },
        }

    def problems(self, *, value: int) -> list[str]:
        """What the API server's validation would refuse in this policy of a capacity of ``value``."""
        found = []
        if self.step <= 0 or self.minimum < 0:
            found.append("step must be positive and min not negative")
        elif not self.minimum <= self.default <= self.maximum <= value:
            found.append("min <= default <= max <= value does not hold")
        elif (self.default - self.minimum) % self.step or (self.maximum - self.minimum) % self.step:
            found.append("default and max must be min plus whole steps")
        return found


@dataclass(frozen=True)
class DiscoveredDevice:
    """One allocatable device as discovered on this node.

    `name` is the ResourceSlice device name (a DNS label, stable across restarts). `capacity` holds
    integers in base units (bytes, counts). `edits` are the per-device CDI container edits.
    """

    name: str
    kind: DeviceKind
    uuid: str
    attributes: Mapping[str, Attribute]
    capacity: Mapping[str, int] = field(default_factory=dict)
    pci_bus_id: str | None = None
    parent_uuid: str | None = None
    # Vendor-local identifier used in device paths and env names: GPU minor, "accel0" or a VFIO group.
    local_id: str = ""
    edits: ContainerEdits = field(default_factory=ContainerEdits)
    # Dynamic MIG: the placement this device stands for (created at prepare, ``uuid`` empty until
    # then) and what it consumes of its GPU's counter set.
    mig_placement: MigPlacement | None = None
    consumes: CounterSet | None = None
    # Consumable capacity (KEP-5075): several claims may each hold a share of the device, as much of
    # each capacity as ``capacity_policies`` lets them ask for (``--consumable-shares``).
    allow_multiple_allocations: bool = False
    capacity_policies: Mapping[str, CapacityPolicy] = field(default_factory=dict)

    def to_slice_device(self) -> dict[str, Any]:
        """The device as a `resource.k8s.io/v1` ResourceSlice `spec.devices[]` entry."""
        out: dict[str, Any] = {
            "name": self.name,
            "attributes": {k: self.attributes[k].to_json() for k in sorted(self.attributes)},
        }
        if self.capacity:
            out["capacity"] = {k: self._capacity_json(k) for k in sorted(self.capacity)}
        if self.allow_multiple_allocations:
            out["allowMultipleAllocations"] = True
        if self.consumes is not None:
            used = self.consumes.to_json()
            out["consumesCounters"] = [{"counterSet": used["name"], "counters": used["counters"]}]
        return out

    def _capacity_json(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = {"value": format_quantity(self.capacity[name])}
        policy = self.capacity_policies.get(name)
        if policy is not None:
            out["requestPolicy"] = policy.to_json()
        return out


@dataclass(frozen=True)
class TpuHostInfo:
    """What a TPU host knows about its slice; CDI uses it to write the TPU_* environment."""

    generation: str  # tpuGen, e.g. "v6e", "v5litepod", "v5p", "v4"
    accelerator: str  # GKE accelerator label value, e.g. "tpu-v6e-slice"
    cores_per_chip: int
    chips_on_host: int
    topology: str  # slice topology, "2x4" or "4x4x4"
    chips_per_host_bounds: tuple[int, int, int]
    worker_id: int | None = None
    worker_hostnames: tuple[str, ...] = ()
    # The physical slice this host belongs to (tpu-env SLICE_ID or NODE_ID); None when unknown.
    slice_id: str | None = None

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.topology.split("x"))

    @property
    def slice_chips(self) -> int:
        total = 1
        for d in self.dims:
            total *= d
        return total

    @property
    def single_host(self) -> bool:
        return self.slice_chips == self.chips_on_host

    @property
    def host_bounds(self) -> tuple[int, int, int]:
        """Hosts per dimension of the slice: its topology divided by this host's chip bounds."""
        padded = [*self.dims, 1, 1][:3]
        a, b, c = (max(1, d // per) for d, per in zip(padded, self.chips_per_host_bounds, strict=True))
        return a, b, c

    @property
    def slice_hosts(self) -> int:
        """How many hosts the slice spans (1 for a single-host slice)."""
        a, b, c = self.host_bounds
        return a * b * c


@dataclass(frozen=True)
class DiscoveredInventory:
    """Everything one backend found for one driver.

    `available` is False when the backend could not look at all (NVML not loadable); `errors` lists
    per-device problems that were skipped. `common_edits` apply to every claim of this driver.
    """

    driver: str
    devices: tuple[DiscoveredDevice, ...] = ()
    common_edits: ContainerEdits = field(default_factory=ContainerEdits)
    tpu_host: TpuHostInfo | None = None
    available: bool = True
    errors: tuple[str, ...] = ()
    simulated: bool = False
    simulated_nodes_on_host: bool = False
    """For a simulated inventory: its device nodes exist on the host as character devices (the
    fake /dev could hold them), so CDI specs may name them; otherwise specs carry environment only."""
    counter_sets: tuple[CounterSet, ...] = ()

    def slice_devices(self) -> list[dict[str, Any]]:
        return [d.to_slice_device() for d in self.devices]

    def slice_counter_sets(self) -> list[dict[str, Any]]:
        return [c.to_json() for c in self.counter_sets]

    def guard_counter_sets(self) -> list[str]:
        """The names of the counter sets that are guards (see :class:`CounterSet`)."""
        return [c.name for c in self.counter_sets if c.guard]

    def by_name(self) -> dict[str, DiscoveredDevice]:
        return {d.name: d for d in self.devices}


class DiscoveryBackend(Protocol):
    """A source of devices for one driver. `discover` never blocks the event loop."""

    @property
    def driver(self) -> str: ...

    @property
    def vendor(self) -> str:
        """The name of the vendor's record (``vendor_record``), which builds everything else the
        vendor brings to these devices: discovery only discovers."""
        ...

    async def discover(self) -> DiscoveredInventory: ...


def dns_label(raw: str) -> str:
    """Lower-case `raw` and drop characters a DNS label cannot hold ("1g.10gb+me" -> "1g10gb-me")."""
    lowered = raw.lower().replace("+", "-").replace("_", "-")
    cleaned = re.sub(r"[^a-z0-9-]", "", lowered)
    return re.sub(r"-+", "-", cleaned).strip("-")


def validate_slice_device(device: Mapping[str, Any], *, driver: str) -> list[str]:
    """Check a rendered device against the v1 validation rules; returns one message per problem."""
    problems: list[str] = []
    name = device.get("name", "")
    where = f"device {name!r}"
    if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.fullmatch(name):
        problems.append(f"{where}: name is not a DNS label")
    attributes = device.get("attributes", {})
    capacity = device.get("capacity", {})
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        problems.append(
            f"{where}: {len(attributes) + len(capacity)} attributes+capacities, "
            f"limit {MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    for key in [*attributes, *capacity]:
        problem = _qualified_name_problem(key, driver=driver)
        if problem:
            problems.append(f"{where}: key {key!r}: {problem}")
    for key, value in attributes.items():
        if not isinstance(value, dict) or len(value) != 1:
            problems.append(f"{where}: attribute {key!r} must set exactly one of string/int/bool/version")
            continue
        ((kind, v),) = value.items()
        if kind == "string":
            if not isinstance(v, str) or len(v) > MAX_STRING_ATTRIBUTE_LENGTH:
                problems.append(f"{where}: attribute {key!r}: string longer than 64 characters")
        elif kind == "version":
            if not isinstance(v, str) or len(v) > MAX_STRING_ATTRIBUTE_LENGTH or not _SEMVER.fullmatch(v):
                problems.append(f"{where}: attribute {key!r}: {v!r} is not semver 2.0.0")
        elif kind == "int":
            if not isinstance(v, int) or isinstance(v, bool):
                problems.append(f"{where}: attribute {key!r}: int value is not an integer")
        elif kind == "bool":
            if not isinstance(v, bool):
                problems.append(f"{where}: attribute {key!r}: bool value is not a boolean")
        else:
            problems.append(f"{where}: attribute {key!r}: unknown type {kind!r}")
    for key, value in capacity.items():
        if not isinstance(value, dict) or not isinstance(value.get("value"), str):
            problems.append(f"{where}: capacity {key!r} must be {{'value': <quantity>}}")
    return problems


def _qualified_name_problem(key: str, *, driver: str) -> str | None:
    domain, _, ident = key.rpartition("/")
    if domain and (len(domain) > 63 or not _DNS_SUBDOMAIN.fullmatch(domain)):
        return "domain is not a DNS subdomain of at most 63 characters"
    if len(ident) > MAX_IDENTIFIER_LENGTH or not _C_IDENTIFIER.fullmatch(ident):
        return "identifier is not a C identifier of at most 32 characters"
    del driver  # unqualified names belong to the driver's own domain; nothing more to check
    return None


def check_inventory(inventory: DiscoveredInventory) -> list[str]:
    """Validate every rendered device and that names are unique within the pool."""
    problems: list[str] = []
    seen: set[str] = set()
    for device in inventory.devices:
        if device.name in seen:
            problems.append(f"device {device.name!r}: duplicate name in pool")
        seen.add(device.name)
        problems.extend(validate_slice_device(device.to_slice_device(), driver=inventory.driver))
        problems.extend(_policy_problems(device))
    return problems


def _policy_problems(device: DiscoveredDevice) -> list[str]:
    """A request policy needs allowMultipleAllocations and a capacity it bounds, as the API asks."""
    problems = []
    for name, policy in sorted(device.capacity_policies.items()):
        where = f"device {device.name!r}: capacity {name!r} requestPolicy"
        if not device.allow_multiple_allocations:
            problems.append(f"{where}: only a device with allowMultipleAllocations may have one")
        if name not in device.capacity:
            problems.append(f"{where}: the device has no such capacity")
            continue
        problems.extend(f"{where}: {p}" for p in policy.problems(value=device.capacity[name]))
    return problems


def sorted_devices(devices: Sequence[DiscoveredDevice]) -> tuple[DiscoveredDevice, ...]:
    """Devices in a stable order (natural sort on the name: gpu-2 before gpu-10)."""

    def key(d: DiscoveredDevice) -> list[int | str]:
        return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", d.name)]

    return tuple(sorted(devices, key=key))
