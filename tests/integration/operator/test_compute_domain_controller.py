"""The ComputeDomain controller in the real operator process against the real control plane.

NVIDIA's example domain gets its finalizer, its workload's claim template, its daemons' claim
template and DaemonSet, and the two DeviceClasses exist. Deleting it removes the workload's
template at once, keeps the daemons while a node still carries the domain's label (its channels in
use), and, once the label is gone, removes the rest and only then lets the domain go; an operator
killed in the middle leaves it to the next one. (The node is a Node object without a kubelet: the
node agent's side, and the daemons on real kubelets, are tested elsewhere.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from dra_api import computedomains as cd
from dra_devcluster import LocalCluster
from tests.integration.operator.conftest import Operators

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "manifests" / "examples" / "compute-domains" / "nvidia-imex-channel-injection.yaml"
TENANT = "cd-ctl-tenant"
DAEMONS = "cd-ctl-daemons"
NODE = "cd-ctl-node"


def _exists(cluster: LocalCluster, *args: str) -> bool:
    return cluster.kubectl("get", *args, "-o", "name", check=False).returncode == 0


def _domain(cluster: LocalCluster) -> dict[str, Any] | None:
    result = cluster.kubectl(
        "get", "computedomain", "imex-channel-injection", "-n", TENANT, "-o", "json", check=False
    )
    return json.loads(result.stdout) if result.returncode == 0 else None


def test_a_domains_objects_are_made_and_removed_in_order_across_an_operator_kill(
    local_cluster: LocalCluster, operators: Operators
) -> None:
    cluster = local_cluster
    cluster.kubectl("apply", "-k", str(REPO / "crds"))
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/computedomains.resource.nvidia.com", "--timeout=60s"
    )
    cluster.create_namespace(TENANT)
    cluster.create_namespace(DAEMONS)
    flags = (
        "--compute-domains=true",
        f"--compute-domain-namespace={DAEMONS}",
        "--compute-domain-resync-seconds=3",
    )
    first = operators.start(*flags)

    domain_doc = next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d["kind"] == cd.DOMAIN_KIND)
    cluster.kubectl("apply", "-n", TENANT, "-f", "-", input=json.dumps(domain_doc))
    uid = cluster.wait_for(lambda: (_domain(cluster) or {}).get("metadata", {}).get("uid"), what="domain uid")
    daemons = cd.daemon_name(uid)
    template = domain_doc["spec"]["channel"]["resourceClaimTemplate"]["name"]
    cluster.wait_for(
        lambda: (
            _exists(cluster, "daemonset", daemons, "-n", DAEMONS)
            and _exists(cluster, "resourceclaimtemplate", daemons, "-n", DAEMONS)
            and _exists(cluster, "resourceclaimtemplate", template, "-n", TENANT)
        ),
        timeout=60,
        what="the domain's DaemonSet and claim templates",
    )
    assert cd.FINALIZER in (_domain(cluster) or {})["metadata"]["finalizers"]
    # No daemon joined yet: NotReady, written through the status subresource.
    status = cluster.wait_for(lambda: (_domain(cluster) or {}).get("status"), what="the domain's status")
    assert status == {"status": cd.NOT_READY, "nodes": []}
    assert _exists(cluster, "deviceclass", cd.CHANNEL_CLASS)
    assert _exists(cluster, "deviceclass", cd.DAEMON_CLASS)
    workload = cluster.get_json("resourceclaimtemplate", template, "-n", TENANT)
    opaque = workload["spec"]["spec"]["devices"]["config"][0]["opaque"]
    assert opaque["parameters"]["domainID"] == uid
    ds = cluster.get_json("daemonset", daemons, "-n", DAEMONS)
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {cd.DOMAIN_LABEL: uid}

    # A node holds one of the domain's channels (the agent labelled it), then the domain is deleted.
    cluster.apply(
        [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {cd.DOMAIN_LABEL: uid}}}]
    )
    try:
        cluster.kubectl("delete", "computedomain", "imex-channel-injection", "-n", TENANT, "--wait=false")
        cluster.wait_for(
            lambda: not _exists(cluster, "resourceclaimtemplate", template, "-n", TENANT),
            timeout=60,
            what="the workload's template removed",
        )
        assert _exists(cluster, "daemonset", daemons, "-n", DAEMONS)  # still serving the workload
        assert _domain(cluster) is not None

        # The operator dies; a new one takes over, and the node's channel is released meanwhile.
        first.kill()
        operators.start(*flags, name="op2")
        cluster.kubectl("label", "node", NODE, f"{cd.DOMAIN_LABEL}-")
        cluster.wait_for(lambda: _domain(cluster) is None, timeout=90, what="the domain gone")
        assert not _exists(cluster, "daemonset", daemons, "-n", DAEMONS)
        assert not _exists(cluster, "resourceclaimtemplate", daemons, "-n", DAEMONS)
    finally:
        cluster.kubectl("delete", "node", NODE, "--ignore-not-found", "--wait=false", check=False)


def _claim(name: str, namespace: str, request: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "r", **request}]}},
    }


def test_only_the_daemons_namespace_may_claim_the_daemon_class(local_cluster: LocalCluster) -> None:
    """A tenant's claim for an IMEX daemon device (which would get a domain's IMEX folder) is
    refused by the component's admission policy, however it is spelled; the agent refuses such a
    claim at prepare too."""
    cluster = local_cluster
    policy = REPO / "manifests" / "optional" / "compute-domains" / "daemon-claim-policy.yaml"
    cluster.apply(policy.read_text())
    cluster.create_namespace("cd-policy-tenant")
    cluster.create_namespace("cd-policy-daemons", labels={"accel-dra.dev/compute-domain-daemons": "true"})
    daemon = {"exactly": {"deviceClassName": cd.DAEMON_CLASS}}
    either = {"firstAvailable": [{"name": "a", "deviceClassName": cd.DAEMON_CLASS}]}
    try:
        for i, request in enumerate((daemon, either)):

            def refused(request: dict[str, Any] = request, i: int = i) -> bool:
                body = json.dumps(_claim(f"steal-{i}", "cd-policy-tenant", request))
                result = cluster.kubectl("create", "-f", "-", input=body, check=False)
                if result.returncode == 0:  # the new policy is not enforced yet: try again
                    cluster.kubectl("delete", "resourceclaim", f"steal-{i}", "-n", "cd-policy-tenant")
                    return False
                assert "is for the IMEX daemons" in result.stderr, result.stderr
                return True

            # A new policy takes a moment to be enforced, so poll.
            cluster.wait_for(refused, timeout=30, what=f"daemon claim {i} refused")
        channel = _claim("channel", "cd-policy-tenant", {"exactly": {"deviceClassName": cd.CHANNEL_CLASS}})
        cluster.kubectl("create", "-f", "-", input=json.dumps(channel))
        own = _claim("daemon", "cd-policy-daemons", daemon)
        cluster.kubectl("create", "-f", "-", input=json.dumps(own))
    finally:
        for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
            cluster.kubectl("delete", kind, "accel-dra-compute-domain-daemon-claims", "--ignore-not-found")
        for ns in ("cd-policy-tenant", "cd-policy-daemons"):
            cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false")
