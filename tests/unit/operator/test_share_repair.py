"""Shares two allocators wrote at once past a device's capacity, and a whole device both wrote: the
operator gives its own copy up (if no pod uses it yet), says so on its claim without naming the
other tenants' claims, and places its claim again."""

from __future__ import annotations

from typing import Any

from dra_api.model import ResourceClaim
from dra_api.names import OPERATOR_FINALIZER
from dra_operator.claims.release import ClaimReleaser
from dra_operator.model.cluster import ClaimKey, ClusterModel
from dra_operator.model.metrics import Metrics

from . import helpers as h


class Recorder:
    """The releaser's writer, event sink, queue and API, recording what it was asked."""

    api_version = "v1"

    def __init__(self) -> None:
        self.cleared: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.marked: list[ClaimKey] = []

    async def clear_allocation(self, claim: ResourceClaim) -> ResourceClaim | None:
        self.cleared.append(claim.name)
        return claim

    def post(self, **event: Any) -> None:
        self.events.append(event)

    def mark(self, key: ClaimKey) -> None:
        self.marked.append(key)


def share(name: str, namespace: str, memory: str, *, ours: bool, rv: str) -> dict[str, Any]:
    raw = h.allocation("n1", "gpu-0")
    raw["devices"]["results"][0]["shareID"] = f"0b8e0c52-5d7d-4c6e-9a51-3c2f1e0d9a0{rv}"
    raw["devices"]["results"][0]["consumedCapacity"] = {"memory": memory}
    return h.claim(
        name, namespace=namespace, rv=rv, allocation=raw, finalizers=[OPERATOR_FINALIZER] if ours else []
    )


def share_model(ours_memory: str) -> ClusterModel:
    """One 80Gi GPU holding kube-scheduler's 50Gi share (team-a) and the operator's (team-b)."""
    model = ClusterModel()
    shared = h.gpu_slice("n1", 1)
    shared["spec"]["devices"][0]["allowMultipleAllocations"] = True
    shared["spec"]["devices"][0]["capacity"] = {"memory": {"value": "80Gi"}}
    model.upsert_slice(shared)
    model.upsert_claim(share("pods-share", "team-a", "50Gi", ours=False, rv="1"))
    model.upsert_claim(share("standalone", "team-b", ours_memory, ours=True, rv="2"))
    return model


def releaser(model: ClusterModel, recorder: Recorder) -> ClaimReleaser:
    async def refetch(key: ClaimKey) -> None:
        raise AssertionError(f"no refetch expected for {key}")

    return ClaimReleaser(
        model=model,
        api=recorder,  # type: ignore[arg-type]
        metrics=Metrics(),
        events=recorder,  # type: ignore[arg-type]
        writer=recorder,  # type: ignore[arg-type]
        queue=recorder,  # type: ignore[arg-type]
        refetch=refetch,
    )


async def test_the_operator_gives_up_its_share_of_an_overbooked_device() -> None:
    recorder = Recorder()
    await releaser(share_model("50Gi"), recorder).repair_double_bookings()
    assert recorder.cleared == ["standalone"]
    assert recorder.marked == [ClaimKey("team-b", "standalone")]
    (event,) = recorder.events
    assert event["reason"] == "DeviceConflict"
    assert event["type_"] == "Warning"
    assert "this claim's share and those of 1 other claim(s)" in event["message"]
    assert "team-a" not in event["message"]
    assert "pods-share" not in event["message"]


async def test_shares_within_the_capacity_are_left_alone() -> None:
    recorder = Recorder()
    await releaser(share_model("30Gi"), recorder).repair_double_bookings()
    assert (recorder.cleared, recorder.events, recorder.marked) == ([], [], [])


async def test_a_share_a_pod_already_uses_is_never_pulled_from_under_it() -> None:
    model = share_model("50Gi")
    used = share("standalone", "team-b", "50Gi", ours=True, rv="3")
    used["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-uid"}]
    model.upsert_claim(used)
    recorder = Recorder()
    await releaser(model, recorder).repair_double_bookings()
    # kube-scheduler's share is not ours to give up; ours runs: both stay, nothing is said.
    assert (recorder.cleared, recorder.events, recorder.marked) == ([], [], [])


async def test_a_whole_device_both_allocators_wrote_is_given_up_without_naming_the_other_claim() -> None:
    model = ClusterModel()
    model.upsert_slice(h.gpu_slice("n1", 1))
    model.upsert_claim(
        h.claim("pods-claim", namespace="team-a", rv="1", allocation=h.allocation("n1", "gpu-0"))
    )
    model.upsert_claim(
        h.claim(
            "standalone",
            namespace="team-b",
            rv="2",
            allocation=h.allocation("n1", "gpu-0"),
            finalizers=[OPERATOR_FINALIZER],
        )
    )
    recorder = Recorder()
    await releaser(model, recorder).repair_double_bookings()
    assert recorder.cleared == ["standalone"]
    (event,) = recorder.events
    assert "was also allocated to 1 other claim(s) by another allocator" in event["message"]
    assert "team-a" not in event["message"]
    assert "pods-claim" not in event["message"]
