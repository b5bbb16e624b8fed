"""The manifests (kustomize and the Helm chart) and the programs agree: flags parse, profiles exist,
classes are what the operator keeps.

Drift here fails only at run time in a cluster (a CrashLoopBackOff on an unknown flag, or the operator
and `kubectl apply` rewriting a DeviceClass back and forth), so it is checked on the rendered objects.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dra_api.names import OPERATOR_FINALIZER
from dra_node_agent import cli as agent_cli
from dra_node_agent import settings as agent_settings
from dra_node_agent.simulated.discovery import available_profiles
from dra_operator.base import settings as operator_settings
from dra_operator.upkeep.deviceclasses import desired_classes
from tests.unit.deploy.render import MANIFESTS_DIR, OVERLAYS, PEERING_NAME, Obj, of_kind, one, render

CLAIM_POLICY = "accel-dra-claim-finalizer"
# The kustomize overlays and the Helm chart rendered with the values that match each overlay.
SOURCES = [(tool, overlay) for tool in ("kustomize", "helm") for overlay in OVERLAYS]


def _objects(request: pytest.FixtureRequest, tool: str, overlay: str) -> list[Obj]:
    renders: dict[str, list[Obj]] = request.getfixturevalue(
        "rendered" if tool == "kustomize" else "helm_rendered"
    )
    return renders[overlay]


def _container(objs: list[Obj], kind: str) -> Obj:
    (workload,) = of_kind(objs, kind)
    containers: list[Obj] = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


@pytest.mark.parametrize(("tool", "overlay"), SOURCES)
def test_agent_accepts_its_arguments(request: pytest.FixtureRequest, tool: str, overlay: str) -> None:
    container = _container(_objects(request, tool, overlay), "DaemonSet")
    args = agent_cli.build_parser().parse_args(container["args"])
    assert args.command == "run"
    # NODE_NAME comes from the downward API in the pod.
    settings = agent_settings.load_settings(args=args, environ={"NODE_NAME": "node-a"})
    if overlay == "simulated":
        assert settings.simulate_profile
        assert set(settings.simulate_profile) <= set(available_profiles())
    else:
        assert settings.backends == ({"gpu": "nvidia", "tpu": "tpu"}[overlay],)
    # The paths the agent uses by default are the ones the DaemonSet mounts from the host.
    mounted = {m["mountPath"] for m in container["volumeMounts"]}
    for path in (
        settings.kubelet_registry_dir,
        settings.kubelet_plugins_dir,
        settings.cdi_dir,
        settings.state_dir,
    ):
        assert str(path) in mounted
    assert settings.metrics_address.rsplit(":", 1)[1] == str(container["ports"][0]["containerPort"])
    if overlay == "gpu":
        assert str(settings.driver_root) in mounted


@pytest.mark.parametrize(("tool", "overlay"), SOURCES)
def test_operator_accepts_its_arguments(request: pytest.FixtureRequest, tool: str, overlay: str) -> None:
    container = _container(_objects(request, tool, overlay), "Deployment")
    assert container["args"][0] == "run"
    settings = operator_settings.parse(container["args"][1:], env={})
    assert settings.peering_name == PEERING_NAME
    assert not settings.standalone
    assert settings.metrics_port == container["ports"][0]["containerPort"]


def test_shipped_classes_are_the_ones_the_operator_keeps(rendered: dict[str, list[Obj]]) -> None:
    wanted = desired_classes(operator_settings.Settings(mig_enabled=True))
    for name, desired in wanted.items():
        shipped = one(rendered["simulated"], "DeviceClass", name)
        assert shipped["spec"] == desired["spec"], f"the operator would rewrite DeviceClass {name}"
        assert desired["metadata"]["labels"].items() <= shipped["metadata"]["labels"].items()


def test_claim_finalizer_policy_adds_the_operators_finalizer_to_the_claims_it_owns(kubectl: Path) -> None:
    """The optional admission policy that saves the finalizer write must name the operator's
    finalizer and the classes it keeps, and match what it owns by default (claims no Pod owns)."""
    objs = render(MANIFESTS_DIR / "optional" / "claim-finalizer-policy", kubectl=kubectl)
    policy = one(objs, "MutatingAdmissionPolicy", CLAIM_POLICY)
    conditions = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    listed = re.search(r"deviceClassName in (\[.*?\])", conditions["requests-a-driver-class"])
    assert listed is not None
    wanted = desired_classes(operator_settings.Settings(mig_enabled=True))
    assert sorted(json.loads(listed.group(1))) == sorted(wanted)
    assert operator_settings.Settings().ownership.value == "standalone"
    assert 'r.kind == "Pod"' in conditions["not-owned-by-a-pod"]
    assert OPERATOR_FINALIZER in conditions["finalizer-missing"]
    (mutation,) = policy["spec"]["mutations"]
    assert mutation["jsonPatch"]["expression"].count(OPERATOR_FINALIZER) == 2
    assert policy["spec"]["failurePolicy"] == "Ignore"  # an optimisation: never blocks a claim
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    (binding,) = of_kind(objs, "MutatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == CLAIM_POLICY
    assert all(o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "accel-dra" for o in objs)
