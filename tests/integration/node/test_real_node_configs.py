"""Opaque configs on a real node: a config the driver does not carry out fails the prepare with
the agent's message in the pod's Events and leaves nothing prepared; a config it carries out reaches
the container (Google's TPU logging settings, as environment)."""

from __future__ import annotations

from typing import Any

from tests.integration.agent.agentproc import GPU, TPU
from tests.integration.node.conftest import NAMESPACE, NODE, NodeWithAgent, gpu_pod, wait_gone
from tests.integration.objects import device_class

TPU_CLASS = "real-node-tpu"


def with_config(
    objects: list[dict[str, Any]], driver: str, parameters: dict[str, Any]
) -> list[dict[str, Any]]:
    """``gpu_pod``'s objects with one opaque config entry on the claim template's request."""
    template = objects[0]
    template["spec"]["spec"]["devices"]["config"] = [
        {"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}
    ]
    return objects


def warning_with(setup: NodeWithAgent, pod: str, text: str) -> str | None:
    events = setup.cluster.get_json("events", "-n", NAMESPACE, f"--field-selector=involvedObject.name={pod}")
    messages = [e.get("message", "") for e in events["items"] if e.get("type") == "Warning"]
    return next((m for m in messages if text in m), None)


def test_a_config_the_driver_does_not_implement_fails_the_prepare_with_its_reason(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    # NVIDIA's compute-domain channel config given to the GPU driver: it configures the other driver
    # (compute-domain.nvidia.com, served beside it with --compute-domains), so the GPU driver refuses
    # it (VfioDeviceConfig and MPS on MIG devices, refused before, are carried out now).
    channel = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig"}
    setup.cluster.apply(with_config(gpu_pod("gpu-channel", command="echo should not run"), GPU, channel))
    message = setup.cluster.wait_for(
        lambda: warning_with(setup, "gpu-channel", "give it to that driver"),
        timeout=90,
        what="a Warning Event with the agent's refusal",
    )
    # The agent's own words, passed on by the kubelet: which entry, which field, and why.
    assert "ComputeDomainChannelConfig configures NVIDIA's compute-domain driver" in message, message
    assert "config[0]" in message, message
    uid = setup.claim_of("gpu-channel")["metadata"]["uid"]
    pod = setup.cluster.get_json("pod", "gpu-channel", "-n", NAMESPACE)
    assert pod["status"]["phase"] == "Pending"
    assert setup.pod_log("gpu-channel") == ""
    assert not setup.agent.dirs.cdi_spec(uid).exists()
    setup.cluster.kubectl("delete", "pod", "gpu-channel", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    assert not setup.agent.dirs.cdi_spec(uid).exists()
    assert uid not in setup.agent.dirs.checkpoint_claims()


def test_an_accepted_gpu_config_lets_the_pod_run(node_with_agent: NodeWithAgent) -> None:
    setup = node_with_agent
    # NVIDIA's GpuConfig without sharing: valid, and nothing in it this driver lacks.
    plain = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
    setup.cluster.apply(with_config(gpu_pod("gpu-plain-config", command="echo done; sleep 3600"), GPU, plain))
    setup.wait_log("gpu-plain-config", "done")
    uid = setup.claim_of("gpu-plain-config")["metadata"]["uid"]
    assert uid in setup.agent.dirs.checkpoint_claims()
    setup.cluster.kubectl(
        "delete", "pod", "gpu-plain-config", "-n", NAMESPACE, "--wait=true", "--timeout=60s"
    )
    wait_gone(setup.cluster, setup.agent.dirs.cdi_spec(uid))
    assert uid not in setup.agent.dirs.checkpoint_claims()


def test_google_tpu_logging_config_reaches_the_container(node_with_agent: NodeWithAgent) -> None:
    setup = node_with_agent
    # The same node also serves a simulated TPU host for this test.
    setup.agent.stop()
    setup.agent.profiles = ("h100-80gb-x8", "tpu-v4-2x2x1")
    setup.agent.start()
    try:
        setup.cluster.apply([device_class(TPU_CLASS, driver=TPU)])
        objects = gpu_pod(
            "tpu-logging",
            command="env | grep -E '^TPU_(MIN|STDERR)_LOG_LEVEL=' | sort; echo done; sleep 3600",
        )
        request = objects[0]["spec"]["spec"]["devices"]["requests"][0]
        request["exactly"] = {"deviceClassName": TPU_CLASS, "allocationMode": "All"}
        google = {
            "apiVersion": "tpu.resource.google.com/v1alpha1",
            "kind": "TpuConfig",
            "logging": {"level": 2},
        }
        setup.cluster.apply(with_config(objects, TPU, google))
        log = setup.wait_log("tpu-logging", "done")
        # stderrLevel follows level (Google's default); the CDI spec put both in the environment.
        assert "TPU_MIN_LOG_LEVEL=2" in log.splitlines(), log
        assert "TPU_STDERR_LOG_LEVEL=2" in log.splitlines(), log
        claim = setup.claim_of("tpu-logging")
        results = claim["status"]["allocation"]["devices"]["results"]
        assert {r["driver"] for r in results} == {TPU}
        assert {r["pool"] for r in results} == {NODE}
        uid = claim["metadata"]["uid"]
        spec = setup.agent.dirs.cdi_spec(uid, driver=TPU)
        assert spec.exists()
        setup.cluster.kubectl("delete", "pod", "tpu-logging", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
        wait_gone(setup.cluster, spec)
        assert uid not in setup.agent.dirs.checkpoint_claims(TPU)
    finally:
        setup.cluster.kubectl("delete", "deviceclass", TPU_CLASS, "--ignore-not-found", check=False)
        setup.agent.stop()
        setup.agent.profiles = ("h100-80gb-x8",)
        setup.agent.start()
