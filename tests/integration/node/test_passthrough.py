"""GPU passthrough on a real node (``--passthrough-support``): a pod whose claim is written as
KubeVirt's user guide writes it (class ``vfio.gpu.nvidia.com``, a ``VfioDeviceConfig`` asking for
the legacy backend and vfio's API device) stands in for a virt-launcher pod. Its GPU is bound to
vfio-pci in the node's simulated sysfs, the container receives the IOMMU group's device node and
/dev/vfio/vfio (and nothing of the NVIDIA driver's), the GPU's CUDA device leaves the slice while
it is bound; when the pod goes, the GPU is the NVIDIA driver's again and published as before. An
agent killed between the two binding steps gives the GPU back at start-up, and the kubelet's retry
takes it again. While a claim holds a GPU's CUDA device (allocated, not yet prepared), kube-scheduler
does not give the same GPU to a VM: the two devices consume one counter.

NVIDIA's quickstart passthrough examples (gpu-test-vfiopci, gpu-test-vfio-config) are applied as
written but for their image (see ``nvidia_examples``).

One node for the module; its agent starts paused at the first binding's middle step (the crash
test runs first), and runs on unpaused after its restart.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_devcluster.images import WORKLOAD_IMAGE
from dra_node_agent.pci import bound_driver, iommu_group
from dra_node_agent.pci_binding import PciDriverBinding
from dra_node_agent.prepare import PAUSE_ENV
from tests.integration.agent.agentproc import GPU
from tests.integration.node import nvidia_examples as examples
from tests.integration.node.conftest import CLASS as CUDA_CLASS
from tests.integration.node.conftest import NAMESPACE, NODE, NodeWithAgent
from tests.integration.node.test_real_node import _registrations, _wait_registered

REPO = Path(__file__).parents[3]
AGENT_ENV = {"DRA_AGENT_PASSTHROUGH_SUPPORT": "true", PAUSE_ENV: "vfio-unbound"}
CLASS = "vfio.gpu.nvidia.com"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
# What the virt-launcher stand-in prints: every character device under /dev/vfio, and how many
# NVIDIA device nodes it has (none: a VM's GPU is no CUDA device).
SHOW = (
    "for f in /dev/vfio/*; do [ -c $f ] && echo char $f; done; "
    "echo nvidia-nodes=$(ls /dev | grep -c '^nvidia'); echo shown; sleep 3600"
)


def kubevirt_pod(name: str, *, selector: str | None = None) -> list[dict[str, Any]]:
    """KubeVirt's user guide's claim template, as written there, and a pod that uses it as
    virt-launcher would (``resourceClaims`` naming the template, the container claiming it);
    ``selector``: a CEL selector added to its request."""
    exactly: dict[str, Any] = {"allocationMode": "ExactCount", "count": 1, "deviceClassName": CLASS}
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"{name}-template", "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {
                    "config": [
                        {
                            "requests": ["dra-gpu"],
                            "opaque": {
                                "driver": "gpu.nvidia.com",
                                "parameters": {
                                    "apiVersion": "resource.nvidia.com/v1beta1",
                                    "kind": "VfioDeviceConfig",
                                    "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": True},
                                },
                            },
                        }
                    ],
                    "requests": [{"name": "dra-gpu", "exactly": exactly}],
                }
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "dra-gpu-claim", "resourceClaimTemplateName": f"{name}-template"}],
            "containers": [
                {
                    "name": "main",
                    "image": WORKLOAD_IMAGE,
                    "command": ["sh", "-c", SHOW],
                    "resources": {"claims": [{"name": "dra-gpu-claim"}]},
                }
            ],
        },
    }
    return [template, pod]


def sysfs(setup: NodeWithAgent) -> Path:
    (hardware,) = (setup.agent.dirs.state / "simulated").iterdir()
    return hardware / "sys"


def published(setup: NodeWithAgent) -> dict[str, dict[str, Any]]:
    slices = setup.cluster.get_json("resourceslices", f"--field-selector=spec.nodeName={NODE}")["items"]
    return {
        d["name"]: d for s in slices if s["spec"]["driver"] == GPU for d in s["spec"].get("devices") or []
    }


def allocated(setup: NodeWithAgent, pod: str) -> tuple[str, str]:
    """The pod's passthrough device and its GPU's PCI address."""
    (result,) = setup.claim_of(pod)["status"]["allocation"]["devices"]["results"]
    device = str(result["device"])
    address = published(setup)[device]["attributes"][PCI_BUS_ID]["string"]
    return device, str(address)


def assert_gets_the_group(setup: NodeWithAgent, pod: str) -> tuple[str, str]:
    log = setup.wait_log(pod, "shown", timeout=180)
    device, address = allocated(setup, pod)
    group = iommu_group(sysfs(setup), address)
    chars = sorted(line.split()[1] for line in log.splitlines() if line.startswith("char "))
    assert chars == [f"/dev/vfio/{group}", "/dev/vfio/vfio"], log
    assert "nvidia-nodes=0" in log, log
    assert bound_driver(sysfs(setup), address) == "vfio-pci"
    return device, address


def gpu_at(devices: dict[str, dict[str, Any]], address: str) -> str | None:
    """The CUDA device (``type=gpu``) of the GPU at ``address`` among ``devices``, if there is one."""
    for name, device in devices.items():
        attributes = device["attributes"]
        if attributes["type"]["string"] == "gpu" and attributes[PCI_BUS_ID]["string"] == address:
            return name
    return None


def delete_and_see_it_back(setup: NodeWithAgent, pod: str, address: str, gpu: str) -> None:
    setup.cluster.kubectl("delete", "pod", pod, "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    setup.cluster.wait_for(
        lambda: bound_driver(sysfs(setup), address) == "nvidia" and gpu_at(published(setup), address) == gpu,
        timeout=60,
        what="the GPU back on the NVIDIA driver and published again",
    )
    assert PciDriverBinding(sysfs(setup)).override(address) is None


@pytest.fixture(scope="module", autouse=True)
def vfio_class(node_with_agent: NodeWithAgent) -> Iterator[None]:
    """The DeviceClass the optional manifests ship for GPUs for passthrough."""
    cluster = node_with_agent.cluster
    cluster.apply((REPO / "manifests/optional/passthrough/deviceclass-vfio.yaml").read_text())
    yield
    cluster.kubectl("delete", "deviceclass", CLASS, "--ignore-not-found", check=False)


def test_killed_between_the_binding_steps_the_gpu_goes_back_at_start_up_and_the_retry_takes_it(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    before = published(setup)
    kinds = {name: d["attributes"]["type"]["string"] for name, d in before.items()}
    assert sorted(n for n, kind in kinds.items() if kind == "vfio") == [f"gpu-vfio-{i}" for i in range(8)]
    marker = setup.agent.dirs.state / GPU / "paused-at-vfio-unbound"
    cluster.apply(kubevirt_pod("vm-crash"))
    cluster.wait_for(marker.exists, timeout=90, what="the prepare paused between the binding steps")
    _, address = allocated(setup, "vm-crash")
    gpu = gpu_at(before, address)
    assert gpu is not None
    assert bound_driver(sysfs(setup), address) is None  # let go by the NVIDIA driver, not vfio-pci's yet
    recorded = setup.agent.dirs.checkpoint_claims()[setup.claim_of("vm-crash")["metadata"]["uid"]]
    assert recorded["state"] == "PrepareStarted"
    assert recorded["devices"][0]["vfio"]["pciBusID"] == address

    # Killed there. At start-up the agent gives the GPU back; the kubelet's retry takes it again.
    registered = _registrations(setup)
    setup.agent.kill()
    marker.unlink()
    setup.agent.start(env={PAUSE_ENV: ""})
    _wait_registered(setup, more_than=registered)
    assert f"giving GPU {address} (device " in setup.agent.log_text()
    assert_gets_the_group(setup, "vm-crash")
    # While a VM has it, the GPU is no CUDA device: gone from the slice.
    cluster.wait_for(
        lambda: gpu_at(published(setup), address) is None, timeout=60, what="the GPU's CUDA device withheld"
    )
    delete_and_see_it_back(setup, "vm-crash", address, gpu)


def test_a_kubevirt_claim_gets_its_gpus_iommu_group_and_gives_the_gpu_back(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    before = published(setup)
    setup.cluster.apply(kubevirt_pod("vm"))
    device, address = assert_gets_the_group(setup, "vm")
    gpu = gpu_at(before, address)
    assert gpu is not None
    setup.cluster.wait_for(
        lambda: gpu_at(published(setup), address) is None, timeout=60, what="the GPU's CUDA device withheld"
    )
    assert device in published(setup)  # its passthrough device stays: its claim holds it
    delete_and_see_it_back(setup, "vm", address, gpu)


def test_kube_scheduler_does_not_give_a_gpu_for_passthrough_while_a_claim_holds_it_as_cuda_device(
    node_with_agent: NodeWithAgent,
) -> None:
    """Between an allocation and its prepare, a GPU's CUDA and passthrough devices are both in the
    slice: the counter they both consume keeps kube-scheduler from giving the second to a VM."""
    setup = node_with_agent
    cluster = setup.cluster
    address = published(setup)["gpu-vfio-7"]["attributes"][PCI_BUS_ID]["string"]
    gpu = gpu_at(published(setup), address)
    assert gpu is not None
    # Another allocator's decision, as it writes it: the GPU's CUDA device, allocated, not prepared.
    holder = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "cuda-holder", "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CUDA_CLASS}}]}},
    }
    cluster.apply([holder])
    node_selector = {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]
    }
    result = {"request": "gpu", "driver": GPU, "pool": NODE, "device": gpu}
    allocation = {"devices": {"results": [result]}, "nodeSelector": node_selector}
    cluster.kubectl(
        "patch", "resourceclaim", "cuda-holder", "-n", NAMESPACE, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"allocation": allocation}}),
    )  # fmt: skip
    assert "gpu-vfio-7" in published(setup)  # nothing prepared: both devices are still offered
    at_address = f'device.attributes["resource.kubernetes.io"].pciBusID == "{address}"'
    cluster.apply(kubevirt_pod("vm-late", selector=at_address))

    def unschedulable() -> str | None:
        conditions = cluster.get_json("pod", "vm-late", "-n", NAMESPACE).get("status", {}).get("conditions")
        for condition in conditions or []:
            if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return str(condition.get("message", ""))
        return None

    why = cluster.wait_for(unschedulable, timeout=60, what="kube-scheduler to leave the VM pod pending")
    assert "cannot allocate all claims" in why, why
    # The CUDA claim gone, the VM gets the GPU.
    cluster.kubectl("delete", "resourceclaim", "cuda-holder", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    device, _ = assert_gets_the_group(setup, "vm-late")
    assert device == "gpu-vfio-7"
    delete_and_see_it_back(setup, "vm-late", address, gpu)


VFIO_SHOW = (
    "for f in /dev/vfio/*; do [ -c $f ] && echo char $f; done; "
    "echo nvidia-nodes=$(ls /dev | grep -c '^nvidia')"
)


def example_gets_the_group(setup: NodeWithAgent, namespace: str) -> tuple[str, list[str]]:
    """The PCI address of the GPU the namespace's one pod runs with, and the character devices
    under its /dev/vfio; the GPU is vfio-pci's and the pod has no NVIDIA device node."""
    (pod,) = examples.running_pods(setup.cluster, namespace, count=1)
    claim = examples.claim_of(setup.cluster, pod)
    ((result,),) = examples.results(claim).values()
    address = str(published(setup)[result["device"]]["attributes"][PCI_BUS_ID]["string"])
    assert bound_driver(sysfs(setup), address) == "vfio-pci"
    shown = examples.in_container(setup.cluster, pod, "ctr", VFIO_SHOW).splitlines()
    assert "nvidia-nodes=0" in shown, shown
    return address, sorted(line.split()[1] for line in shown if line.startswith("char "))


def test_nvidias_passthrough_examples_vfiopci_runs_and_vfio_config_puts_its_pod_in_no_namespace(
    node_with_agent: NodeWithAgent,
) -> None:
    """NVIDIA's quickstart gpu-test-vfiopci (one GPU of class vfio.gpu.nvidia.com) and
    gpu-test-vfio-config (the same with VfioDeviceConfig, legacy backend and vfio's API device).
    The second creates namespace gpu-test-vfio but puts its Pod in gpu-test-vfiopci, which nothing
    creates: as written the Pod is refused; moved to gpu-test-vfio it runs."""
    setup = node_with_agent
    cluster = setup.cluster
    if setup.agent.starts == 1:  # run alone: the first test restarts the agent without the pause
        before = _registrations(setup)
        setup.agent.stop()
        setup.agent.start(env={PAUSE_ENV: ""})
        _wait_registered(setup, more_than=before)
    plain = examples.example_docs("gpu-test-vfiopci")
    with examples.applied(setup, plain):
        address, chars = example_gets_the_group(setup, "gpu-test-vfio")
        # No config: the default, which leaves vfio's API device out.
        assert chars == [f"/dev/vfio/{iommu_group(sysfs(setup), address)}"]
    assert bound_driver(sysfs(setup), address) == "nvidia"

    configured = examples.example_docs("gpu-test-vfio-config")
    (pod,) = [d for d in configured if d["kind"] == "Pod"]
    assert pod["metadata"]["namespace"] == "gpu-test-vfiopci"
    try:
        with pytest.raises(subprocess.CalledProcessError) as refused:
            cluster.apply(configured)
        assert 'namespaces "gpu-test-vfiopci" not found' in refused.value.stderr
        assert cluster.get_json("resourceclaimtemplates", "-n", "gpu-test-vfio")["items"]
        assert not cluster.get_json("pods", "-n", "gpu-test-vfio")["items"]
        # The Pod in the namespace the file creates: the config's legacy backend and API device.
        pod["metadata"]["namespace"] = "gpu-test-vfio"
        cluster.apply([pod])
        address, chars = example_gets_the_group(setup, "gpu-test-vfio")
        assert chars == [f"/dev/vfio/{iommu_group(sysfs(setup), address)}", "/dev/vfio/vfio"]
    finally:
        examples.remove_example(setup, configured)
    assert bound_driver(sysfs(setup), address) == "nvidia"
