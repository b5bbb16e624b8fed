"""An Indexed Job whose claim template does not pin a TPU slice lands on hosts of two physical
slices (each host publishes its sliceId): the operator, which sees every pod, claim and slice,
posts a Warning TpuSliceMixed on each pod naming which worker is on which slice. kube-scheduler
allocates the claims; the operator only explains."""

from __future__ import annotations

from typing import Any

from dra_devcluster import LocalCluster
from tests.integration.objects import resource_slice
from tests.integration.operator.conftest import Operators, events_for

TPU = "tpu.google.com"
REASON = "TpuSliceMixed"


def _host(node: str, *, slice_id: str) -> dict[str, Any]:
    """One v5p host of a 2x2x4 slice: four chips that say which slice they belong to."""
    attributes = {
        "tpuGen": {"string": "v5p"},
        "topology": {"string": "2x2x4"},
        "sliceId": {"string": slice_id},
        "workerId": {"int": 0},
    }
    devices = [{"name": f"accel{i}", "attributes": attributes} for i in range(4)]
    return resource_slice(driver=TPU, node=node, devices=devices)


def test_a_job_spread_over_two_slices_gets_a_warning_on_each_pod(
    local_cluster: LocalCluster, operators: Operators, scratch: list[tuple[str, ...]]
) -> None:
    ns = "op-tpu-mixed"
    local_cluster.create_namespace(ns)
    scratch.append(("namespace", ns))
    for node, slice_id in (("op-tpu-a0", "mixed-a"), ("op-tpu-b0", "mixed-b")):
        local_cluster.add_node(node)
        scratch.append(("node", node))
        local_cluster.apply([_host(node, slice_id=slice_id)])
        scratch.append(("resourceslice", f"{node}-{TPU}"))
    operators.start()
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "host", "namespace": ns},
        # Every chip of one host, any v5p host: nothing keeps the Job on one slice.
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "tpu",
                            "exactly": {
                                "deviceClassName": operators.tpu_class,
                                "allocationMode": "All",
                                "selectors": [
                                    {"cel": {"expression": f'device.attributes["{TPU}"].tpuGen == "v5p"'}}
                                ],
                            },
                        }
                    ]
                }
            }
        },
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": ns},
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "completionMode": "Indexed",
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "subdomain": "train",
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.invalid/sleep:1",
                            "command": ["sleep", "infinity"],
                            "resources": {"claims": [{"name": "tpu"}]},
                        }
                    ],
                    "resourceClaims": [{"name": "tpu", "resourceClaimTemplateName": "host"}],
                }
            },
        },
    }
    local_cluster.wait_for(
        lambda: local_cluster.kubectl("get", "deviceclass", operators.tpu_class, check=False).returncode == 0,
        what="the operator's TPU class",
    )
    local_cluster.apply([template, job])

    def bound() -> list[dict[str, Any]] | None:
        pods: list[dict[str, Any]] = local_cluster.get_json(
            "pods", "-n", ns, "-l", "batch.kubernetes.io/job-name=train"
        )["items"]
        ready = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
        return ready if len(ready) == 2 else None

    pods = local_cluster.wait_for(bound, timeout=90, what="both pods of the Job bound")
    assert {p["spec"]["nodeName"] for p in pods} == {"op-tpu-a0", "op-tpu-b0"}

    def warned(name: str) -> str | None:
        found = [e["message"] for e in events_for(local_cluster, ns, name) if e["reason"] == REASON]
        return found[0] if found else None

    for p in pods:
        name = p["metadata"]["name"]
        message = local_cluster.wait_for(
            lambda name=name: warned(name), timeout=60, what=f"{REASON} on {name}"
        )
        assert f"the pods of Job {ns}/train are on hosts of 2 physical TPU slices" in message, message
        index = p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        slice_id = "mixed-a" if p["spec"]["nodeName"] == "op-tpu-a0" else "mixed-b"
        assert f"worker {index} on slice {slice_id} (nodes {p['spec']['nodeName']})" in message, message
    local_cluster.kubectl("delete", "job", "train", "-n", ns, "--cascade=background", "--wait=false")
