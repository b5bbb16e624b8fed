"""The optional MutatingAdmissionPolicy (``manifests/optional/claim-finalizer-policy``) on the real
API server: a claim the operator owns is created with the operator's finalizer, and the operator
allocates it with a single status write, then releases it on deletion as before. A claim a Pod owns,
or one of another class, is created as it was sent.

The cluster is shared with other tests, so the policy is applied for this test's class and
namespace only; everything else in it is as shipped.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import yaml

from dra_devcluster import LocalCluster
from dra_devcluster.faultproxy import FaultProxy
from dra_operator.model.cluster import ARRIVAL_AGE_S
from tests.integration.operator.conftest import Operators
from tests.integration.operator.objects import OPERATOR_FINALIZER, add_gpu_node, claim, pod

POLICY_DIR = Path(__file__).resolve().parents[3] / "manifests" / "optional" / "claim-finalizer-policy"


def _scoped_policy(cls: str, ns: str) -> list[dict[str, Any]]:
    policy = yaml.safe_load((POLICY_DIR / "policy.yaml").read_text())
    binding = yaml.safe_load((POLICY_DIR / "binding.yaml").read_text())
    name = f"{policy['metadata']['name']}-{ns}"
    policy["metadata"]["name"] = binding["metadata"]["name"] = binding["spec"]["policyName"] = name
    conditions = policy["spec"]["matchConditions"]
    classes = next(c for c in conditions if c["name"] == "requests-a-driver-class")
    classes["expression"], replaced = re.subn(
        r"deviceClassName in \[.*?\]", f'deviceClassName in ["{cls}"]', classes["expression"]
    )
    assert replaced == 1, classes["expression"]
    conditions.append({"name": "this-test-only", "expression": f'object.metadata.namespace == "{ns}"'})
    return [policy, binding]


def _created(cluster: LocalCluster, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    """Create through the API server's admission chain; the object as stored (or as it would be)."""
    args = ["create", "-f", "-", "-o", "json"] + (["--dry-run=server"] if dry_run else [])
    created: dict[str, Any] = json.loads(cluster.kubectl(*args, input=json.dumps(obj)).stdout)
    return created


def test_claims_the_operator_owns_are_created_with_its_finalizer_and_allocated_in_one_write(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    ns = "op-mutate"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    add_gpu_node(local_cluster, scratch, "op-mutate", 2)
    # A pod stuck pending (its claim's class does not exist), as a shared cluster often has one:
    # an operator that starts beside it must not take it for pods arriving and make claims wait
    # (CI saw that as two extra writes of the claim's condition).
    local_cluster.apply(
        [claim("stuck", ns, cls=f"{operators.gpu_class}-missing"), pod("stuck", ns, claim_name="stuck")]
    )
    stuck_since = time.monotonic()
    policy, binding = _scoped_policy(operators.gpu_class, ns)
    local_cluster.apply([policy, binding])
    scratch.append(("mutatingadmissionpolicybinding", binding["metadata"]["name"]))
    scratch.append(("mutatingadmissionpolicy", policy["metadata"]["name"]))

    # The API server takes a new policy into account shortly after it is created.
    local_cluster.wait_for(
        lambda: (
            OPERATOR_FINALIZER
            in _created(local_cluster, claim("probe", ns, cls=operators.gpu_class), dry_run=True)[
                "metadata"
            ].get("finalizers", [])
        ),
        what="the policy in effect",
    )
    owned_by_pod = claim("of-a-pod", ns, cls=operators.gpu_class)
    owned_by_pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "0b7f5c1e-0000-4000-8000-000000000001"}
    ]
    assert "finalizers" not in _created(local_cluster, owned_by_pod, dry_run=True)["metadata"]
    other = claim("other-class", ns, cls=f"{operators.gpu_class}-other")
    assert "finalizers" not in _created(local_cluster, other, dry_run=True)["metadata"]

    # Old enough when the operator lists it to be a pod that was there, not one arriving.
    time.sleep(max(0.0, stuck_since + ARRIVAL_AGE_S + 1 - time.monotonic()))
    with FaultProxy(local_cluster) as proxy:
        op = operators.start(kubeconfig=proxy.kubeconfig)
        created = _created(local_cluster, claim("mine", ns, cls=operators.gpu_class))
        assert created["metadata"]["finalizers"] == [OPERATOR_FINALIZER]
        allocated = local_cluster.wait_for(
            lambda: (local_cluster.get_json("resourceclaim", "mine", "-n", ns).get("status") or {}).get(
                "allocation"
            ),
            what="claim allocated",
        )
        records = proxy.records()
        # Released on deletion, as a claim whose finalizer the operator added itself.
        local_cluster.kubectl("delete", "resourceclaim", "mine", "-n", ns, "--wait=false")
        local_cluster.wait_for(
            lambda: (
                local_cluster.kubectl("get", "resourceclaim", "mine", "-n", ns, check=False).returncode != 0
            ),
            what="claim released and gone",
        )

    assert allocated["devices"]["results"][0]["pool"] == "op-mutate"
    path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/mine"
    writes = [(r.method, r.path) for r in records if r.path.startswith(path) and r.method in ("PATCH", "PUT")]
    assert writes == [("PATCH", f"{path}/status")], writes
    assert op.proc.poll() is None, op.log_tail()
