"""Least-privilege RBAC: exactly the permissions each component needs, no wildcards."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.unit.deploy.render import (
    AGENT_SA,
    MANIFESTS_DIR,
    NAMESPACE,
    OPERATOR_SA,
    OVERLAYS,
    PEERING_NAME,
    REPO_ROOT,
    Obj,
    of_kind,
    pod_specs,
    rbac_grants,
)

RES = "resource.k8s.io"


def _verbs(group: str, resource: str, verbs: str, name: str = "") -> set[tuple[str, ...]]:
    return {(group, resource, verb, name) for verb in verbs.split()}


OPERATOR_GRANTS = (
    _verbs(RES, "deviceclasses", "get list watch create")
    | {
        (RES, "deviceclasses", verb, name)
        for verb in ("update", "patch")
        for name in ("gpu.nvidia.com", "mig.nvidia.com", "tpu.google.com")
    }
    | _verbs(RES, "resourceclaims", "get list watch update patch")
    | _verbs(RES, "resourceclaims/status", "update patch")
    | _verbs(RES, "resourceclaims/binding", "update patch")
    | _verbs(RES, "resourceslices", "get list watch delete")
    # Nodes reserved for claims that kube-scheduler's pods starve (DeviceTaintRules).
    | _verbs(RES, "devicetaintrules", "list create delete")
    | _verbs("", "nodes", "get list watch")
    | _verbs("", "pods", "get list watch")
    | _verbs("", "events", "create patch")
    | _verbs("events.k8s.io", "events", "create patch")
    | _verbs("kopf.dev", "clusterkopfpeerings", "list watch")
    | _verbs("kopf.dev", "clusterkopfpeerings", "get patch", PEERING_NAME)
    | _verbs("apiextensions.k8s.io", "customresourcedefinitions", "list watch")
)

AGENT_GRANTS = (
    _verbs(RES, "resourceslices", "get list watch create update delete")
    | _verbs(RES, "resourceclaims", "get")
    # KEP-4817 device status: a PUT of the claim's /status (update only), and on 1.36+ the per-driver
    # check on the synthetic resourceclaims/driver with the agent's node in its token (associated-node).
    | _verbs(RES, "resourceclaims/status", "update")
    | {
        (RES, "resourceclaims/driver", "associated-node:update", name)
        for name in ("gpu.nvidia.com", "tpu.google.com")
    }
    | _verbs("", "nodes", "get")
    | _verbs("", "events", "create patch")
    | _verbs("events.k8s.io", "events", "create patch")
)
# Multi-host TPU worker identity: the claim's pod and its Indexed Job, read at prepare. Only the TPU
# install reads them (pod specs carry environment literals).
TPU_WORKLOAD_GRANTS = _verbs("", "pods", "get") | _verbs("batch", "jobs", "get")
AGENT_GRANTS_BY_OVERLAY = {
    "gpu": AGENT_GRANTS,
    "tpu": AGENT_GRANTS | TPU_WORKLOAD_GRANTS,
    "simulated": AGENT_GRANTS,
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_operator_has_exactly_its_permissions(rendered: dict[str, list[Obj]], overlay: str) -> None:
    grants = rbac_grants(rendered[overlay], service_account=OPERATOR_SA)
    assert sorted(grants - OPERATOR_GRANTS) == [], "operator has permissions it does not need"
    assert sorted(OPERATOR_GRANTS - grants) == [], "operator lacks permissions it needs"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_node_agent_has_exactly_its_permissions(rendered: dict[str, list[Obj]], overlay: str) -> None:
    grants = rbac_grants(rendered[overlay], service_account=AGENT_SA)
    wanted = AGENT_GRANTS_BY_OVERLAY[overlay]
    assert sorted(grants - wanted) == [], "node agent has permissions it does not need"
    assert sorted(wanted - grants) == [], "node agent lacks permissions it needs"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_wildcards_or_escalation_in_any_role(rendered: dict[str, list[Obj]], overlay: str) -> None:
    roles = of_kind(rendered[overlay], "ClusterRole") + of_kind(rendered[overlay], "Role")
    assert roles, "no roles rendered"
    for role in roles:
        assert "aggregationRule" not in role, f"{role['metadata']['name']}: aggregated roles grow silently"
        for rule in role["rules"]:
            where = f"{role['kind']} {role['metadata']['name']} rule {rule}"
            for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert not any("*" in value for value in rule.get(key, [])), f"wildcard in {where}"
            assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"]), where
            assert not {"secrets", "configmaps", "serviceaccounts/token"} & set(rule.get("resources", [])), (
                where
            )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_component_runs_as_its_own_service_account(rendered: dict[str, list[Obj]], overlay: str) -> None:
    accounts = {o["metadata"]["name"] for o in of_kind(rendered[overlay], "ServiceAccount")}
    assert accounts == {OPERATOR_SA, AGENT_SA}
    used = {
        workload["kind"]: spec.get("serviceAccountName") for workload, spec in pod_specs(rendered[overlay])
    }
    assert used == {"Deployment": OPERATOR_SA, "DaemonSet": AGENT_SA}
    for workload, _ in pod_specs(rendered[overlay]):
        assert workload["metadata"]["namespace"] == NAMESPACE


# Client calls that read pods or Jobs; the agent's role grants them only with the TPU backend.
_WORKLOAD_READS = re.compile(r"_namespaced_pod\b|_pod_for_all_namespaces|_namespaced_job\b|\"jobs\"|'jobs'")


def test_only_the_tpu_multihost_code_reads_pods_or_jobs() -> None:
    """The TPU-only grant is honest: no other agent module reads a pod or a Job (a GPU-only install
    would meet Forbidden at run time). ``compute-domain-daemon`` is not the agent: it runs in the
    ComputeDomain daemons' pods, under their own account, which may patch their own pod
    (manifests/optional/compute-domains/daemon-rbac.yaml and daemon-pod-policy.yaml)."""
    package = REPO_ROOT / "node_agent" / "dra_node_agent"
    readers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if _WORKLOAD_READS.search(path.read_text())
    )
    # The multi-host TPU backend's client calls, and the daemon's label on its own pod.
    assert readers == ["imexdaemon/pod_api.py", "tpu/workload_api.py"]
    rbac = MANIFESTS_DIR / "optional" / "compute-domains" / "daemon-rbac.yaml"
    daemon = yaml.safe_load_all(rbac.read_text())
    (role,) = [d for d in daemon if d and d["kind"] == "Role"]
    assert {"patch"} <= {v for r in role["rules"] if "pods" in r["resources"] for v in r["verbs"]}
