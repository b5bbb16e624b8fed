"""A tenant as an attacker, on a real kubelet: what a pod, a claim's opaque config or a Job can make
the agent do. Each hostile attempt ends in a clear prepare error (the agent's words in the pod's
Events, nothing prepared) or a contained effect, and a bystander pod that holds a GPU of the same
node since the start is untouched by all of them: still running, never restarted, its CDI spec and
checkpoint entry unchanged.

- the variable without a claim: ``NVIDIA_VISIBLE_DEVICES=all`` in a pod with no claim gives it no
  device node and no driver tool; in a pod with a claim it gives nothing beyond the claim's GPU (the
  spec sets ``void``, mounts the driver root's files, and names only the claim's device nodes);
- an Indexed Job far larger than any TPU slice, whose pod claims a host of a multi-host slice;
- forged opaque configs: a key carrying a forged log line, an oversized value, the most config
  entries a claim may carry, a config naming another driver, and one trying to set environment,
  mounts and hooks.

The node's agent serves simulated H100s and one host of a simulated v5p 2x2x4 slice (4 hosts).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_devcluster.images import WORKLOAD_IMAGE
from tests.integration.agent.agentproc import GPU, TPU
from tests.integration.node.conftest import NAMESPACE, NODE, NodeWithAgent, gpu_pod, wait_gone
from tests.integration.objects import device_class

_TPU_ENV = Path(tempfile.mkdtemp(prefix="dra-hostile-")) / "tpu-env"
_TPU_ENV.write_text("TOPOLOGY: '2x2x4'\nWORKER_ID: '0'\nSLICE_ID: 'hostile-slice'\n")
AGENT_PROFILES = ("h100-80gb-x8", "tpu-v5p-2x2x4")
AGENT_ENV = {"DRA_AGENT_TPU_ENV_FILE": str(_TPU_ENV)}
TPU_CLASS = "hostile-tpu"
NVIDIA = "resource.nvidia.com/v1beta1"
FORGED = "2026-11-27 10:00:00,000 INFO dra_node_agent.prepare.claim_steps: prepared kube-system/forged"


@pytest.fixture(scope="module")
def bystander(node_with_agent: NodeWithAgent) -> Iterator[dict[str, Any]]:
    """Another tenant's pod with a GPU, running before and through every hostile attempt."""
    setup = node_with_agent
    setup.cluster.apply([device_class(TPU_CLASS, driver=TPU)])
    setup.cluster.apply(gpu_pod("bystander", command="nvidia-smi -L; echo done; sleep 3600"))
    setup.wait_log("bystander", "done")
    claim = setup.claim_of("bystander")
    uid = claim["metadata"]["uid"]
    spec = setup.agent.dirs.cdi_spec(uid)
    yield {"uid": uid, "spec": spec.read_text(), "log": setup.pod_log("bystander")}
    setup.cluster.kubectl("delete", "deviceclass", TPU_CLASS, "--ignore-not-found", check=False)


def assert_bystander_untouched(setup: NodeWithAgent, bystander: dict[str, Any]) -> None:
    pod = setup.cluster.get_json("pod", "bystander", "-n", NAMESPACE)
    assert pod["status"]["phase"] == "Running", pod["status"]
    assert [c["restartCount"] for c in pod["status"]["containerStatuses"]] == [0]
    assert setup.agent.dirs.cdi_spec(bystander["uid"]).read_text() == bystander["spec"]
    assert setup.agent.dirs.checkpoint_claims()[bystander["uid"]]["state"] == "PrepareCompleted"
    assert setup.pod_log("bystander") == bystander["log"]
    assert setup.agent.process is not None
    assert setup.agent.process.poll() is None  # the agent never went down


def warning_with(setup: NodeWithAgent, pod: str, text: str) -> str | None:
    events = setup.cluster.get_json("events", "-n", NAMESPACE, f"--field-selector=involvedObject.name={pod}")
    messages = [e.get("message", "") for e in events["items"] if e.get("type") == "Warning"]
    return next((m for m in messages if text in m), None)


def wait_refusal(setup: NodeWithAgent, pod: str, text: str) -> str:
    message: str = setup.cluster.wait_for(
        lambda: warning_with(setup, pod, text), timeout=120, what=f"the agent's refusal of {pod}: {text!r}"
    )
    return message


def assert_nothing_prepared(setup: NodeWithAgent, pod: str) -> None:
    uid = setup.claim_of(pod)["metadata"]["uid"]
    assert setup.cluster.get_json("pod", pod, "-n", NAMESPACE)["status"]["phase"] == "Pending"
    assert setup.pod_log(pod) == ""
    assert not setup.agent.dirs.cdi_spec(uid).exists()
    assert uid not in setup.agent.dirs.checkpoint_claims()


def delete_pods(setup: NodeWithAgent, *names: str) -> None:
    setup.cluster.kubectl("delete", "pod", *names, "-n", NAMESPACE, "--wait=true", "--timeout=90s")


def test_the_variable_without_a_claim_gives_no_gpu_and_with_one_nothing_more(
    node_with_agent: NodeWithAgent, bystander: dict[str, Any]
) -> None:
    setup = node_with_agent
    show = (
        "ls /dev; nvidia-smi -L; echo visible=$NVIDIA_VISIBLE_DEVICES; "
        "ls /usr/lib/x86_64-linux-gnu/libcuda.so.1; echo done; sleep 3600"
    )
    bare = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "no-claim", "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": WORKLOAD_IMAGE,
                    "command": ["sh", "-c", show],
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                }
            ],
        },
    }
    template, claimed = gpu_pod("one-gpu", command=show)
    claimed["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    setup.cluster.apply([bare, template, claimed])
    lines = setup.wait_log("no-claim", "done").splitlines()
    assert not [line for line in lines if line.startswith("nvidia")], lines  # no /dev/nvidia* at all
    assert any("nvidia-smi: not found" in line for line in lines), lines
    assert not [line for line in lines if line.startswith("GPU ")], lines
    assert any("libcuda.so.1" in line and "No such file" in line for line in lines), lines

    lines = setup.wait_log("one-gpu", "done").splitlines()
    (result,) = setup.claim_of("one-gpu")["status"]["allocation"]["devices"]["results"]
    slices = setup.cluster.get_json(
        "resourceslices", f"--field-selector=spec.nodeName={NODE},spec.driver={GPU}"
    )
    uuid = next(
        d["attributes"]["uuid"]["string"]
        for s in slices["items"]
        for d in s["spec"]["devices"]
        if d["name"] == result["device"]
    )
    minor = result["device"].removeprefix("gpu-")
    # Its own GPU's node (and the control nodes), the driver's files, and the variable void.
    gpu_nodes = [line for line in lines if line.startswith("nvidia") and line[len("nvidia") :].isdigit()]
    assert gpu_nodes == [f"nvidia{minor}"], lines
    listed = [line for line in lines if line.startswith("GPU ")]
    assert len(listed) == 1, lines
    assert f"(UUID: {uuid})" in listed[0], lines
    assert "visible=void" in lines, lines
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in lines, lines
    delete_pods(setup, "no-claim", "one-gpu")
    assert_bystander_untouched(setup, bystander)


def huge_tpu_job(name: str, *, completions: int) -> list[dict[str, Any]]:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "tpu", "exactly": {"deviceClassName": TPU_CLASS, "allocationMode": "All"}}
                    ]
                }
            }
        },
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "completionMode": "Indexed",
            "completions": completions,
            "parallelism": 1,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "subdomain": "workers",
                    "restartPolicy": "Never",
                    "nodeSelector": {"kubernetes.io/hostname": NODE},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": WORKLOAD_IMAGE,
                            "command": ["sh", "-c", "echo should not run"],
                            "resources": {"claims": [{"name": "tpu"}]},
                        }
                    ],
                    "resourceClaims": [{"name": "tpu", "resourceClaimTemplateName": name}],
                }
            },
        },
    }
    return [template, job]


def test_an_indexed_job_far_larger_than_any_slice_fails_the_prepare_naming_it(
    node_with_agent: NodeWithAgent, bystander: dict[str, Any]
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    cluster.apply(huge_tpu_job("huge", completions=100_000))

    def pod_name() -> str | None:
        pods = cluster.get_json("pods", "-n", NAMESPACE, "-l", "batch.kubernetes.io/job-name=huge")["items"]
        return pods[0]["metadata"]["name"] if pods else None

    pod: str = cluster.wait_for(pod_name, timeout=60, what="the Job's first pod")
    message = wait_refusal(setup, pod, "has 100000 completions")
    assert (
        f"Job {NAMESPACE}/huge has 100000 completions, more than the 2304 hosts of the largest TPU slice"
        in message
    )
    assert_nothing_prepared(setup, pod)
    cluster.kubectl(
        "delete", "job", "huge", "-n", NAMESPACE, "--cascade=foreground", "--wait=true", "--timeout=90s"
    )
    cluster.kubectl("delete", "resourceclaimtemplate", "huge", "-n", NAMESPACE, "--wait=true")
    assert_bystander_untouched(setup, bystander)


def with_configs(objects: list[dict[str, Any]], entries: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    objects[0]["spec"]["spec"]["devices"]["config"] = [
        {"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}
        for driver, parameters in entries
    ]
    return objects


def gpu_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": NVIDIA, "kind": "GpuConfig", **fields}


def test_forged_opaque_configs_are_refused_in_one_line_or_have_no_effect(
    node_with_agent: NodeWithAgent, bystander: dict[str, Any]
) -> None:
    setup = node_with_agent
    quiet = "echo should not run"
    padded = gpu_config(metadata={"annotations": {"pad": "x" * 2500}})
    refused = {
        # A key that carries a forged log line of the agent's.
        "forged-key": (gpu_config(**{"x\n" + FORGED: 1}), 'unknown field "x\\n2026-11-27'),
        # A value as large as the API server allows, echoed back cut short.
        "oversized": (gpu_config(sharing={"strategy": "A" * 9000}), 'unknown GPU sharing strategy: "AAAA'),
        # Environment, mounts and hooks are no fields of any kind: a config cannot write the spec.
        "edits": (
            gpu_config(
                containerEdits={"env": ["LD_PRELOAD=/tmp/x.so"]},
                env=["LD_PRELOAD=/tmp/x.so"],
                hooks=[{"hookName": "createContainer", "path": "/bin/sh"}],
            ),
            'unknown field "containerEdits"',
        ),
    }
    objects = []
    for name, (parameters, _) in refused.items():
        objects += with_configs(gpu_pod(name, command=quiet), [(GPU, parameters)])
    # The most entries a claim may carry (32), 2.5 KiB each: within the API's limits, past the agent's.
    objects += with_configs(gpu_pod("many-configs", command=quiet), [(GPU, padded)] * 32)
    # Another driver's config, saying what it likes: not this agent's to read, and it reaches nothing.
    other = {"env": ["LD_PRELOAD=/tmp/x.so"], "mounts": [{"hostPath": "/", "containerPath": "/host"}]}
    objects += with_configs(
        gpu_pod("other-driver", command="env; ls /host; echo done; sleep 3600"), [("evil.example.com", other)]
    )
    setup.cluster.apply(objects)

    for name, (_, text) in refused.items():
        message = wait_refusal(setup, name, text)
        assert "\n" not in message, message
        assert len(message) < 1500, len(message)  # the 9000-character value is not echoed whole
        assert_nothing_prepared(setup, name)
    message = wait_refusal(setup, "many-configs", "more than the 65536 bytes")
    assert "opaque configs for gpu.nvidia.com" in message, message
    assert_nothing_prepared(setup, "many-configs")
    lines = setup.wait_log("other-driver", "done").splitlines()
    assert not [line for line in lines if "LD_PRELOAD" in line], lines
    assert any("/host" in line and "No such file" in line for line in lines), lines

    # The forged line is in the agent's log only escaped, inside the line that reports the refusal.
    agent_log = setup.agent.log_text().splitlines()
    assert not [line for line in agent_log if line.startswith(FORGED[:23])], [
        line for line in agent_log if FORGED[:23] in line
    ]
    assert [line for line in agent_log if "\\n" + FORGED[:23] in line], agent_log[-20:]

    names = [*refused, "many-configs", "other-driver"]
    uids = [setup.claim_of(name)["metadata"]["uid"] for name in names]
    delete_pods(setup, *names)
    for uid in uids:
        wait_gone(setup.cluster, setup.agent.dirs.cdi_spec(uid))
        assert uid not in setup.agent.dirs.checkpoint_claims()
    assert_bystander_untouched(setup, bystander)
