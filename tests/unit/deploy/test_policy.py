"""The node agent's admission policies must match the identity the agent really runs as, however the
install is named and namespaced, and name exactly the agent's drivers.

NVIDIA's chart shipped a policy that matched a different ServiceAccount than its DaemonSet used, so
the per-node restriction never applied; and a policy naming `system:serviceaccount:<ns>:<sa>` stops
matching as soon as a kustomize `namespace:` override moves the account. These checks derive the
expected identity from each render, including a namespaced and prefixed kustomization and a Helm
release in another namespace under another name.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from dra_api.names import GPU_DRIVER, TPU_DRIVER
from tests.unit.deploy.helm_render import helm_template
from tests.unit.deploy.render import OVERLAYS, Obj, of_kind, one, overlay_dir, render

SLICE_POLICY = "accel-dra-resourceslices-own-node"
CLAIM_POLICY = "accel-dra-resourceclaims-own-node"
POLICIES = (SLICE_POLICY, CLAIM_POLICY)
NODE_NAME_EXTRA = 'request.userInfo.extra[?"authentication.kubernetes.io/node-name"]'
_MATCH = re.compile(
    r'request\.userInfo\.username\.startsWith\("system:serviceaccount:"\) &&\s*'
    r'request\.userInfo\.username\.split\(":"\)\.size\(\) == 4 &&\s*'
    r'request\.userInfo\.username\.split\(":"\)\[3\]\.contains\("(?P<name>[a-z0-9.-]+)"\)'
)


def _matched_name_part(policy: Obj) -> str:
    """The string a ServiceAccount's name must contain for the policy to apply to it."""
    (condition,) = policy["spec"]["matchConditions"]
    found = _MATCH.fullmatch(condition["expression"].strip())
    assert found, f"unexpected match condition: {condition['expression']!r}"
    return found.group("name")


def _policy_applies_to(policy: Obj, username: str) -> bool:
    """The match condition, evaluated as CEL would for ``username``."""
    parts = username.split(":")
    return (
        username.startswith("system:serviceaccount:")
        and len(parts) == 4
        and _matched_name_part(policy) in parts[3]
    )


def _drivers(policy: Obj) -> list[str]:
    (variable,) = [v for v in policy["spec"]["variables"] if v["name"] == "drivers"]
    drivers: list[str] = json.loads(variable["expression"].strip().strip("'"))
    return drivers


def _agent_username(objs: list[Obj]) -> str:
    (daemonset,) = of_kind(objs, "DaemonSet")
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    return f"system:serviceaccount:{daemonset['metadata']['namespace']}:{account}"


def _assert_policies_hold(objs: list[Obj], *, drivers: list[str], prefix: str = "accel-dra") -> None:
    username = _agent_username(objs)
    role_drivers = {
        name
        for role in of_kind(objs, "ClusterRole")
        for rule in role["rules"]
        if "resourceclaims/driver" in rule["resources"]
        for name in rule.get("resourceNames", [])
    }
    for base in POLICIES:
        name = base.replace("accel-dra", prefix, 1)
        policy = one(objs, "ValidatingAdmissionPolicy", name)
        assert _policy_applies_to(policy, username), f"{name} does not apply to the agent {username}"
        for stranger in ("system:serviceaccount:team-a:default", "system:node:node-a", "kubernetes-admin"):
            assert not _policy_applies_to(policy, stranger), f"{name} applies to {stranger}"
        assert _drivers(policy) == drivers, name
        assert set(drivers) == role_drivers, f"{name}: the policy's drivers are not the role's"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_policies_match_the_daemonsets_service_account(rendered: dict[str, list[Obj]], overlay: str) -> None:
    _assert_policies_hold(rendered[overlay], drivers=[GPU_DRIVER, TPU_DRIVER])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_policies_are_bound_deny_and_cover_all_writes(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    expected = {
        SLICE_POLICY: ("resourceslices", {"CREATE", "UPDATE", "DELETE"}),
        CLAIM_POLICY: ("resourceclaims/status", {"UPDATE"}),
    }
    for name, (resource, operations) in expected.items():
        spec = one(objs, "ValidatingAdmissionPolicy", name)["spec"]
        assert spec["failurePolicy"] == "Fail"
        (rule,) = spec["matchConstraints"]["resourceRules"]
        assert rule["apiGroups"] == ["resource.k8s.io"]
        assert rule["resources"] == [resource]
        assert set(rule["operations"]) == operations
        assert rule["apiVersions"] == ["*"]
        assert spec["matchConstraints"].get("matchPolicy", "Equivalent") == "Equivalent"
        text = " ".join(v["expression"] for v in spec["variables"])
        assert NODE_NAME_EXTRA in text
        assert all(v.get("messageExpression") or v.get("message") for v in spec["validations"])
        bindings = [
            b for b in of_kind(objs, "ValidatingAdmissionPolicyBinding") if b["spec"]["policyName"] == name
        ]
        assert len(bindings) == 1
        assert bindings[0]["spec"]["validationActions"] == ["Deny"]
        assert "matchResources" not in bindings[0]["spec"], "the binding must not narrow the policy"


def test_a_renamed_and_renamespaced_kustomization_keeps_the_policies(kubectl: Path, tmp_path: Path) -> None:
    """A user's overlay on top of ours with `namespace:` and `namePrefix:`: the account moves and
    is renamed, the RBAC subjects follow it, and both policies still apply to it."""
    # kustomize takes a base only by a relative path.
    base = os.path.relpath(overlay_dir("tpu"), tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"namespace: gpu-system\nnamePrefix: team-\nresources:\n  - {base}\n"
    )
    objs = render(tmp_path, kubectl=kubectl)
    username = _agent_username(objs)
    assert username == "system:serviceaccount:gpu-system:team-accel-dra-node-agent"
    _assert_policies_hold(objs, drivers=[GPU_DRIVER, TPU_DRIVER], prefix="team-accel-dra")
    for binding in of_kind(objs, "ClusterRoleBinding"):
        for subject in binding["subjects"]:
            assert subject["namespace"] == "gpu-system", binding["metadata"]["name"]
    policy_names = {p["metadata"]["name"] for p in of_kind(objs, "ValidatingAdmissionPolicy")}
    for binding in of_kind(objs, "ValidatingAdmissionPolicyBinding"):
        assert binding["spec"]["policyName"] in policy_names, "namePrefix left a binding dangling"


def test_chart_policies_follow_release_namespace_name_and_drivers(helm: Path) -> None:
    values = {
        "backend": "simulated",
        "fullnameOverride": "gpus",
        "driverNames": {"gpu": "gpu.example.com", "tpu": "tpu.example.com"},
    }
    objs = helm_template(helm, values=values, namespace="gpu-system", release="other")
    assert _agent_username(objs) == "system:serviceaccount:gpu-system:gpus-node-agent"
    _assert_policies_hold(objs, drivers=["gpu.example.com", "tpu.example.com"], prefix="gpus")
