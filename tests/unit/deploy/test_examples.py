"""The examples reference what the driver installs and are internally consistent."""

from __future__ import annotations

import pytest

from dra_api import names
from tests.unit.deploy.render import EXAMPLES_DIR, Obj, load_file, of_kind, one, pod_specs

EXAMPLE_FILES = sorted(p.name for p in EXAMPLES_DIR.glob("*.yaml"))


def _requests(template: Obj) -> list[Obj]:
    requests: list[Obj] = template["spec"]["spec"]["devices"]["requests"]
    return requests


def test_the_examples_are_the_guides_and_the_shares_example() -> None:
    assert EXAMPLE_FILES == [
        "gke-gpu.yaml",
        "gke-tpu.yaml",
        "gpu-shares-by-memory.yaml",
        "nvidia-gpu-test1.yaml",
        "nvidia-gpu-test2.yaml",
        "nvidia-gpu-test4-mig.yaml",
        "nvidia-single-gpu.yaml",
    ]


@pytest.mark.parametrize("filename", EXAMPLE_FILES)
def test_pods_use_the_claims_their_templates_define(filename: str) -> None:
    objs = load_file(EXAMPLES_DIR / filename)
    namespaces = of_kind(objs, "Namespace")
    templates = {o["metadata"]["name"] for o in of_kind(objs, "ResourceClaimTemplate")}
    workloads = list(pod_specs(objs))
    assert workloads
    for obj in objs:
        if obj["kind"] == "Namespace":
            continue
        if filename.startswith("gke-"):
            # GKE's guide writes no namespace: `kubectl create -n <namespace> -f`.
            assert not namespaces
            assert "namespace" not in obj["metadata"], obj["metadata"]["name"]
        else:
            # NVIDIA's files create the one namespace they use; the shares example one per tenant.
            assert namespaces
            own = {n["metadata"]["name"] for n in namespaces}
            assert obj["metadata"]["namespace"] in own, obj["metadata"]["name"]
    for _, spec in workloads:
        claims = {c["name"]: c for c in spec["resourceClaims"]}
        assert {c["resourceClaimTemplateName"] for c in claims.values()} <= templates
        used = {ref["name"] for ctr in spec["containers"] for ref in ctr["resources"].get("claims", [])}
        assert used == set(claims)


def test_gke_style_template_asks_for_one_gpu_in_v1beta1() -> None:
    objs = load_file(EXAMPLES_DIR / "gke-gpu.yaml")
    template = one(objs, "ResourceClaimTemplate", "gpu-claim-template")
    assert template["apiVersion"] == "resource.k8s.io/v1beta1"
    (request,) = _requests(template)
    assert request["deviceClassName"] == names.GPU_CLASS
    assert request["allocationMode"] == "ExactCount"
    assert request["count"] == 1
    (deployment,) = of_kind(objs, "Deployment")
    tolerations = deployment["spec"]["template"]["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


def test_gke_tpu_template_takes_all_chips_in_v1beta1() -> None:
    objs = load_file(EXAMPLES_DIR / "gke-tpu.yaml")
    template = one(objs, "ResourceClaimTemplate", "tpu-claim-template")
    assert template["apiVersion"] == "resource.k8s.io/v1beta1"
    (request,) = _requests(template)
    assert request == {"name": "all-tpus", "deviceClassName": names.TPU_CLASS, "allocationMode": "All"}
    (deployment,) = of_kind(objs, "Deployment")
    tolerations = deployment["spec"]["template"]["spec"]["tolerations"]
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


def test_nvidia_mig_example_asks_for_four_profiles_on_one_gpu() -> None:
    objs = load_file(EXAMPLES_DIR / "nvidia-gpu-test4-mig.yaml")
    (template,) = of_kind(objs, "ResourceClaimTemplate")
    requests = _requests(template)
    assert [r["exactly"]["deviceClassName"] for r in requests] == [names.MIG_CLASS] * 4
    assert template["spec"]["spec"]["devices"]["constraints"] == [
        {"requests": [], "matchAttribute": "gpu.nvidia.com/parentUUID"}
    ]
    ((_, spec),) = pod_specs(objs)
    used = [ctr["resources"]["claims"][0]["request"] for ctr in spec["containers"]]
    assert used == [r["name"] for r in requests]


def test_nvidia_install_check_uses_the_v1_exactly_form() -> None:
    objs = load_file(EXAMPLES_DIR / "nvidia-single-gpu.yaml")
    (template,) = of_kind(objs, "ResourceClaimTemplate")
    assert template["apiVersion"] == "resource.k8s.io/v1"
    (request,) = _requests(template)
    assert request == {"name": "gpu", "exactly": {"deviceClassName": names.GPU_CLASS}}
    assert len(of_kind(objs, "Pod")) == 1


def test_the_shares_example_gives_two_namespaces_a_share_of_one_large_gpu_each() -> None:
    objs = load_file(EXAMPLES_DIR / "gpu-shares-by-memory.yaml")
    assert [n["metadata"]["name"] for n in of_kind(objs, "Namespace")] == ["gpu-share-a", "gpu-share-b"]
    templates = of_kind(objs, "ResourceClaimTemplate")
    assert [t["metadata"]["namespace"] for t in templates] == ["gpu-share-a", "gpu-share-b"]
    for template in templates:
        (request,) = _requests(template)
        exactly = request["exactly"]
        assert exactly["deviceClassName"] == names.GPU_CLASS
        assert exactly["capacity"] == {"requests": {"memory": "30Gi"}}
        # Only GPUs of 64Gi or more: the demo's H100 node, whose agent shares GPUs out by memory.
        (selector,) = exactly["selectors"]
        assert "quantity('64Gi')" in selector["cel"]["expression"]
