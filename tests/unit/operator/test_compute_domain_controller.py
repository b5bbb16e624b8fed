"""The ComputeDomain controller's decisions: what it makes for a domain, its status from the
daemons, the order of its clean-up, its limits per namespace, and that a standby writes nothing.

The objects live in an in-memory store keyed by the API paths the real client uses
(``client.computedomains``); the client's requests themselves, and the controller end to end,
run against the real API server in the integration tests.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import pytest

from dra_api import computedomains as cd
from dra_operator.base.settings import Settings
from dra_operator.client import computedomains as paths
from dra_operator.computedomains import desired
from dra_operator.computedomains.controller import ComputeDomainController
from dra_operator.computedomains.reconcile import ApiPaths, Reconciler
from dra_operator.computedomains.state import DomainState
from dra_operator.computedomains.status import DaemonPod, compute
from dra_operator.upkeep.deviceclasses import desired_classes

UID = "0b6a1a1e-2f4c-4d5e-8f90-123456789abc"
OTHER = "7d0c2b3a-1111-4222-8333-444455556666"
DRIVER_NS = "accel-dra"
TENANT = "team-a"
CLIQUE = "6b9e5f0a-1c2d-4e3f-8a7b-9c0d1e2f3a4b.1"
OPTIONS = desired.DaemonOptions(namespace=DRIVER_NS, image="accel-dra:test")


def domain_json(
    uid: str = UID,
    *,
    name: str = "imex",
    namespace: str = TENANT,
    num_nodes: int = 0,
    mode: str = cd.SINGLE,
    template: str = "imex-channel",
    created: str = "2026-11-27T10:00:00Z",
) -> dict[str, Any]:
    return {
        "apiVersion": cd.API_VERSION,
        "kind": cd.DOMAIN_KIND,
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": uid,
            "resourceVersion": "1",
            "creationTimestamp": created,
        },
        "spec": {
            "numNodes": num_nodes,
            "channel": {"resourceClaimTemplate": {"name": template}, "allocationMode": mode},
        },
    }


class Store:
    """The API server's objects by path, with merge patches; records every write."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.labels: dict[str, str] = {}  # node -> domain label

    def _merge(self, target: dict[str, Any], patch: Mapping[str, Any]) -> None:
        for key, value in patch.items():
            if isinstance(value, Mapping) and isinstance(target.get(key), dict):
                self._merge(target[key], value)
            else:
                target[key] = copy.deepcopy(value)

    async def patch_domain(self, *, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.patch(paths.domain_path(namespace, name), body)

    async def patch_domain_status(
        self, *, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        return await self.patch(paths.domain_path(namespace, name), body)

    async def get(self, path: str) -> dict[str, Any] | None:
        obj = self.objects.get(path)
        return copy.deepcopy(obj) if obj is not None else None

    async def create(self, collection: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        path = f"{collection}/{body['metadata']['name']}"
        if path in self.objects:
            return None
        self.writes.append(("create", path))
        self.objects[path] = copy.deepcopy(dict(body))
        return await self.get(path)

    async def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.writes.append(("patch", path))
        self._merge(self.objects[path], body)
        obj = self.objects[path]
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self.objects[path]
        return copy.deepcopy(obj)

    async def put(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        raise AssertionError("not used")

    async def delete(self, path: str, *, uid: str = "") -> bool:
        obj = self.objects.get(path)
        if obj is None:
            return False
        self.writes.append(("delete", path))
        if obj["metadata"].get("finalizers"):
            obj["metadata"]["deletionTimestamp"] = "2026-11-27T11:00:00Z"
        else:
            del self.objects[path]
        return True

    async def list_labelled(self, collection: str, *, label: str, value: str) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for p, o in self.objects.items()
            if p.startswith(collection + "/") and (o["metadata"].get("labels") or {}).get(label) == value
        ]

    async def list_domains(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for o in self.objects.values() if o.get("kind") == cd.DOMAIN_KIND]

    async def remove_node_label(self, *, node: str, value: str) -> bool:
        if self.labels.get(node) != value:
            return False
        self.writes.append(("unlabel", node))
        del self.labels[node]
        return True


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def post(self, *, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.posted.append((type_, reason, message))


class World:
    def __init__(self, *, host_managed: bool = False, max_per_namespace: int = 32) -> None:
        self.store = Store()
        self.state = DomainState()
        self.events = Events()
        self.active = True
        self.controller: ComputeDomainController

        def tell(domain: Any, type_: str, reason: str, message: str) -> None:
            self.controller.tell(domain, type_, reason, message)

        self.reconciler = Reconciler(
            api=self.store,
            paths=ApiPaths(
                template=paths.template_path, daemonset=paths.daemonset_path, clique=paths.clique_path
            ),
            state=self.state,
            options=OPTIONS,
            tell=tell,
            host_managed=host_managed,
            max_per_namespace=max_per_namespace,
        )
        self.controller = ComputeDomainController(
            state=self.state,
            reconciler=self.reconciler,
            api=self.store,
            events=self.events,
            active=lambda: self.active,
        )

    def add(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.store.objects[paths.domain_path(meta["namespace"], meta["name"])] = obj
        self.sync()

    def sync(self) -> None:
        """Feed the store's domains to the state, as the watch would."""
        seen = set()
        for obj in list(self.store.objects.values()):
            if obj.get("kind") == cd.DOMAIN_KIND:
                seen.add(obj["metadata"]["uid"])
                self.controller.domain_event("MODIFIED", copy.deepcopy(obj))
        for uid in set(self.state.domains) - seen:
            gone = self.state.domains[uid]
            self.controller.domain_event(
                "DELETED", {"metadata": {"namespace": gone.namespace, "name": gone.name, "uid": uid}}
            )

    async def reconcile(self, uid: str = UID) -> float | None:
        again = await self.reconciler.reconcile(uid)
        self.sync()
        return again

    def domain(self, name: str = "imex", namespace: str = TENANT) -> dict[str, Any] | None:
        return self.store.objects.get(paths.domain_path(namespace, name))


def pod(node: str, *, ready: bool, clique: str = "", ip: str = "10.0.0.5") -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": DRIVER_NS,
            "name": f"daemon-{node}",
            "labels": {cd.DOMAIN_LABEL: UID, cd.CLIQUE_LABEL: clique},
        },
        "spec": {"nodeName": node},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


# -- what it makes -----------------------------------------------------------------------------------


def test_the_workload_template_asks_for_channel_0_of_the_domain() -> None:
    domain = cd.ComputeDomain.from_json(domain_json(mode=cd.ALL))
    template = desired.workload_template(domain)
    assert template["metadata"]["namespace"] == TENANT
    assert template["metadata"]["name"] == "imex-channel"
    assert template["metadata"]["labels"][cd.TARGET_LABEL] == cd.TARGET_WORKLOAD
    # A template is immutable and its parameters are compared as sent: a finalizer could never be
    # patched away (the integration test deletes a domain through the real API server).
    assert "finalizers" not in template["metadata"]
    devices = template["spec"]["spec"]["devices"]
    assert devices["requests"] == [{"name": "channel", "exactly": {"deviceClassName": cd.CHANNEL_CLASS}}]
    assert devices["config"][0]["opaque"] == {
        "driver": cd.DRIVER,
        "parameters": {
            "apiVersion": cd.API_VERSION,
            "kind": cd.CHANNEL_CONFIG_KIND,
            "domainID": UID,
            "allocationMode": cd.ALL,
        },
    }
    # The hosts run IMEX: every claim gets channel 0 only, as NVIDIA's host-managed mode forces.
    forced = desired.workload_template(domain, host_managed=True)
    assert (
        forced["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["allocationMode"] == cd.SINGLE
    )


def test_the_daemons_run_only_on_nodes_labelled_with_the_domain_whatever_their_taints() -> None:
    domain = cd.ComputeDomain.from_json(domain_json())
    ds = desired.daemonset(domain, options=OPTIONS)
    spec = ds["spec"]["template"]["spec"]
    assert ds["metadata"]["namespace"] == DRIVER_NS
    assert ds["metadata"]["name"] == cd.daemon_name(UID)
    assert spec["nodeSelector"] == {cd.DOMAIN_LABEL: UID}
    assert {t["effect"] for t in spec["tolerations"]} == {"NoSchedule", "NoExecute", "PreferNoSchedule"}
    assert spec["resourceClaims"] == [
        {"name": desired.DAEMON_CLAIM, "resourceClaimTemplateName": cd.daemon_name(UID)}
    ]
    template = desired.daemon_template(domain, options=OPTIONS)
    assert template["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["kind"] == (
        cd.DAEMON_CONFIG_KIND
    )


def test_daemon_overrides_take_only_what_is_listed() -> None:
    with pytest.raises(desired.OverridesError, match="'hostNetwork' is not one of"):
        desired.check_overrides({"hostNetwork": True}, where="overrides")
    kept = desired.check_overrides({"priorityClassName": "system-node-critical"}, where="overrides")
    domain = cd.ComputeDomain.from_json(domain_json())
    options = desired.DaemonOptions(namespace=DRIVER_NS, image="i", overrides=kept)
    assert desired.daemonset(domain, options=options)["spec"]["template"]["spec"]["priorityClassName"] == (
        "system-node-critical"
    )


def test_the_device_classes_are_nvidias() -> None:
    classes = desired_classes(Settings(compute_domains=True))
    channel = classes[cd.CHANNEL_CLASS]["spec"]["selectors"][0]["cel"]["expression"]
    assert 'type == "channel"' in channel
    assert "id == 0" in channel
    assert cd.DAEMON_CLASS in classes
    host = desired_classes(Settings(compute_domains=True, compute_domain_imex_mode="hostManaged"))
    assert cd.CHANNEL_CLASS in host
    assert cd.DAEMON_CLASS not in host
    assert cd.CHANNEL_CLASS not in desired_classes(Settings())


# -- status ------------------------------------------------------------------------------------------


def test_status_is_ready_once_enough_nodes_joined_and_none_is_not_ready() -> None:
    domain = cd.ComputeDomain.from_json(domain_json(num_nodes=2))
    joined = cd.DomainNode(name="n1", ip_address="10.0.0.1", clique_id=CLIQUE, index=0, status=cd.READY)
    clique = cd.Clique(namespace=DRIVER_NS, name="c", domain_uid=UID, clique_id=CLIQUE, daemons=(joined,))
    pods = [DaemonPod.from_json(pod("n1", ready=True, clique=CLIQUE))]
    one = compute(domain, cliques=[clique], pods=[p for p in pods if p])
    assert one.status == cd.NOT_READY  # 1 of numNodes 2
    # A node without fabric counts through its pod's readiness.
    pods.append(DaemonPod.from_json(pod("n2", ready=True, ip="10.0.0.2")))
    two = compute(domain, cliques=[clique], pods=[p for p in pods if p])
    assert [n.name for n in two.nodes] == ["n1", "n2"]
    assert two.status == cd.READY
    pods[1] = DaemonPod.from_json(pod("n2", ready=False, ip="10.0.0.2"))
    assert compute(domain, cliques=[clique], pods=[p for p in pods if p]).status == cd.NOT_READY
    # A clique's daemon whose pod is gone is left out.
    gone = compute(domain, cliques=[clique], pods=[])
    assert gone.nodes == ()


# -- a domain's life ---------------------------------------------------------------------------------


async def test_a_new_domain_gets_its_finalizer_templates_daemonset_and_status() -> None:
    world = World()
    world.add(domain_json(num_nodes=1))
    await world.reconcile()
    obj = world.domain()
    assert obj is not None
    assert obj["metadata"]["finalizers"] == [cd.FINALIZER]
    assert paths.template_path(TENANT, "imex-channel") in world.store.objects
    assert paths.template_path(DRIVER_NS, cd.daemon_name(UID)) in world.store.objects
    assert paths.daemonset_path(DRIVER_NS, cd.daemon_name(UID)) in world.store.objects
    assert obj["status"] == {"status": cd.NOT_READY, "nodes": []}  # written on the first pass
    # A second pass changes nothing.
    writes = len(world.store.writes)
    await world.reconcile()
    assert len(world.store.writes) == writes
    # A daemon on a node without fabric is ready: one node of numNodes 1 joined.
    world.controller.pod_event("ADDED", pod("n1", ready=True))
    await world.reconcile()
    obj = world.domain()
    assert obj is not None
    assert obj["status"]["status"] == cd.READY
    assert [n["name"] for n in obj["status"]["nodes"]] == ["n1"]


async def test_with_host_managed_imex_no_daemons_are_made_and_the_domain_is_ready() -> None:
    world = World(host_managed=True)
    world.add(domain_json(num_nodes=4))
    await world.reconcile()
    assert paths.daemonset_path(DRIVER_NS, cd.daemon_name(UID)) not in world.store.objects
    assert paths.template_path(TENANT, "imex-channel") in world.store.objects
    obj = world.domain()
    assert obj is not None
    assert obj["status"]["status"] == cd.READY


async def test_a_template_name_someone_else_holds_is_not_taken_over() -> None:
    world = World()
    theirs = {"metadata": {"namespace": TENANT, "name": "imex-channel", "labels": {"app": "theirs"}}}
    world.store.objects[paths.template_path(TENANT, "imex-channel")] = theirs
    world.add(domain_json())
    await world.reconcile()
    assert world.store.objects[paths.template_path(TENANT, "imex-channel")] == theirs
    assert any(reason == "ResourceClaimTemplateTaken" for _, reason, _ in world.events.posted)


async def test_a_namespace_gets_at_most_its_limit_of_domains_the_oldest_first() -> None:
    world = World(max_per_namespace=1)
    world.add(domain_json(UID, name="old", template="old", created="2026-11-27T09:00:00Z"))
    world.add(domain_json(OTHER, name="new", template="new", created="2026-11-27T10:00:00Z"))
    await world.reconcile(OTHER)
    assert paths.daemonset_path(DRIVER_NS, cd.daemon_name(OTHER)) not in world.store.objects
    assert any(reason == "TooManyComputeDomains" for _, reason, _ in world.events.posted)
    await world.reconcile(UID)
    assert paths.daemonset_path(DRIVER_NS, cd.daemon_name(UID)) in world.store.objects


async def test_deletion_keeps_the_daemons_while_a_node_holds_a_channel_then_removes_all_in_order() -> None:
    world = World()
    world.add(domain_json())
    await world.reconcile()
    world.controller.node_event("MODIFIED", {"metadata": {"name": "n1", "labels": {cd.DOMAIN_LABEL: UID}}})
    clique = {
        "metadata": {
            "namespace": DRIVER_NS,
            "name": cd.clique_name(UID, CLIQUE),
            "labels": {cd.DOMAIN_LABEL: UID, cd.CLIQUE_LABEL: CLIQUE},
        },
        "daemons": [],
    }
    world.store.objects[paths.clique_path(DRIVER_NS, cd.clique_name(UID, CLIQUE))] = clique
    obj = world.domain()
    assert obj is not None
    obj["metadata"]["deletionTimestamp"] = "2026-11-27T11:00:00Z"
    world.sync()

    assert await world.reconcile() is not None  # waits for the workload
    assert paths.template_path(TENANT, "imex-channel") not in world.store.objects  # no new pod joins
    assert paths.daemonset_path(DRIVER_NS, cd.daemon_name(UID)) in world.store.objects
    assert world.domain() is not None

    world.controller.node_event("MODIFIED", {"metadata": {"name": "n1", "labels": {}}})
    await world.reconcile()
    assert paths.daemonset_path(DRIVER_NS, cd.daemon_name(UID)) not in world.store.objects
    assert paths.template_path(DRIVER_NS, cd.daemon_name(UID)) not in world.store.objects
    assert paths.clique_path(DRIVER_NS, cd.clique_name(UID, CLIQUE)) not in world.store.objects
    assert world.domain() is None  # the finalizer went last, and with it the domain
    assert world.store.writes[-1] == ("patch", paths.domain_path(TENANT, "imex"))


async def test_the_sweep_removes_labels_of_domains_that_no_longer_exist() -> None:
    world = World()
    world.add(domain_json())
    world.store.labels = {"n1": UID, "n2": OTHER}
    for node, value in world.store.labels.items():
        world.controller.node_event(
            "MODIFIED", {"metadata": {"name": node, "labels": {cd.DOMAIN_LABEL: value}}}
        )
    assert await world.controller.sweep_labels() == 1
    assert world.store.labels == {"n1": UID}


async def test_a_standby_writes_nothing_and_a_takeover_reconciles_every_domain() -> None:
    world = World()
    world.active = False
    world.add(domain_json())
    runner = asyncio.create_task(world.controller.run())
    try:
        await asyncio.sleep(0.2)
        assert world.store.writes == []
        world.active = True
        for _ in range(100):
            if paths.daemonset_path(DRIVER_NS, cd.daemon_name(UID)) in world.store.objects:
                break
            await asyncio.sleep(0.05)
        assert paths.daemonset_path(DRIVER_NS, cd.daemon_name(UID)) in world.store.objects
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
