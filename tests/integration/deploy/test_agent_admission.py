"""What a node agent's credentials can write, tried on the real API server with the agent's real kind
of token (bound to a pod on node A), one test per rule: the write the agent needs passes, the one an
attacker holding node A would try is refused.

The install is the simulated overlay under a user's kustomization that moves it to another
namespace and prefixes its names (`namespace:` and `namePrefix:`), the change that used to switch
the ResourceSlice policy off without a word: the rules must hold as shipped there too. Only the
node agent's ServiceAccount, roles and policies are applied; no pod runs.

Claim status is checked twice on Kubernetes 1.36+, where the API server refuses what the policy
would before the policy runs: as installed (the server's own message), and with the agent's RBAC
widened to what a careless administrator might grant (resourceclaims/binding and
`arbitrary-node:update` for every driver), where only the policy stands in the way. On 1.34 and
1.35 the policy is the only check, and both runs meet it.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_devcluster import LocalCluster
from tests.integration.deploy.agentwrites import (
    SERVER_BINDING,
    SERVER_DEVICES,
    Obj,
    allocated_claim,
    as_agent,
    device_entry,
    node_selector,
    pod_bound_kubeconfig,
    probe_pod,
    resource_slice,
    server_checks_claim_status,
    unbound_kubeconfig,
    with_status,
    write_status,
)
from tests.unit.deploy.render import overlay_dir, render

pytestmark = pytest.mark.cluster

INSTALL_NS = "accel-dra-renamed"
PREFIX = "renamed-"
ACCOUNT = f"{PREFIX}accel-dra-node-agent"
SLICE_POLICY = f"{PREFIX}accel-dra-resourceslices-own-node"
CLAIM_POLICY = f"{PREFIX}accel-dra-resourceclaims-own-node"
NODE_A = "adm-node-a"
NODE_B = "adm-node-b"
TENANT = "adm-tenant"
GPU = "gpu.nvidia.com"
OTHER = "nic.example.com"
PROBE_POD = "agent-token-probe"
WIDENED = f"{PREFIX}test-widened-claim-status"
# An identity the policies match (its name contains the agent's) with every claim status right,
# unbound: what the policies alone make of a write, used to know when they are in effect.
READINESS = f"{PREFIX}accel-dra-node-agent-readiness"
KINDS = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


@dataclass
class Agent:
    cluster: LocalCluster
    kubeconfig: Path  # bound to a pod on NODE_A
    unbound: Path
    objects: list[Obj]

    def write(self, claim: Obj, *, kubeconfig: Path | None = None) -> Any:
        return write_status(self.cluster, kubeconfig or self.kubeconfig, claim)

    def slice(self, obj: Obj) -> Any:
        return as_agent(self.cluster, self.kubeconfig, "create", "-f", "-", input=json.dumps(obj))


def _agent_objects(tmp_path: Path, kubectl: Path) -> list[Obj]:
    """The node agent's identity, roles and policies from the renamed, renamespaced install."""
    # kustomize takes a base only by a relative path.
    base = os.path.relpath(overlay_dir("simulated"), tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"namespace: {INSTALL_NS}\nnamePrefix: {PREFIX}\nresources:\n  - {base}\n"
    )
    objs = [o for o in render(tmp_path, kubectl=kubectl) if o["kind"] in KINDS]
    agent = [
        o
        for o in objs
        if o["kind"] == "Namespace"
        or o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "node-agent"
    ]
    assert {o["metadata"]["name"] for o in agent if o["kind"] == "ServiceAccount"} == {ACCOUNT}
    return agent


def _readiness_identity() -> list[Obj]:
    rules = [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["create"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/status", "resourceclaims/binding"],
            "verbs": ["update"],
        },
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/driver"],
            "verbs": ["arbitrary-node:update"],
        },
    ]
    return [
        *_role_for(READINESS, rules, account=READINESS),
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": READINESS, "namespace": INSTALL_NS},
        },
    ]


def _role_for(name: str, rules: list[Obj], *, account: str) -> list[Obj]:
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": INSTALL_NS}],
        },
    ]


def _wait_policies_in_effect(cluster: LocalCluster, claim: Obj) -> None:
    """A new policy takes effect shortly after it is created: wait until both refuse the unbound
    readiness identity (server-side dry runs; nothing is written)."""
    who = f"--as=system:serviceaccount:{INSTALL_NS}:{READINESS}"
    tries: list[tuple[str, list[str], str]] = [
        (SLICE_POLICY, ["create", "-f", "-"], json.dumps(resource_slice("adm-readiness", node=NODE_A))),
        (CLAIM_POLICY, ["replace", "--subresource=status", "-f", "-"], json.dumps(claim)),
    ]
    for policy, args, body in tries:
        cluster.wait_for(
            lambda args=args, body=body, policy=policy: (
                f"ValidatingAdmissionPolicy '{policy}'"
                in cluster.kubectl(who, "--dry-run=server", *args, input=body, check=False).stderr
            ),
            timeout=30,
            interval=0.5,
            what=f"policy {policy} in effect",
        )


@pytest.fixture(scope="module")
def agent(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    cluster = local_cluster
    assert cluster.binaries is not None
    objects = _agent_objects(tmp_path_factory.mktemp("renamed"), cluster.binaries.kubectl)
    for node in (NODE_A, NODE_B):
        cluster.add_node(node)
    cluster.create_namespace(TENANT)
    extra = _readiness_identity()
    try:
        cluster.apply(objects + extra)
        cluster.apply([probe_pod(name=PROBE_POD, namespace=INSTALL_NS, account=ACCOUNT, node=NODE_A)])
        kubeconfig = pod_bound_kubeconfig(
            cluster, account=ACCOUNT, namespace=INSTALL_NS, pod=PROBE_POD, name="renamed-agent-on-a"
        )
        unbound = unbound_kubeconfig(cluster, account=ACCOUNT, namespace=INSTALL_NS, name="renamed-agent")
        probe = allocated_claim(
            cluster,
            namespace=TENANT,
            name="readiness",
            results=[("gpu", GPU, NODE_B, "gpu-0")],
            selector=node_selector(NODE_B),
        )
        _wait_policies_in_effect(cluster, probe)
        yield Agent(cluster=cluster, kubeconfig=kubeconfig, unbound=unbound, objects=objects)
    finally:
        # Pods bound to nodes without a kubelet never finish terminating on their own.
        cluster.kubectl("delete", "pods", "--all", "-n", TENANT, "--force", "--grace-period=0",
                        "--ignore-not-found", check=False)  # fmt: skip
        cluster.kubectl("delete", "namespace", TENANT, "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl(
            "delete",
            "pods",
            "--all",
            "-n",
            INSTALL_NS,
            "--force",
            "--grace-period=0",
            "--ignore-not-found",
            check=False,
        )
        cluster.kubectl(
            "delete",
            "-f",
            "-",
            "--ignore-not-found",
            "--wait=false",
            check=False,
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects + extra}),
        )
        cluster.kubectl(
            "delete", "resourceslices", "-l", "accel-dra-test=deploy", "--ignore-not-found", check=False
        )
        for node in (NODE_A, NODE_B):
            cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture(params=["as-installed", "rbac-widened"])
def rbac(request: pytest.FixtureRequest, agent: Agent) -> Iterator[str]:
    """As installed, or with the claim status rights a careless administrator might add."""
    widened = _role_for(
        WIDENED,
        [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/binding"], "verbs": ["update"]},
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims/driver"],
                "verbs": ["arbitrary-node:update"],
            },
        ],
        account=ACCOUNT,
    )
    if request.param == "rbac-widened":
        agent.cluster.apply(widened)
        # RBAC takes effect once the API server's informer has it: the widened verb is allowed.
        agent.cluster.wait_for(
            lambda: _can(agent, "update", "resourceclaims/binding"),
            timeout=30,
            what="the widened role in effect",
        )
    try:
        yield str(request.param)
    finally:
        if request.param == "rbac-widened":
            agent.cluster.kubectl(
                "delete",
                "-f",
                "-",
                "--ignore-not-found",
                check=False,
                input=json.dumps({"apiVersion": "v1", "kind": "List", "items": widened}),
            )
            agent.cluster.wait_for(
                lambda: not _can(agent, "update", "resourceclaims/binding"),
                timeout=30,
                what="the widened role gone",
            )


def _can(agent: Agent, verb: str, resource: str) -> bool:
    plural, _, subresource = resource.partition("/")
    args = ["auth", "can-i", verb, plural, f"--subresource={subresource}", "-n", TENANT]
    answer = as_agent(agent.cluster, agent.kubeconfig, *args)
    return answer.stdout.strip() == "yes"


def _refused(agent: Agent, rbac: str, result: Any, *, policy: str, server: str) -> None:
    """Refused, by the policy or (1.36+, as installed) by the API server's own check first."""
    assert result.returncode != 0, "the write went through"
    if rbac == "as-installed" and server_checks_claim_status(agent.cluster):
        assert server in result.stderr, result.stderr
    else:
        assert f"ValidatingAdmissionPolicy '{CLAIM_POLICY}'" in result.stderr, result.stderr
        assert policy in result.stderr, result.stderr


def _claim(
    agent: Agent,
    name: str,
    *,
    node: str,
    other: bool = False,
    other_entry: bool = True,
    selector: Obj | None = None,
) -> Obj:
    """A fresh claim with a GPU of ``node`` (and a device of another driver, with that driver's
    status entry), allocated there (or with ``selector``)."""
    agent.cluster.kubectl("delete", "resourceclaim", name, "-n", TENANT, "--ignore-not-found", check=False)
    results = [("gpu", GPU, node, "gpu-0")] + ([("nic", OTHER, node, "nic-0")] if other else [])
    devices = [device_entry(OTHER, node, "nic-0")] if other and other_entry else []
    return allocated_claim(
        agent.cluster,
        namespace=TENANT,
        name=name,
        results=results,
        selector=selector or node_selector(node),
        devices=devices,
    )


def _own_entry(claim: Obj, *, ready: str = "True") -> Obj:
    """The claim with the agent's GPU entry set, every other entry kept: the agent's own write."""
    pool = claim["status"]["allocation"]["devices"]["results"][0]["pool"]
    others = [d for d in claim["status"].get("devices", []) if d["driver"] != GPU]
    return with_status(claim, devices=[*others, device_entry(GPU, pool, "gpu-0", ready=ready)])


def test_agent_writes_status_only_of_claims_allocated_to_its_node(agent: Agent, rbac: str) -> None:
    mine = _claim(agent, "on-a", node=NODE_A)
    written = agent.write(_own_entry(mine))
    assert written.returncode == 0, written.stderr
    stored = agent.cluster.get_json("resourceclaim", "on-a", "-n", TENANT)
    assert [d["driver"] for d in stored["status"]["devices"]] == [GPU]

    elsewhere = _claim(agent, "on-b", node=NODE_B)
    _refused(
        agent,
        rbac,
        agent.write(_own_entry(elsewhere)),
        server=SERVER_DEVICES,
        policy=f'status update of ResourceClaim {TENANT}/on-b denied: it is allocated to node "{NODE_B}"',
    )
    # Usable on several nodes (a selector of two terms): no single node, no agent's claim.
    both = {
        "nodeSelectorTerms": [
            *node_selector(NODE_A)["nodeSelectorTerms"],
            *node_selector(NODE_B)["nodeSelectorTerms"],
        ]
    }
    shared = _claim(agent, "on-a-or-b", node=NODE_A, selector=both)
    _refused(
        agent,
        rbac,
        agent.write(_own_entry(shared)),
        server=SERVER_DEVICES,
        policy="it is not allocated to a single node",
    )
    assert "devices" not in agent.cluster.get_json("resourceclaim", "on-b", "-n", TENANT)["status"]


def test_agent_never_changes_allocation_or_reservations(agent: Agent, rbac: str) -> None:
    claim = _claim(agent, "held", node=NODE_A)
    # A pod that exists, or kube-controller-manager drops its reservation.
    agent.cluster.apply([probe_pod(name="user", namespace=TENANT, account="default", node=NODE_A)])
    user = agent.cluster.get_json("pod", "user", "-n", TENANT)
    reserved = [{"resource": "pods", "name": "user", "uid": user["metadata"]["uid"]}]
    agent.cluster.kubectl(
        "replace",
        "--subresource=status",
        "-f",
        "-",
        input=json.dumps(with_status(claim, reservedFor=reserved)),
    )
    claim = agent.cluster.get_json("resourceclaim", "held", "-n", TENANT)
    # The write it needs leaves both as they were.
    written = agent.write(_own_entry(claim))
    assert written.returncode == 0, written.stderr
    current = agent.cluster.get_json("resourceclaim", "held", "-n", TENANT)
    # (Changing an allocation in place is refused by the API server's validation on every release;
    # dropping it, to allocate again elsewhere, is the attacker's way.)
    attempts: dict[str, Obj] = {
        "reserve it for another pod": with_status(
            current, reservedFor=[*reserved, {"resource": "pods", "name": "thief", "uid": "uid-of-thief"}]
        ),
        "detach its pod": with_status(current, reservedFor=None),
        "drop the allocation": with_status(current, allocation=None, devices=None, reservedFor=None),
    }
    for what, changed in attempts.items():
        result = agent.write(changed)
        _refused(
            agent,
            rbac,
            result,
            server=SERVER_BINDING,
            policy="it changes status.allocation or status.reservedFor",
        )
        stored = agent.cluster.get_json("resourceclaim", "held", "-n", TENANT)["status"]
        assert (stored["allocation"], stored["reservedFor"]) == (current["status"]["allocation"], reserved), (
            what
        )


def test_agent_touches_only_its_own_drivers_entries(agent: Agent, rbac: str) -> None:
    claim = _claim(agent, "mixed", node=NODE_A, other=True)
    # Its own entry added, the other driver's kept as it was.
    written = agent.write(_own_entry(claim))
    assert written.returncode == 0, written.stderr
    current = agent.cluster.get_json("resourceclaim", "mixed", "-n", TENANT)
    foreign = next(d for d in current["status"]["devices"] if d["driver"] == OTHER)
    mine = next(d for d in current["status"]["devices"] if d["driver"] == GPU)
    changed = copy.deepcopy(foreign)
    changed["conditions"][0]["status"] = "False"
    message = "it adds, changes or removes status.devices entries of drivers other than the agent's"
    for what, devices in {
        "change it": [changed, mine],
        "remove it": [mine],
    }.items():
        result = agent.write(with_status(current, devices=devices))
        _refused(agent, rbac, result, server=SERVER_DEVICES, policy=message)
        stored = agent.cluster.get_json("resourceclaim", "mixed", "-n", TENANT)["status"]["devices"]
        assert next(d for d in stored if d["driver"] == OTHER) == foreign, what
    # Adding one: a claim whose other-driver device has no entry yet.
    fresh = _claim(agent, "mixed", node=NODE_A, other=True, other_entry=False)
    forged = with_status(fresh, devices=[device_entry(OTHER, NODE_A, "nic-0")])
    _refused(agent, rbac, agent.write(forged), server=SERVER_DEVICES, policy=message)


def test_an_unbound_agent_token_writes_no_claim_status(agent: Agent, rbac: str) -> None:
    claim = _claim(agent, "unbound", node=NODE_A)
    result = agent.write(_own_entry(claim), kubeconfig=agent.unbound)
    _refused(
        agent,
        rbac,
        result,
        server=SERVER_DEVICES,
        policy="the caller's token is not bound to a pod on a node",
    )
    # The same write with the bound token passes: it is the token, not the write.
    written = agent.write(_own_entry(claim))
    assert written.returncode == 0, written.stderr


def test_agent_writes_only_its_own_pool_and_drivers_slices(agent: Agent) -> None:
    own = agent.slice(resource_slice(f"{NODE_A}-own", node=NODE_A))
    assert own.returncode == 0, own.stderr
    refused = {
        "another node's slice": (
            resource_slice(f"{NODE_B}-gpu", node=NODE_B),
            f'it belongs to node "{NODE_B}"',
        ),
        "another driver's slice": (
            resource_slice(f"{NODE_A}-nic", node=NODE_A, driver=OTHER),
            f'its driver "{OTHER}" is not one of the agent\'s (gpu.nvidia.com, tpu.google.com)',
        ),
        "a pool not named after the node": (
            resource_slice(f"{NODE_A}-pool", node=NODE_A, pool="shared-pool"),
            'its pool "shared-pool" is not named after the node',
        ),
    }
    for what, (obj, message) in refused.items():
        result = agent.slice(obj)
        assert result.returncode != 0, what
        assert f"ValidatingAdmissionPolicy '{SLICE_POLICY}'" in result.stderr, result.stderr
        said = f"on node {NODE_A}: CREATE of ResourceSlice {obj['metadata']['name']} denied: {message}"
        assert said in result.stderr, result.stderr
    # Its own slice, deleted again: allowed.
    deleted = as_agent(agent.cluster, agent.kubeconfig, "delete", "resourceslice", f"{NODE_A}-own")
    assert deleted.returncode == 0, deleted.stderr
