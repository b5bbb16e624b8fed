"""The Helm chart renders the same objects as the kustomize overlays, and `helm lint` passes.

For each overlay (gpu, tpu, simulated), `helm template` with the matching values is compared with
`kubectl kustomize manifests/overlays/<overlay>`, whole objects after normalisation:

- Helm's own labels (helm.sh/chart, app.kubernetes.io/instance, -version, managed-by: Helm) are
  removed; the kustomize Namespace object is compared with the release namespace instead (Helm
  installs into the release namespace and does not own it).
- Container args: the chart passes its values as explicit flags where the manifests leave the
  components' defaults, so args are compared as what the programs make of them (the parsed
  Settings), and every flag the manifest passes must appear unchanged in the chart's args.

Anything else that differs fails with a unified diff of the two objects.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_node_agent import cli as agent_cli
from dra_node_agent import settings as agent_settings
from dra_operator.base import settings as operator_settings
from dra_operator.computedomains import desired
from tests.unit.deploy.helm_render import CHART_DIR, helm_template, overlay_values
from tests.unit.deploy.render import CRDS_DIR, MANIFESTS_DIR, NAMESPACE, OVERLAYS, Obj, of_kind, one, render

HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/version")

Key = tuple[str, str, str]

COMPUTE_DOMAINS: dict[str, Any] = {"resources": {"computeDomains": {"enabled": True}}}
DAEMON_CLAIMS_POLICY = "accel-dra-compute-domain-daemon-claims"


def _key(obj: Obj) -> Key:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def _settings(container: Obj) -> dict[str, str]:
    """What the container's program makes of its args (and an empty environment)."""
    args = container.get("args", [])
    if container["command"] == ["dra-node-agent"]:
        parsed = agent_cli.build_parser().parse_args(args)
        fields = dataclasses.asdict(agent_settings.load_settings(args=parsed, environ={"NODE_NAME": "node"}))
    else:
        assert container["command"] == ["dra-operator"], container["command"]
        assert args[0] == "run"
        fields = dataclasses.asdict(operator_settings.parse(args[1:], env={}))
        fields.pop("priority")  # random per start, unless given
    return {name: repr(value) for name, value in fields.items()}


def _cel_lines(value: Any) -> Any:
    """kustomize re-emits a folded (>-) CEL expression with a more-indented line as two line breaks
    where YAML (and Helm, which does not re-emit) gives one; both are whitespace to CEL."""
    if isinstance(value, dict):
        return {
            k: v.replace("\n\n", "\n") if k.endswith("xpression") and isinstance(v, str) else _cel_lines(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_cel_lines(v) for v in value]
    return value


def _normalise(obj: Obj) -> Obj:
    obj = _cel_lines(copy.deepcopy(obj))
    labels = obj["metadata"].get("labels", {})
    for label in HELM_LABELS:
        labels.pop(label, None)
    if labels.get("app.kubernetes.io/managed-by") == "Helm":
        del labels["app.kubernetes.io/managed-by"]
    template = obj.get("spec", {}).get("template", {}).get("spec")
    if obj["kind"] in {"Deployment", "DaemonSet"} and template:
        for container in template["containers"]:
            container["args"] = {"parsed": _settings(container)}
    return obj


def _dump(obj: Obj) -> list[str]:
    return yaml.safe_dump(obj, sort_keys=True, width=200).splitlines(keepends=True)


def _compare(kustomized: list[Obj], charted: list[Obj], *, what: str) -> None:
    ours = {_key(o): o for o in kustomized}
    theirs = {_key(o): o for o in charted}
    assert sorted(ours) == sorted(theirs), (
        f"{what}: objects only in kustomize: {sorted(set(ours) - set(theirs))}; "
        f"only in the chart: {sorted(set(theirs) - set(ours))}"
    )
    problems = []
    for key in sorted(ours):
        left, right = _normalise(ours[key]), _normalise(theirs[key])
        if left != right:
            diff = "".join(difflib.unified_diff(_dump(left), _dump(right), "kustomize", "helm"))
            problems.append(f"{what}: {'/'.join(key)} differs:\n{diff}")
    assert not problems, "\n".join(problems)
    # The manifests' flags are given to the chart's containers unchanged.
    for key, obj in ours.items():
        if obj["kind"] in {"Deployment", "DaemonSet"}:
            for mine, chart in zip(
                obj["spec"]["template"]["spec"]["containers"],
                theirs[key]["spec"]["template"]["spec"]["containers"],
                strict=True,
            ):
                missing = [a for a in mine.get("args", []) if a not in chart.get("args", [])]
                assert not missing, (
                    f"{what}: {'/'.join(key)} container {mine['name']}: chart lacks args {missing}"
                )


def _is_hook(obj: Obj) -> bool:
    return "helm.sh/hook" in (obj["metadata"].get("annotations") or {})


def _without_namespace(objs: list[Obj]) -> list[Obj]:
    namespaces = [o for o in objs if o["kind"] == "Namespace"]
    assert [o["metadata"]["name"] for o in namespaces] == [NAMESPACE]
    return [o for o in objs if o["kind"] != "Namespace"]


def _with_crds(objs: list[Obj], crds: list[Obj]) -> list[Obj]:
    """A kustomize render plus crds/, as `helm template --include-crds` gives them: the CRDs come
    from the chart's crds/ without the label kustomize puts on them. (The uninstall hook is the
    chart's own, as kubectl delete -k has no hooks: README, "Uninstall"; callers leave it out.)"""
    objs = copy.deepcopy(objs + crds)
    for crd in objs:
        if crd["kind"] == "CustomResourceDefinition":
            crd["metadata"]["labels"].pop("app.kubernetes.io/part-of")
            if not crd["metadata"]["labels"]:
                del crd["metadata"]["labels"]
    return objs


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_chart_renders_the_overlays_objects(
    rendered: dict[str, list[Obj]],
    helm_rendered: dict[str, list[Obj]],
    rendered_crds: list[Obj],
    overlay: str,
) -> None:
    kustomized = _with_crds(_without_namespace(rendered[overlay]), rendered_crds)
    charted = [o for o in helm_rendered[overlay] if not _is_hook(o)]
    _compare(kustomized, charted, what=f"overlay {overlay}")


def test_chart_monitoring_objects_are_the_manifests(
    kubectl: Path, helm: Path, rendered: dict[str, list[Obj]]
) -> None:
    monitoring = render(MANIFESTS_DIR / "monitoring", kubectl=kubectl)
    with_monitoring = helm_template(
        helm, values={**overlay_values("simulated"), "monitoring": {"enabled": True}}
    )
    without = {_key(o) for o in helm_template(helm, values=overlay_values("simulated"))}
    added = [o for o in with_monitoring if _key(o) not in without]
    _compare(monitoring, added, what="monitoring")


def test_metrics_network_policy_covers_both_pods_and_the_chart_renders_it_alike(
    kubectl: Path, helm: Path, rendered: dict[str, list[Obj]]
) -> None:
    optional = render(MANIFESTS_DIR / "optional" / "metrics-network-policy", kubectl=kubectl)
    (policy,) = optional
    (selector,) = policy["spec"]["podSelector"]["matchExpressions"]
    (port,) = policy["spec"]["ingress"][0]["ports"]
    for overlay in OVERLAYS:
        for workload in (o for o in rendered[overlay] if o["kind"] in {"Deployment", "DaemonSet"}):
            template = workload["spec"]["template"]
            assert template["metadata"]["labels"][selector["key"]] in selector["values"], workload["kind"]
            ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
            assert port["port"] in ports, workload["kind"]
    values = overlay_values("simulated")
    with_policy = helm_template(helm, values={**values, "metricsNetworkPolicy": {"enabled": True}})
    without = {_key(o) for o in helm_template(helm, values=values)}
    _compare(optional, [o for o in with_policy if _key(o) not in without], what="metrics network policy")


def test_passthrough_support_gives_the_agent_the_flag_and_ships_the_optional_class(
    kubectl: Path, helm: Path
) -> None:
    optional = render(MANIFESTS_DIR / "optional" / "passthrough", kubectl=kubectl)
    values = overlay_values("gpu")
    with_passthrough = helm_template(helm, values={**values, "kubeletPlugin": {"passthroughSupport": True}})
    without = helm_template(helm, values=values)
    added = [o for o in with_passthrough if _key(o) not in {_key(w) for w in without}]
    _compare(optional, added, what="passthrough")
    for objs, passthrough in ((with_passthrough, True), (without, False)):
        (daemonset,) = [o for o in objs if o["kind"] == "DaemonSet"]
        agent = _settings(daemonset["spec"]["template"]["spec"]["containers"][0])
        assert agent["passthrough_support"] == repr(passthrough)
        # The health monitor's NVML session would hold the GPUs a binding needs: off with passthrough.
        assert agent["health_enabled"] == repr(not passthrough)


def _gpu_overlay_with_compute_domains(directory: Path) -> Path:
    """A kustomization of the gpu overlay with the compute-domains component (kustomize takes only
    relative paths to other kustomizations)."""
    directory.mkdir()
    (directory / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{os.path.relpath(MANIFESTS_DIR / 'overlays' / 'gpu', directory)}]\n"
        f"components: [{os.path.relpath(MANIFESTS_DIR / 'optional' / 'compute-domains', directory)}]\n"
    )
    return directory


def test_compute_domains_render_what_the_component_adds(
    kubectl: Path, helm: Path, rendered_crds: list[Obj], tmp_path: Path
) -> None:
    """resources.computeDomains.enabled gives the gpu overlay plus manifests/optional/compute-domains,
    but for two documented differences: the daemon claim policy selects the release namespace by
    name (a chart cannot label it), and both programs are told the daemons' namespace, IMEX mode
    and image where the component leaves their defaults."""
    kustomized = render(_gpu_overlay_with_compute_domains(tmp_path / "overlay"), kubectl=kubectl)
    label = "accel-dra.dev/compute-domain-daemons"
    (namespace,) = of_kind(kustomized, "Namespace")
    assert namespace["metadata"]["labels"][label] == "true"
    policy = one(kustomized, "ValidatingAdmissionPolicy", DAEMON_CLAIMS_POLICY)
    selector = policy["spec"]["matchConstraints"]["namespaceSelector"]
    assert selector == {"matchExpressions": [{"key": label, "operator": "DoesNotExist"}]}
    selector["matchExpressions"] = [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NAMESPACE]}
    ]
    (operator,) = of_kind(kustomized, "Deployment")
    image = operator["spec"]["template"]["spec"]["containers"][0]["image"]
    both = [f"--compute-domain-namespace={NAMESPACE}", "--compute-domain-imex-mode=driverManaged"]
    operator["spec"]["template"]["spec"]["containers"][0]["args"] += [
        *both,
        f"--compute-domain-daemon-image={image}",
        "--compute-domain-daemon-image-pull-policy=IfNotPresent",
    ]
    (agent,) = of_kind(kustomized, "DaemonSet")
    agent["spec"]["template"]["spec"]["containers"][0]["args"] += both
    charted = helm_template(helm, values={**overlay_values("gpu"), **COMPUTE_DOMAINS})
    _compare(_with_crds(_without_namespace(kustomized), rendered_crds),
             [o for o in charted if not _is_hook(o)], what="compute domains")  # fmt: skip


def test_compute_domain_values_reach_both_programs(helm: Path) -> None:
    """The daemons run the release's image in the release namespace, with the chart's IMEX mode."""
    values: dict[str, Any] = {
        **overlay_values("gpu"),
        "image": {"repository": "mirror.internal/accel-dra", "tag": "1.2.3", "pullPolicy": "Always"},
        "resources": {"computeDomains": {"enabled": True, "imex": {"mode": "hostManaged"}}},
    }
    objs = helm_template(helm, values=values, namespace="gpu-system")
    (deployment,) = of_kind(objs, "Deployment")
    operator = _settings(deployment["spec"]["template"]["spec"]["containers"][0])
    (daemonset,) = of_kind(objs, "DaemonSet")
    agent = _settings(daemonset["spec"]["template"]["spec"]["containers"][0])
    for program in (operator, agent):
        assert program["compute_domains"] == "True"
        assert program["compute_domain_namespace"] == "'gpu-system'"
        assert program["compute_domain_imex_mode"] == "'hostManaged'"
    assert operator["compute_domain_daemon_image"] == "'mirror.internal/accel-dra:1.2.3'"
    assert operator["compute_domain_daemon_image_pull_policy"] == "'Always'"
    policy = one(objs, "ValidatingAdmissionPolicy", DAEMON_CLAIMS_POLICY)
    (selector,) = policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
    assert selector == {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["gpu-system"]}
    # Off (the default): neither program serves ComputeDomains, and none of its objects is rendered.
    off = helm_template(helm, values=overlay_values("gpu"))
    for workload in of_kind(off, "Deployment") + of_kind(off, "DaemonSet"):
        assert _settings(workload["spec"]["template"]["spec"]["containers"][0])["compute_domains"] == "False"
    assert not [o for o in off if "compute-domain" in o["metadata"]["name"]]


def test_compute_domain_daemons_get_the_charts_pull_secrets_and_overrides(helm: Path) -> None:
    """Daemons pull the release's image as its pods do: the chart's imagePullSecrets reach them
    through the operator's overrides file, beside what daemonOverrides adds."""
    secrets = [{"name": "registry-login"}]
    overrides = {"priorityClassName": "imex-critical", "env": [{"name": "HTTPS_PROXY", "value": "p:3128"}]}
    values: dict[str, Any] = {
        **overlay_values("gpu"),
        "imagePullSecrets": secrets,
        "resources": {"computeDomains": {"enabled": True, "daemonOverrides": overrides}},
    }
    objs = helm_template(helm, values=values)
    configmap = one(objs, "ConfigMap", "accel-dra-operator-compute-domain-daemons")
    text = configmap["data"]["overrides.yaml"]
    parsed = desired.check_overrides(yaml.safe_load(text), where="chart")
    assert parsed == {**overrides, "imagePullSecrets": secrets}
    (deployment,) = of_kind(objs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    path = _settings(pod["containers"][0])["compute_domain_daemon_overrides"].strip("'")
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "compute-domain-daemons"]
    assert path == f"{mount['mountPath']}/overrides.yaml"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "compute-domain-daemons"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    # Nothing to add (no secrets, no overrides): no file, no flag.
    bare = helm_template(helm, values={**overlay_values("gpu"), **COMPUTE_DOMAINS})
    assert not [o for o in bare if o["kind"] == "ConfigMap" and "compute-domain" in o["metadata"]["name"]]
    (deployment,) = of_kind(bare, "Deployment")
    assert (
        _settings(deployment["spec"]["template"]["spec"]["containers"][0])["compute_domain_daemon_overrides"]
        == "''"
    )


def test_chart_follows_the_release_namespace(helm: Path) -> None:
    """Namespaced objects, ServiceAccount subjects and the alerts' job label all name the release
    namespace (the admission policies match the agent in any namespace: test_policy.py)."""
    objs = helm_template(helm, values={**overlay_values("simulated"), "monitoring": {"enabled": True},
                                       **COMPUTE_DOMAINS}, namespace="gpu-system")  # fmt: skip
    text = yaml.safe_dump_all(objs)
    assert f"system:serviceaccount:{NAMESPACE}:" not in text
    assert f'"{NAMESPACE}/' not in text
    for obj in objs:
        if obj["kind"] in {"ServiceAccount", "Deployment", "DaemonSet", "PodDisruptionBudget", "PodMonitor",
                           "PrometheusRule", "ConfigMap", "Role", "RoleBinding"}:  # fmt: skip
            assert obj["metadata"]["namespace"] == "gpu-system", obj["metadata"]
        for subject in obj.get("subjects", []):
            assert subject["namespace"] == "gpu-system"
    assert 'up{job="gpu-system/accel-dra-node-agent"}' in text


def test_chart_values_reach_the_programs(helm: Path) -> None:
    """A few values, checked as the components read them."""
    values: dict[str, Any] = {
        "backend": "simulated",
        "simulated": {"profiles": ["h100-80gb-x8"]},
        "controller": {"ownership": "all", "replicas": 3},
        "kubeletPlugin": {"health": {"pollIntervalSeconds": 3, "taintEffect": "NoExecute"}},
        "logLevel": "DEBUG",
    }
    objs = helm_template(helm, values=values)
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    (daemonset,) = [o for o in objs if o["kind"] == "DaemonSet"]
    assert deployment["spec"]["replicas"] == 3
    operator = _settings(deployment["spec"]["template"]["spec"]["containers"][0])
    assert operator["ownership"] == "<Ownership.ALL: 'all'>"
    assert operator["log_level"] == "'DEBUG'"
    agent = _settings(daemonset["spec"]["template"]["spec"]["containers"][0])
    assert agent["health_poll_interval"] == "3.0"
    assert agent["health_taint_effect"] == "'NoExecute'"
    assert agent["simulate_profile"] == "('h100-80gb-x8',)"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"backend": "cpu"}, 'backend must be gpu, tpu or simulated, not "cpu"'),
        ({"controller": {"ownership": "some"}}, "controller.ownership must be standalone, all or none"),
        ({"backend": "simulated", "simulated": {"profiles": []}}, "needs at least one profile"),
        (
            {"resources": {"computeDomains": {"enabled": True, "imex": {"mode": "hostmanaged"}}}},
            'resources.computeDomains.imex.mode must be driverManaged or hostManaged, not "hostmanaged"',
        ),
    ],
)
def test_chart_refuses_values_the_programs_would_reject(
    helm: Path, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(AssertionError, match=message):
        helm_template(helm, values=values)


@pytest.mark.parametrize(
    "flags",
    [*([f"--set=backend={o}"] for o in OVERLAYS), ["--set=resources.computeDomains.enabled=true"]],
    ids=[*OVERLAYS, "compute-domains"],
)
def test_helm_lint(helm: Path, flags: list[str]) -> None:
    result = subprocess.run(
        [str(helm), "lint", "--strict", str(CHART_DIR), *flags],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_chart_crds_match_crds_dir_after_render(
    rendered_crds: list[Obj], helm_rendered: dict[str, list[Obj]]
) -> None:
    crd_names = sorted(o["metadata"]["name"] for o in rendered_crds)
    charted = sorted(
        o["metadata"]["name"] for o in helm_rendered["simulated"] if o["kind"] == "CustomResourceDefinition"
    )
    assert charted == crd_names, CRDS_DIR


def test_uninstall_hook_refuses_by_default_and_releases_when_asked(helm: Path) -> None:
    values: dict[str, Any] = {"backend": "simulated"}
    hooks = [o for o in helm_template(helm, values=values) if _is_hook(o)]
    assert sorted(o["kind"] for o in hooks) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Job",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    for obj in hooks:
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    (job,) = [o for o in hooks if o["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["dra-operator", "release-claims"]
    assert "args" not in container  # lists and refuses
    (role,) = [o for o in hooks if o["kind"] == "ClusterRole"]
    assert role["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list", "patch"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/status", "resourceclaims/binding"],
            "verbs": ["patch"],
        },
    ]
    released = helm_template(helm, values={**values, "uninstall": {"releaseClaims": True}})
    (job,) = [o for o in released if o["kind"] == "Job"]
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "--release",
        f"--stop-operator={NAMESPACE}/accel-dra-operator",
    ]
    off = helm_template(helm, values={**values, "uninstall": {"hook": {"enabled": False}}})
    assert not [o for o in off if _is_hook(o)]
