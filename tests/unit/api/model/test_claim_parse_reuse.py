"""Parsing a claim reuses what cannot differ: a spec parsed before from the same JSON, and an
allocation the caller already holds whose JSON is exactly the claim's."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_api.model import V1, V1BETA1, AllocationResult, ModelError, ResourceClaim

ALLOCATION: dict[str, Any] = {
    "devices": {
        "results": [
            {
                "request": "gpu",
                "driver": "gpu.nvidia.com",
                "pool": "node-1",
                "device": "gpu-0",
                "consumedCapacity": {"cores": "20"},
            }
        ]
    },
    "nodeSelector": {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
        ]
    },
    "allocationTimestamp": "2026-01-01T00:00:01Z",
}


def _claim(name: str, *, count: Any = 1, allocation: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": V1,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": count}}]}
        },
    }
    if allocation is not None:
        obj["status"] = {"allocation": copy.deepcopy(allocation)}
    return obj


def test_claims_with_the_same_spec_share_one_parsed_spec() -> None:
    a, b = ResourceClaim.from_json(_claim("a")), ResourceClaim.from_json(_claim("b"))
    assert a.spec is b.spec
    assert ResourceClaim.from_json(_claim("c", count=2)).spec.requests[0].exactly.count == 2  # type: ignore[union-attr]


def test_the_spec_cache_tells_apart_what_parsing_tells_apart() -> None:
    with pytest.raises(ModelError, match="count: must be an integer"):
        ResourceClaim.from_json(_claim("a", count=True))
    with pytest.raises(ModelError, match="count: must be an integer"):
        ResourceClaim.from_json(_claim("a", count=1.0))
    # A spec that failed is not kept: it fails again, naming the claim it is in.
    with pytest.raises(ModelError, match="ResourceClaim ns/b"):
        ResourceClaim.from_json(_claim("b", count=True))
    # The same JSON in another API version is parsed by that version's rules.
    beta = _claim("a")
    beta["apiVersion"] = V1BETA1
    with pytest.raises(ModelError, match="v1 field"):
        ResourceClaim.from_json(beta)


def test_a_known_allocation_is_taken_only_when_its_json_is_the_claims() -> None:
    known = AllocationResult.from_json(ALLOCATION)
    same = ResourceClaim.from_json(_claim("a", allocation=ALLOCATION), known_allocation=known)
    assert same.status.allocation is known
    dropped = copy.deepcopy(ALLOCATION)
    del dropped["allocationTimestamp"]  # a server without the gate drops it
    parsed = ResourceClaim.from_json(_claim("a", allocation=dropped), known_allocation=known)
    assert parsed.status.allocation is not known
    assert parsed.status.allocation == AllocationResult.from_json(dropped)
    assert ResourceClaim.from_json(_claim("a"), known_allocation=known).status.allocation is None
