"""Turns the neutral conformance YAML into v1 JSON objects and compares outcomes."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import yaml

from dra_api.model import AllocationResult, DeviceClass, Node, ResourceClaim, ResourceSlice
from dra_api.quantity import Quantity
from dra_operator.allocator import AllocatedState, FeatureGates, parse_device_id

# Upstream's allocator cases in neutral YAML, kept in the repository as data, and the project's own
# cases in the same format (behaviour upstream's table does not pin, checked against upstream too).
CASES_FILE = Path(__file__).resolve().parents[3] / "fixtures" / "conformance" / "allocator-cases.yaml"
PROJECT_CASES_FILE = CASES_FILE.with_name("project-cases.yaml")
GENERATED_UUID = "<generated-uuid>"
V1 = "resource.k8s.io/v1"


def load_cases(path: Path = CASES_FILE) -> list[dict[str, Any]]:
    with path.open() as f:
        data = yaml.safe_load(f)
    cases: list[dict[str, Any]] = data["cases"]
    return cases


def _selectors(raw: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [{"cel": {"expression": s["cel"]}} if "cel" in s else {} for s in raw or []]


def _exact(raw: dict[str, Any]) -> dict[str, Any]:
    out = dict(raw)
    if "selectors" in out:
        out["selectors"] = _selectors(out["selectors"])
    return out


def device_class(raw: dict[str, Any]) -> DeviceClass:
    spec: dict[str, Any] = {"selectors": _selectors(raw.get("selectors"))}
    if raw.get("config"):
        spec["config"] = raw["config"]
    return DeviceClass.from_json(
        {"apiVersion": V1, "kind": "DeviceClass", "metadata": {"name": raw["name"]}, "spec": spec}
    )


def resource_slice(raw: dict[str, Any]) -> ResourceSlice:
    spec = {k: v for k, v in raw.items() if k != "name"}
    return ResourceSlice.from_json(
        {"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": raw["name"]}, "spec": spec}
    )


def resource_claim(raw: dict[str, Any]) -> ResourceClaim:
    requests = []
    for r in raw.get("requests") or []:
        req: dict[str, Any] = {"name": r["name"]}
        if "exactly" in r:
            req["exactly"] = _exact(r["exactly"])
        if "firstAvailable" in r:
            req["firstAvailable"] = [_exact(s) for s in r["firstAvailable"]]
        requests.append(req)
    devices: dict[str, Any] = {"requests": requests}
    if raw.get("constraints"):
        devices["constraints"] = raw["constraints"]
    if raw.get("config"):
        devices["config"] = raw["config"]
    return ResourceClaim.from_json(
        {
            "apiVersion": V1,
            "kind": "ResourceClaim",
            "metadata": {"name": raw["name"]},
            "spec": {"devices": devices},
        }
    )


def node(raw: dict[str, Any] | None) -> Node:
    raw = raw or {"name": "node-1", "labels": {"region": "region-1", "planet": "earth"}}
    return Node.make(
        raw["name"], raw.get("labels") or {}, declared_features=raw.get("declaredFeatures") or ()
    )


def gates(case: dict[str, Any]) -> FeatureGates:
    return FeatureGates.only(case.get("features") or [])


def allocated_state(case: dict[str, Any]) -> AllocatedState:
    state = AllocatedState()
    for text in case.get("allocatedDevices") or []:
        state.devices.add(parse_device_id(text))
    for text in case.get("allocatedSharedDeviceIDs") or []:
        device_text, _, share_id = text.rpartition("/")
        state.shared.add((*parse_device_id(device_text), share_id))
    for text, amounts in (case.get("allocatedCapacity") or {}).items():
        state.capacity[parse_device_id(text)] = {k: Quantity.parse(str(v)) for k, v in amounts.items()}
    return state


# ---- comparison --------------------------------------------------------------------------------


def _toleration(raw: dict[str, Any]) -> tuple[Any, ...]:
    return (
        raw.get("key", ""),
        raw.get("operator") or "Equal",
        raw.get("value", ""),
        raw.get("effect", ""),
        raw.get("tolerationSeconds"),
    )


def normalise_device(raw: dict[str, Any]) -> dict[str, Any]:
    share = raw.get("shareID")
    if share is not None and share != GENERATED_UUID:
        parsed = uuid.UUID(share)  # raises if the allocator wrote something that is not a UUID
        assert str(parsed) == share, f"share ID {share!r} is not in canonical lower-case form"
        share = GENERATED_UUID
    return {
        "request": raw["request"],
        "driver": raw["driver"],
        "pool": raw["pool"],
        "device": raw["device"],
        "adminAccess": bool(raw.get("adminAccess")),
        "tolerations": [_toleration(t) for t in raw.get("tolerations") or []],
        "bindingConditions": list(raw.get("bindingConditions") or []),
        "bindingFailureConditions": list(raw.get("bindingFailureConditions") or []),
        "shareID": share,
        "skipNodeOperations": list(raw.get("skipNodeOperations") or []),
        "consumedCapacity": {
            k: Quantity.parse(str(v)) for k, v in (raw.get("consumedCapacity") or {}).items()
        },
    }


def _requirements(raw: list[dict[str, Any]] | None) -> list[tuple[Any, ...]]:
    return sorted((r["key"], r["operator"], tuple(sorted(r.get("values") or []))) for r in raw or [])


def normalise_node_selector(raw: dict[str, Any] | None) -> list[Any] | None:
    if raw is None:
        return None
    return sorted(
        (_requirements(t.get("matchFields")), _requirements(t.get("matchExpressions")))
        for t in raw.get("nodeSelectorTerms") or []
    )


def compare_result(expected: dict[str, Any], actual: AllocationResult) -> None:
    got = actual.to_json()
    got_devices = [normalise_device(d) for d in got["devices"]["results"]]
    want_devices = [normalise_device(d) for d in expected.get("devices") or []]
    got_config = got["devices"].get("config") or []
    want_config = expected.get("config") or []
    if expected.get("match") == "exact":
        assert got_devices == want_devices
    else:
        key = repr
        assert sorted(got_devices, key=key) == sorted(want_devices, key=key)
    assert got_config == want_config
    assert normalise_node_selector(got.get("nodeSelector")) == normalise_node_selector(
        expected.get("nodeSelector")
    )
