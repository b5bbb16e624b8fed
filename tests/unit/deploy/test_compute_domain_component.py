"""The optional ComputeDomains component on top of the GPU overlay: both programs accept what it
adds, its DeviceClasses are the ones the operator keeps, and the agent's node policy is bound."""

from __future__ import annotations

import os
from pathlib import Path

from dra_api import computedomains as cd
from dra_node_agent import cli as agent_cli
from dra_node_agent import settings as agent_settings
from dra_operator.base import settings as operator_settings
from dra_operator.upkeep.deviceclasses import desired_classes
from tests.unit.deploy.render import MANIFESTS_DIR, of_kind, one, render


def test_the_component_turns_both_programs_on_and_matches_the_operators_classes(
    kubectl: Path, tmp_path: Path
) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        # kustomize takes only relative paths to other kustomizations
        f"resources: [{os.path.relpath(MANIFESTS_DIR / 'overlays' / 'gpu', overlay)}]\n"
        f"components: [{os.path.relpath(MANIFESTS_DIR / 'optional' / 'compute-domains', overlay)}]\n"
    )
    objs = render(overlay, kubectl=kubectl)
    (agent,) = of_kind(objs, "DaemonSet")
    args = agent_cli.build_parser().parse_args(agent["spec"]["template"]["spec"]["containers"][0]["args"])
    assert agent_settings.load_settings(args=args, environ={"NODE_NAME": "n"}).compute_domains
    (operator,) = of_kind(objs, "Deployment")
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert operator_settings.parse(container["args"][1:], env={}).compute_domains
    wanted = desired_classes(operator_settings.Settings(compute_domains=True))
    for name in (cd.CHANNEL_CLASS, cd.DAEMON_CLASS):
        assert one(objs, "DeviceClass", name)["spec"]["selectors"] == wanted[name]["spec"]["selectors"]
    policy = one(objs, "ValidatingAdmissionPolicy", "accel-dra-resourceslices-own-node")
    assert cd.DRIVER in policy["spec"]["variables"][1]["expression"]
    binding = one(objs, "ValidatingAdmissionPolicyBinding", "accel-dra-node-labels-own-node")
    assert binding["spec"]["validationActions"] == ["Deny"]
