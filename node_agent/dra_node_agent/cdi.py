"""Per-claim CDI spec files (Container Device Interface) for prepared claims.

One JSON spec per claim, kind `k8s.<driver>/claim` (e.g. `k8s.gpu.nvidia.com/claim`), file name
`<vendor>-claim_<claimUID>.json` like the CDI helpers' transient specs, one CDI device per allocated
device named `<claimUID>-<device>` so a name is never reused across claims. Spec-level edits carry
what every container of the claim needs (control device nodes, and the environment of the devices'
vendor, `VendorEnv`); device-level edits carry each device's own nodes.

`CdiWriter`'s methods do blocking file I/O: async callers run them with `asyncio.to_thread`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from dra_node_agent.checkpoint import atomic_write_file, fsync_directory, remove_temp_files
from dra_node_agent.devices import ContainerEdits, DiscoveredDevice, DiscoveredInventory
from dra_node_agent.opaqueconfig import DriverConfig

log = logging.getLogger(__name__)

DEFAULT_CDI_DIR = Path("/var/run/cdi")
CLAIM_CLASS = "claim"
# Bounds of one claim's spec. An environment entry longer than Linux's MAX_ARG_STRLEN (131072 bytes
# with its NUL) fails the container's start; a spec is a file on /var/run/cdi, a tmpfs in memory.
MAX_ENV_ENTRY_BYTES = 131071
MAX_SPEC_BYTES = 1 << 20

_UID = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


class SpecTooLarge(ValueError):
    """A claim's spec beyond the bounds above: prepare refuses it, naming what is too large."""


def cdi_vendor(driver: str) -> str:
    return f"k8s.{driver}"


def cdi_kind(driver: str) -> str:
    return f"{cdi_vendor(driver)}/{CLAIM_CLASS}"


def cdi_device_name(*, claim_uid: str, device_name: str) -> str:
    return f"{claim_uid}-{device_name}"


def qualified_device_id(*, driver: str, claim_uid: str, device_name: str) -> str:
    """The fully-qualified CDI device ID the kubelet passes to the runtime."""
    return f"{cdi_kind(driver)}={cdi_device_name(claim_uid=claim_uid, device_name=device_name)}"


def spec_file_name(*, driver: str, claim_uid: str) -> str:
    return f"{cdi_vendor(driver)}-{CLAIM_CLASS}_{claim_uid}.json"


def minimum_cdi_version(spec: dict[str, Any]) -> str:
    """The lowest cdiVersion that accepts `spec`, so older runtimes can load it.

    0.5.0 added `hostPath` on device nodes and device names starting with a digit; 0.6.0 added
    annotations. Nothing this writer emits needs more.
    """
    version = "0.3.0"
    edits = [spec.get("containerEdits", {})] + [d.get("containerEdits", {}) for d in spec["devices"]]
    uses_host_path = any("hostPath" in n for e in edits for n in e.get("deviceNodes", []))
    digit_names = any(d["name"][:1].isdigit() for d in spec["devices"])
    if uses_host_path or digit_names:
        version = "0.5.0"
    if "annotations" in spec or any("annotations" in d for d in spec["devices"]):
        version = "0.6.0"
    return version


# The vendor's context of a claim (``claim_context``), which only its own environment reads.
Context = TypeVar("Context", contravariant=True)


class VendorEnv(Protocol[Context]):
    """The environment a vendor's runtime and libraries read in a claim's containers, beyond the
    edits discovery gave each device (``nvidia.container_env``, ``tpu.container_env``).

    The core knows no vendor: the agent's wiring reads it from the vendor's record
    (``vendor_record``) and hands it to the writer. A driver without one (the simulated NIC driver)
    adds no environment.
    """

    def device_env(
        self, device: DiscoveredDevice, *, claim_uid: str, inventory: DiscoveredInventory
    ) -> tuple[str, ...]:
        """Environment entries ("K=V") for one device of the claim, beside its own edits."""

    def claim_env(
        self,
        devices: Sequence[DiscoveredDevice],
        *,
        inventory: DiscoveredInventory,
        node_name: str | None,
        config: DriverConfig | None,
        context: Context | None,
    ) -> tuple[str, ...]:
        """Environment entries ("K=V") that every container of the claim gets."""


def build_claim_spec(
    *,
    claim_uid: str,
    devices: Sequence[DiscoveredDevice],
    inventory: DiscoveredInventory,
    node_name: str | None = None,
    config: DriverConfig | None = None,
    context: Any = None,
    vendor_env: VendorEnv[Any] | None = None,
    common: ContainerEdits | None = None,
) -> dict[str, Any] | None:
    """The CDI spec for one claim's devices of `inventory.driver` (pure; no I/O).

    A device whose edits come out empty (a compute-domain channel on a node without NVLink fabric)
    has no CDI device, as CDI allows none without edits; a claim with no such device has no spec
    (None).

    `vendor_env` adds the environment of the devices' vendor. `config` is the claim's claim-wide
    opaque config, if any, and `context` what the vendor learnt of the claim at prepare
    (``claim_context``); both are passed on to `vendor_env` (a TPU claim's environment depends on
    them). ``common`` replaces the inventory's edits for every container of the claim (a claim for
    passthrough gets the IOMMU's API device, not the GPU driver's nodes and files).

    A simulated inventory's device nodes are named only when they exist on the host as character
    devices (``simulated_nodes_on_host``); otherwise its specs carry environment only (a runtime
    fails to create a container whose device node is missing or not a device).
    """
    if not _UID.fullmatch(claim_uid):
        raise ValueError(f"claim UID {claim_uid!r}: not a lower-case RFC 4122 UID")
    if not devices:
        raise ValueError(
            f"claim {claim_uid}: no devices of driver {inventory.driver} to write a CDI spec for"
        )
    driver = inventory.driver
    cdi_devices = []
    for device in devices:
        edits = device.edits
        if vendor_env is not None:
            env = vendor_env.device_env(device, claim_uid=claim_uid, inventory=inventory)
            edits = edits.merged(ContainerEdits(env=env))
        if inventory.simulated:
            nodes = edits.device_nodes if inventory.simulated_nodes_on_host else ()
            marker = (_simulated_device_env(device),) if device.uuid else ()
            edits = dataclasses.replace(edits, device_nodes=nodes, env=(*edits.env, *marker))
        if edits.is_empty():
            continue
        cdi_devices.append(
            {
                "name": cdi_device_name(claim_uid=claim_uid, device_name=device.name),
                "containerEdits": edits.to_cdi(),
            }
        )
    common = inventory.common_edits if common is None else common
    if vendor_env is not None:
        env = vendor_env.claim_env(
            devices, inventory=inventory, node_name=node_name, config=config, context=context
        )
        common = common.merged(ContainerEdits(env=env))
    if inventory.simulated and not inventory.simulated_nodes_on_host:
        # Nothing of the fake host can be injected; its mounts are only made alongside real nodes.
        common = ContainerEdits(env=common.env)
    if not cdi_devices:
        return None
    spec: dict[str, Any] = {"cdiVersion": "", "kind": cdi_kind(driver), "devices": cdi_devices}
    if not common.is_empty():
        spec["containerEdits"] = common.to_cdi()
    spec["cdiVersion"] = minimum_cdi_version(spec)
    _check_env(spec)
    return spec


def _check_env(spec: dict[str, Any]) -> None:
    edits = [spec.get("containerEdits", {})] + [d["containerEdits"] for d in spec["devices"]]
    for entry in (e for edit in edits for e in edit.get("env", [])):
        size = len(entry.encode())
        if size > MAX_ENV_ENTRY_BYTES:
            name = entry.split("=", 1)[0]
            raise SpecTooLarge(
                f"the CDI spec's {name} would be {size} bytes, more than the {MAX_ENV_ENTRY_BYTES} a "
                "process's environment entry may hold"
            )


def _simulated_device_env(device: DiscoveredDevice) -> str:
    return f"DRA_SIMULATED_DEVICE_{_ENV_NAME_UNSAFE.sub('_', device.name).upper()}={device.uuid}"


class CdiWriter:
    """Writes and removes the per-claim CDI specs of one driver in `cdi_dir` (default /var/run/cdi).

    All methods block (file I/O and fsync); call them through `asyncio.to_thread`.
    """

    def __init__(
        self,
        *,
        driver: str,
        cdi_dir: str | Path = DEFAULT_CDI_DIR,
        node_name: str | None = None,
        vendor_env: VendorEnv[Any] | None = None,
    ):
        self.driver = driver
        self.cdi_dir = Path(cdi_dir)
        self.node_name = node_name
        self.vendor_env = vendor_env

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_dir / spec_file_name(driver=self.driver, claim_uid=claim_uid)

    def write_claim_spec(
        self,
        *,
        claim_uid: str,
        devices: Sequence[DiscoveredDevice],
        inventory: DiscoveredInventory,
        config: DriverConfig | None = None,
        context: Any = None,
        common: ContainerEdits | None = None,
    ) -> list[str | None]:
        """Write the claim's spec atomically; returns the CDI device IDs in `devices` order (None for
        a device that needs no CDI device; with none needed, no spec is written).

        Rewriting an existing spec for the same claim is fine (prepare retries land here).
        """
        if inventory.driver != self.driver:
            raise ValueError(f"CDI writer for {self.driver}: inventory is for driver {inventory.driver}")
        spec = build_claim_spec(
            claim_uid=claim_uid,
            devices=devices,
            inventory=inventory,
            node_name=self.node_name,
            config=config,
            context=context,
            vendor_env=self.vendor_env,
            common=common,
        )
        if spec is None:
            self.remove_claim_spec(claim_uid)
            return [None for _ in devices]
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        data = _encode(spec)
        if len(data) > MAX_SPEC_BYTES:
            raise SpecTooLarge(
                f"the CDI spec would be {len(data)} bytes, more than the {MAX_SPEC_BYTES} allowed"
            )
        atomic_write_file(self.spec_path(claim_uid), data, mode=0o644)
        named = {d["name"] for d in spec["devices"]}
        return [
            qualified_device_id(driver=self.driver, claim_uid=claim_uid, device_name=d.name)
            if cdi_device_name(claim_uid=claim_uid, device_name=d.name) in named
            else None
            for d in devices
        ]

    def remove_claim_spec(self, claim_uid: str) -> bool:
        """Delete the claim's spec; True if one was there. Idempotent."""
        path = self.spec_path(claim_uid)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        fsync_directory(path.parent)
        return True

    def claim_uids(self) -> set[str]:
        """UIDs of the claims that have a spec of this driver on disk (for stale-spec cleanup)."""
        prefix = f"{cdi_vendor(self.driver)}-{CLAIM_CLASS}_"
        try:
            names = os.listdir(self.cdi_dir)
        except FileNotFoundError:
            return set()
        return {n[len(prefix) : -len(".json")] for n in names if n.startswith(prefix) and n.endswith(".json")}

    def remove_stale_temp_files(self) -> int:
        """Remove temporary files a crash left behind mid-write; returns how many."""
        return remove_temp_files(self.cdi_dir, prefix=f".{cdi_vendor(self.driver)}-{CLAIM_CLASS}_")


def _encode(spec: dict[str, Any]) -> bytes:
    return (json.dumps(spec, indent=2, sort_keys=False) + "\n").encode()
