"""Render the kustomizations with the local control plane's kubectl and look objects up."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[3]
CRDS_DIR = REPO_ROOT / "crds"
MANIFESTS_DIR = REPO_ROOT / "manifests"
BASE_DIR = MANIFESTS_DIR / "base"
OVERLAYS = ("gpu", "tpu", "simulated")
EXAMPLES_DIR = MANIFESTS_DIR / "examples"
NAMESPACE = "accel-dra"
OPERATOR_SA = "accel-dra-operator"
AGENT_SA = "accel-dra-node-agent"
# The Kopf peering object's name; the operator's role may patch only it.
PEERING_NAME = "accel-dra-operator"

Obj = dict[str, Any]


def overlay_dir(name: str) -> Path:
    return MANIFESTS_DIR / "overlays" / name


def render(directory: Path, *, kubectl: Path) -> list[Obj]:
    """`kubectl kustomize <directory>` as a list of objects; raises with kustomize's message."""
    result = subprocess.run([str(kubectl), "kustomize", str(directory)], capture_output=True, text=True,
                            timeout=120, check=False)  # fmt: skip
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def load_file(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def of_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected exactly one {kind} {name}, found {len(found)}"
    return found[0]


def pod_specs(objs: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(workload, pod spec) for every object that has a pod template, or is a Pod."""
    for obj in objs:
        if obj["kind"] == "Pod":
            yield obj, obj["spec"]
        elif obj["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job", "ReplicaSet"}:
            yield obj, obj["spec"]["template"]["spec"]


def containers(spec: Obj) -> list[Obj]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def service_account_username(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def rbac_grants(objs: list[Obj], *, service_account: str, namespace: str = NAMESPACE) -> set[tuple[str, ...]]:
    """(apiGroup, resource, verb, resourceName or "") granted to a ServiceAccount by the bound roles."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objs if o["kind"] in {"ClusterRole", "Role"}}  # fmt: skip
    grants: set[tuple[str, ...]] = set()
    for binding in objs:
        if binding["kind"] not in {"ClusterRoleBinding", "RoleBinding"}:
            continue
        subjects = binding.get("subjects", [])
        if not any(s["kind"] == "ServiceAccount" and s["name"] == service_account
                   and s.get("namespace", binding["metadata"].get("namespace")) == namespace
                   for s in subjects):  # fmt: skip
            continue
        ref = binding["roleRef"]
        role_ns = None if ref["kind"] == "ClusterRole" else binding["metadata"].get("namespace")
        role = roles[(ref["kind"], role_ns, ref["name"])]
        for rule in role.get("rules", []):
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [""]:
                            grants.add((group, resource, verb, name))
    return grants
