"""Explanations for claims kube-scheduler owns and leaves pending: which claims are waiting, when
one is due, when an explanation is posted (a fake clock throughout), and that nothing but an Event
is written."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

from dra_operator.base.settings import Ownership, Settings
from dra_operator.claims.coordinator import ClaimReconciler
from dra_operator.model.cluster import ClaimKey, ClusterModel
from dra_operator.model.metrics import Metrics
from dra_operator.planner import PlannerPlacer
from dra_operator.reporters.pending import (
    REASON,
    ExplanationLimiter,
    SchedulerClaimExplainer,
    Waiting,
    waiting_claims,
)

from . import helpers as h

CREATED = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC).timestamp()  # the helpers' creationTimestamp
KEY = ClaimKey("ns", "c")


def pod(
    name: str = "p",
    *,
    uid: str = "pod-uid",
    node: str | None = None,
    gated: bool = False,
    claim_name: str | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tpl"}]}
    if claim_name:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    if node:
        spec["nodeName"] = node
    if gated:
        spec["schedulingGates"] = [{"name": "g"}]
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": spec,
        "status": {"phase": phase},
    }


def model_with(*claims: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> ClusterModel:
    model = ClusterModel()
    model.upsert_class(h.gpu_class())
    model.upsert_node(h.node("n1"))
    model.upsert_slice(h.gpu_slice("n1", 2))
    for obj in claims:
        model.upsert_claim(obj)
    for obj in pods if pods is not None else [pod()]:
        model.upsert_pod(obj)
    return model


def waiting(model: ClusterModel, *, now: float, ownership: Ownership = Ownership.STANDALONE) -> list[str]:
    found = waiting_claims(model, ownership=ownership, classes=[h.GPU], now=now, after=30.0)
    return [f"{w.key}<-{w.pod}" for w in found]


# -- which claims are waiting --------------------------------------------------------------------


def test_a_template_claim_waits_once_the_grace_has_passed_while_its_pod_is_unscheduled() -> None:
    model = model_with(h.claim("c", owner_pod=True))
    assert waiting(model, now=CREATED + 29) == []
    assert waiting(model, now=CREATED + 31) == ["ns/c<-p"]


@pytest.mark.parametrize(
    "the_pod",
    [
        pod(node="n1"),  # bound: kube-scheduler is done with it
        pod(gated=True),  # gated: waits by design
        pod(uid="other"),  # a new pod of the same name does not use this claim
        pod(phase="Failed"),
    ],
    ids=["bound", "gated", "other-uid", "finished"],
)
def test_no_explanation_unless_the_pod_waits_for_the_scheduler(the_pod: dict[str, Any]) -> None:
    model = model_with(h.claim("c", owner_pod=True), pods=[the_pod])
    assert waiting(model, now=CREATED + 60) == []


def test_claims_without_a_pod_or_allocated_or_of_other_classes_or_the_operators_own_do_not_wait() -> None:
    model = model_with(
        h.claim("c", owner_pod=True, allocation=h.allocation("n1", "gpu-0")),
        h.claim("other-class", owner_pod=True, cls="other.example.com"),
        h.claim("standalone", owner_pod=False),  # the operator's own: it explains those itself
        pods=[],
    )
    model.upsert_claim(h.claim("orphan", owner_pod=True))  # its pod is gone
    assert waiting(model, now=CREATED + 60) == []


def test_with_ownership_none_a_standalone_claim_waits_for_the_pod_that_names_it() -> None:
    model = model_with(h.claim("standalone"), pods=[pod("user", uid="u1", claim_name="standalone")])
    assert waiting(model, now=CREATED + 60) == []  # standalone ownership: the operator's own claim
    assert waiting(model, now=CREATED + 60, ownership=Ownership.NONE) == ["ns/standalone<-user"]


# -- when one is due, and when it is posted ------------------------------------------------------


def w(uid: str = "uid-c") -> Waiting:
    return Waiting(key=KEY, uid=uid, pod="p", created_at=CREATED)


def test_a_claim_is_looked_at_once_per_interval() -> None:
    limiter = ExplanationLimiter(interval=300, repeat=1800)
    assert limiter.due([w()], now=100) == [w()]
    assert limiter.checked(w(), message="why", now=100)
    assert limiter.due([w()], now=101) == []
    assert limiter.due([w()], now=399) == []
    assert limiter.due([w()], now=400) == [w()]


def test_an_unchanged_explanation_is_posted_again_only_after_the_repeat_period() -> None:
    limiter = ExplanationLimiter(interval=300, repeat=1800)
    assert limiter.checked(w(), message="why", now=0)
    assert not limiter.checked(w(), message="why", now=300)
    assert not limiter.checked(w(), message="why", now=1799)
    assert limiter.checked(w(), message="why", now=1800)
    # A changed explanation goes out at the next look.
    assert limiter.checked(w(), message="why not", now=2100)


def test_a_claim_that_fits_is_not_explained_but_still_waits_an_interval() -> None:
    limiter = ExplanationLimiter(interval=300)
    assert not limiter.checked(w(), message=None, now=0)
    assert limiter.due([w()], now=10) == []
    assert limiter.checked(w(), message="why", now=300)


def test_a_new_claim_of_the_same_name_starts_afresh_and_gone_claims_are_forgotten() -> None:
    limiter = ExplanationLimiter(interval=300)
    assert limiter.checked(w(), message="why", now=0)
    assert limiter.due([w("uid-2")], now=1) == [w("uid-2")]
    assert limiter.checked(w("uid-2"), message="why", now=1)
    limiter.keep_only(set())
    assert len(limiter) == 0


def test_at_most_the_limit_per_pass() -> None:
    limiter = ExplanationLimiter(interval=300)
    many = [Waiting(key=ClaimKey("ns", f"c{i}"), uid=str(i), pod="p", created_at=0) for i in range(5)]
    assert [x.key.name for x in limiter.due(many, now=0, limit=2)] == ["c0", "c1"]


# -- the explainer on a reconciler ---------------------------------------------------------------


class EventsOnlyApi:
    """Records Events; any other write fails the test."""

    api_version = "resource.k8s.io/v1"

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def post_event(self, **event: Any) -> None:
        self.events.append(event)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the explainer called {name}")


def explainer_on(model: ClusterModel, api: EventsOnlyApi) -> SchedulerClaimExplainer:
    reconciler = ClaimReconciler(
        model=model,
        placer=PlannerPlacer(policy="first-fit", prefer_last_devices=True),
        api=api,  # type: ignore[arg-type]  # only post_event is used
        settings=Settings(gpu_class=h.GPU, scheduler_pending_explain_after_s=30),
        metrics=Metrics(),
    )
    return SchedulerClaimExplainer(claims=reconciler)


async def posted(explainer: SchedulerClaimExplainer, *, now: float) -> int:
    events = explainer.claims.events
    runner = asyncio.create_task(events.run(poll=0.001))
    try:
        count = await explainer.sweep(now=now)
        await events.flush(within=5)
    finally:
        runner.cancel()
    return count


async def test_a_claim_asking_too_much_gets_one_warning_event_naming_the_pod_and_why() -> None:
    api = EventsOnlyApi()
    explainer = explainer_on(model_with(h.claim("c", owner_pod=True, count=4)), api)
    assert await posted(explainer, now=CREATED + 10) == 0  # within the grace
    assert await posted(explainer, now=CREATED + 31) == 1
    (event,) = api.events
    assert event["type_"] == "Warning"
    assert event["reason"] == REASON
    assert event["involved"]["name"] == "c"
    assert event["involved"]["uid"] == "uid-c"
    message = event["message"]
    assert "kube-scheduler owns this claim" in message
    assert "pod ns/p" in message
    assert f"wants 4 of class {h.GPU}: 2 match the class" in message
    metrics = explainer.claims.metrics
    assert metrics.registry.get_sample_value("dra_operator_scheduler_claim_explanations_total") == 1
    # Nothing more within the interval, nor after it while the explanation is unchanged.
    assert await posted(explainer, now=CREATED + 60) == 0
    assert await posted(explainer, now=CREATED + 31 + 300) == 0
    assert len(api.events) == 1
    # The cluster changed and with it the explanation: said at the next look.
    explainer.claims.model.upsert_slice(h.gpu_slice("n1", 3, rv="2"))
    assert await posted(explainer, now=CREATED + 31 + 600) == 1
    assert "3 match the class" in api.events[-1]["message"]


async def test_a_claim_that_fits_gets_no_event() -> None:
    api = EventsOnlyApi()
    explainer = explainer_on(model_with(h.claim("c", owner_pod=True, count=2)), api)
    assert await posted(explainer, now=CREATED + 60) == 0
    assert api.events == []


async def test_turned_off_with_a_zero_grace() -> None:
    model = model_with(h.claim("c", owner_pod=True, count=4))
    reconciler = ClaimReconciler(
        model=model,
        placer=PlannerPlacer(),
        api=EventsOnlyApi(),  # type: ignore[arg-type]
        settings=Settings(gpu_class=h.GPU, scheduler_pending_explain_after_s=0),
        metrics=Metrics(),
    )
    assert not SchedulerClaimExplainer(claims=reconciler).enabled
