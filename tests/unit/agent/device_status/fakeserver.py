"""ResourceClaims as the device status writer meets them in an API server: a resourceVersion checked
on every PUT of ``/status`` (409), entries checked against the allocation (422), and switches for
what real servers do: drop ``status.devices`` (the feature gate off), refuse (403), fail for a while."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from dra_api.kubeletapi.model import ClaimRef

GPU = "gpu.nvidia.com"
OTHER = "nic.example.com"
NODE = "node-a"


def api_error(status: int, reason: str, message: str = "") -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "message": message or reason}).encode()
    return exc


def claim(
    name: str,
    *,
    uid: str,
    devices: Sequence[str],
    other: Sequence[str] = (),
    share_ids: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An allocated claim: ``devices`` of the GPU driver on NODE, ``other`` of another driver."""
    results = [
        {"request": "gpu", "driver": GPU, "pool": NODE, "device": d, **_share(d, share_ids)} for d in devices
    ]
    results += [{"request": "nic", "driver": OTHER, "pool": NODE, "device": d} for d in other]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "generation": 1},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                    ]
                },
            }
        },
    }


def _share(device: str, share_ids: Mapping[str, str] | None) -> dict[str, str]:
    share = (share_ids or {}).get(device)
    return {"shareID": share} if share else {}


def _key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (entry["driver"], entry["pool"], entry["device"], entry.get("shareID", ""))


class FakeClaims:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.drop_devices = False
        self.forbid_drivers: set[str] = set()
        self.failures: list[BaseException] = []  # raised by the next calls, GET or PUT
        self.before_put: Callable[[], None] | None = None
        self.gets = 0
        self.puts = 0

    # --- the test's side -----------------------------------------------------------------------
    def add(self, obj: dict[str, Any]) -> None:
        self._store(copy.deepcopy(obj))

    def get_claim(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.objects[("ns", name)])

    def entries(self, name: str) -> list[dict[str, Any]]:
        devices: list[dict[str, Any]] = self.objects[("ns", name)].get("status", {}).get("devices", [])
        return copy.deepcopy(devices)

    def write_entries(self, name: str, entries: list[dict[str, Any]]) -> None:
        """Another writer (another driver's agent) sets the claim's entries."""
        obj = self.objects[("ns", name)]
        obj["status"]["devices"] = copy.deepcopy(entries)
        self._store(obj)

    def read(self, ref: ClaimRef) -> dict[str, Any]:
        """The claim as prepare's own read gets it (the switches are for the status writer's calls)."""
        found = self.objects.get((ref.namespace, ref.name))
        if found is None:
            raise api_error(404, "Not Found")
        return copy.deepcopy(found)

    def delete(self, name: str) -> None:
        del self.objects[("ns", name)]

    def _store(self, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objects[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    # --- ClaimStatusApi ----------------------------------------------------------------------------
    async def get(self, ref: ClaimRef) -> dict[str, Any]:
        self.gets += 1
        if self.failures:
            raise self.failures.pop(0)
        found = self.objects.get((ref.namespace, ref.name))
        if found is None:
            raise api_error(404, "Not Found")
        return copy.deepcopy(found)

    async def replace_status(self, ref: ClaimRef, body: Mapping[str, Any]) -> dict[str, Any]:
        self.puts += 1
        if self.before_put is not None:
            hook, self.before_put = self.before_put, None
            hook()
        if self.failures:
            raise self.failures.pop(0)
        stored = self.objects.get((ref.namespace, ref.name))
        if stored is None:
            raise api_error(404, "Not Found")
        if body["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]:
            raise api_error(409, "Conflict", "the object has been modified")
        status = copy.deepcopy(dict(body.get("status") or {}))
        old = {_key(e): e for e in stored.get("status", {}).get("devices", [])}
        new = {_key(e): e for e in status.get("devices", [])}
        changed = {k[0] for k in old.keys() ^ new.keys()} | {
            k[0] for k in old.keys() & new.keys() if old[k] != new[k]
        }
        if changed & self.forbid_drivers:
            raise api_error(
                403, "Forbidden", 'changing status.devices requires resource="resourceclaims/driver"'
            )
        allocated = {
            _key(r) for r in (stored["status"].get("allocation") or {}).get("devices", {}).get("results", [])
        }
        for key, entry in new.items():
            if key not in allocated:
                raise api_error(422, "Invalid", f"status.devices: {key} is not allocated")
            if len(entry.get("conditions", [])) > 8:
                raise api_error(422, "Invalid", "too many conditions")
        if self.drop_devices:
            status.pop("devices", None)
        updated = copy.deepcopy(stored)
        updated["status"] = status
        self._store(updated)
        return copy.deepcopy(updated)
