"""The ResourceSlice admission policy must name the identity the node agent really runs as.

NVIDIA's chart shipped a policy that matched a different ServiceAccount than its DaemonSet used,
so the per-node restriction never applied; this derives the expected username from the render.
"""

from __future__ import annotations

import re

import pytest

from tests.unit.deploy.render import OVERLAYS, Obj, of_kind, one, service_account_username

POLICY = "accel-dra-resourceslices-own-node"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_policy_matches_the_daemonsets_service_account(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    (daemonset,) = of_kind(objs, "DaemonSet")
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    expected = service_account_username(daemonset["metadata"]["namespace"], account)
    policy = one(objs, "ValidatingAdmissionPolicy", POLICY)
    conditions = policy["spec"]["matchConditions"]
    named = set()
    for condition in conditions:
        named |= set(re.findall(r'"(system:serviceaccount:[^"]+)"', condition["expression"]))
    assert named == {expected}
    assert any(
        re.fullmatch(rf'\s*request\.userInfo\.username\s*==\s*"{re.escape(expected)}"\s*', c["expression"])
        for c in conditions
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_policy_is_bound_denies_and_covers_all_writes(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    policy = one(objs, "ValidatingAdmissionPolicy", POLICY)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["resource.k8s.io"]
    assert rule["resources"] == ["resourceslices"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    assert rule["apiVersions"] == ["*"]
    assert spec["matchConstraints"].get("matchPolicy", "Equivalent") == "Equivalent"
    text = " ".join(v["expression"] for v in spec["variables"])
    assert 'request.userInfo.extra[?"authentication.kubernetes.io/node-name"]' in text
    assert all(v.get("messageExpression") or v.get("message") for v in spec["validations"])
    bindings = [
        b for b in of_kind(objs, "ValidatingAdmissionPolicyBinding") if b["spec"]["policyName"] == POLICY
    ]
    assert len(bindings) == 1
    assert bindings[0]["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in bindings[0]["spec"], "the binding must not narrow the policy"
