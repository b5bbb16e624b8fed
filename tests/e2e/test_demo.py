"""The README's first command, end to end: `dra-local-cluster demo --exit` as a user runs it.

It starts its own control plane, three real nodes (kubelet + containerd), the operator and three
node agents as processes, and applies the examples, whose containers print their devices; the test
reads what the demo prints, as a user would. `--fake-nodes` (no kubelet; the demo plays it) is
checked too.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_devcluster import resolve_kubernetes_version
from dra_devcluster.node import mounts_under


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Short, as a node's /var/lib/kubelet is: unix socket paths are limited to 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="demo-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run_demo(workdir: Path, *extra: str) -> str:
    script = Path(sys.executable).parent / "dra-local-cluster"
    result = subprocess.run(
        [str(script), "demo", "--exit", "--workdir", str(workdir), *extra],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    output = result.stdout
    assert result.returncode == 0, f"demo failed:\n{output[-4000:]}\n{result.stderr[-4000:]}"
    # Every example's claim is allocated by kube-scheduler and reserved for its pod.
    claims = re.findall(r"^(\S+)\s+(\S+)\s+allocated,reserved\s", output, re.MULTILINE)
    assert sorted(ns for ns, _ in claims) == [
        "dra-example-gke-gpu",
        "dra-example-gke-tpu",
        "dra-example-single-gpu",
        "gpu-share-a",
        "gpu-share-b",
        "gpu-test1",
        "gpu-test1",
        "gpu-test2",
        "gpu-test4",
    ], output
    # Everything it started is gone again.
    leftovers = subprocess.run(
        ["pgrep", "-f", str(workdir)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert leftovers == []
    # Nor is anything still mounted there (the kubelets' root dirs, pod volumes).
    assert mounts_under(workdir) == []
    return output


def test_demo_runs_the_examples_on_real_nodes_and_shows_their_devices(workdir: Path) -> None:
    output = _run_demo(workdir)
    # What the containers printed, from the agents' CDI specs: the GPU examples `nvidia-smi -L`
    # (the simulated node's stand-in, answering from the device nodes each container was given)...
    gpu_line = re.compile(
        r"^  \| GPU 0: NVIDIA (H100 80GB HBM3|A100-SXM4-40GB) \(UUID: GPU-[0-9a-f-]+\)$", re.M
    )
    per_pod = {
        section.split(" ", 1)[0]: len(gpu_line.findall(section))
        for section in output.split("\npod ")[1:]
        if "GPU 0:" in section
    }
    # GKE's example prints every minute (once or more); NVIDIA's once per container.
    assert per_pod.pop(next(k for k in per_pod if k.startswith("dra-example-gke-gpu/"))) >= 1, output
    assert per_pod == {
        "dra-example-single-gpu/pod1": 1,
        "gpu-share-a/pod": 1,
        "gpu-share-b/pod": 1,
        "gpu-test1/pod1": 1,
        "gpu-test1/pod2": 1,
        "gpu-test2/pod": 2,
        "gpu-test4/pod": 4,
    }, output
    migs = re.findall(r"^  \|   MIG (\S+) Device 0: \(UUID: MIG-[0-9a-f-]+\)$", output, re.MULTILINE)
    assert sorted(migs) == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"], output  # each container its own
    # ... the variable and the device files, through kubectl exec ...
    # (void, as in NVIDIA's generated specs: the spec itself gives the devices and the driver's files)
    assert re.search(r"^  \| NVIDIA_VISIBLE_DEVICES=void$", output, re.MULTILINE), output
    assert re.search(r"^  \| c\S+\s+\d+\s+\S+\s+\S+\s+195,\s+\d+ .* /dev/nvidia\d+$", output, re.MULTILINE)
    assert re.search(r"^  \| c\S+\s+\d+\s+\S+\s+\S+\s+195,\s+255 .* /dev/nvidiactl$", output, re.MULTILINE)
    # ... and the TPU example its environment, as in GKE's guide.
    assert re.search(r"^  \| TPU_ACCELERATOR_TYPE=v6e-8$", output, re.MULTILINE), output
    assert re.search(r"^  \| TPU_VISIBLE_CHIPS=0,1,2,3,4,5,6,7$", output, re.MULTILINE)
    assert re.search(r"^  \| TPU_DEVICE_\d+_RESOURCE_CLAIM=[0-9a-f-]{36}$", output, re.MULTILINE)
    # `ls -l /dev/vfio`: the eight chips' groups and the vfio container node, all character devices
    assert len(re.findall(r"^  \| c\S+\s.*\s243,\s+\d+ .* \d+$", output, re.MULTILINE)) == 8, output
    assert re.search(r"^  \| c\S+\s.*\s10,\s+196 .* vfio$", output, re.MULTILINE), output
    # The kubelet reports each device's health in the container's status, where its release has
    # ResourceHealthStatus on (beta from 1.36; alpha and off in 1.34 and 1.35, where the demo says so).
    healthy = re.findall(r"^    \S+: claim:\S+ (\S+) Healthy$", output, re.MULTILINE)
    release = resolve_kubernetes_version()
    if release.gate_enabled("ResourceHealthStatus"):
        # (named by the CDI device IDs the agents returned)
        assert len([r for r in healthy if r.startswith("k8s.gpu.nvidia.com/claim=")]) == 12, output
        assert len([r for r in healthy if r.startswith("k8s.tpu.google.com/claim=")]) == 8, output
    else:
        assert healthy == [], output
        said = f"(not reported: the kubelet's ResourceHealthStatus gate is off in Kubernetes {release.minor};"
        assert output.count(said) == len(re.findall(r"^pod \S+ on ", output, re.MULTILINE)), output
    assert re.search(
        r'^  dra_agent_device_healthy\{device="gpu-0",driver="gpu.nvidia.com"\} 1.0$', output, re.M
    )
    _check_shares(output, release.gate_enabled("DRAConsumableCapacity"))
    assert "DEMO INCOMPLETE" not in output
    assert "kubectl logs failed" not in output  # the API server reached every kubelet
    assert "export KUBECONFIG=" in output


def _check_shares(output: str, consumable_capacity: bool) -> None:
    """The shares example's two tenants hold one GPU together, each its own share of its memory
    (where the release serves consumable capacity; else each a whole GPU, and the demo says why)."""
    sections = {s.split(" ", 1)[0]: s for s in output.split("\npod ")[1:]}
    uuids = {
        pod: re.findall(
            r"^  \| GPU 0: NVIDIA H100 80GB HBM3 \(UUID: (GPU-[0-9a-f-]+)\)$", sections[pod], re.M
        )
        for pod in ("gpu-share-a/pod", "gpu-share-b/pod")
    }
    held = re.findall(
        r"^  gpu\.nvidia\.com gpu-node-1/(gpu-\d+): held by "
        r"gpu-share-a/pod \(30Gi\), gpu-share-b/pod \(30Gi\)$",
        output,
        re.M,
    )
    if not consumable_capacity:
        assert held == [], output
        assert "DRAConsumableCapacity off, so the API server drops the shares' capacity" in output
        assert uuids["gpu-share-a/pod"] != uuids["gpu-share-b/pod"], output
        return
    assert len(held) == 1, output
    # Both containers see the same GPU, and each its own share of it.
    assert len(uuids["gpu-share-a/pod"]) == 1, output
    assert uuids["gpu-share-a/pod"] == uuids["gpu-share-b/pod"], output
    shares = [re.findall(r"^  \| DRA_SHARE_GPU_\d+_ID=(\S+)$", sections[pod], re.M) for pod in uuids]
    assert [len(ids) for ids in shares] == [1, 1], output
    assert shares[0] != shares[1], output
    for pod in uuids:
        assert re.search(r"^  \| DRA_SHARE_GPU_\d+_MEMORY=30Gi$", sections[pod], re.M), output
        assert re.search(
            rf"^  claim \S+: {held[0]} \(gpu\.nvidia\.com, share \S+, memory 30Gi\)$", sections[pod], re.M
        )


def test_demo_without_a_kubelet_plays_it_and_shows_the_environment(workdir: Path) -> None:
    output = _run_demo(workdir, "--fake-nodes")
    # The kubelet's prepare returned CDI devices, and the containers would see them.
    assert "PREPARE ERROR" not in output
    assert re.search(r"env NVIDIA_VISIBLE_DEVICES=void$", output, re.MULTILINE)
    assert "env TPU_ACCELERATOR_TYPE=v6e-8" in output
    assert re.search(r"env TPU_VISIBLE_CHIPS=0,1,2,3,4,5,6,7$", output, re.MULTILINE)
    assert re.search(r"env TPU_DEVICE_\d+_RESOURCE_CLAIM=[0-9a-f-]{36}", output)
    assert "export KUBECONFIG=" in output


def test_ctrl_c_stops_everything_the_demo_started(workdir: Path) -> None:
    script = Path(sys.executable).parent / "dra-local-cluster"
    with subprocess.Popen(
        [str(script), "demo", "--workdir", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as demo:
        try:
            assert demo.stdout is not None
            seen: list[str] = []
            for line in demo.stdout:
                seen.append(line)
                if "Press Ctrl-C" in line:
                    break
            running = subprocess.run(
                ["pgrep", "-f", str(workdir)], capture_output=True, text=True, check=False
            )
            # Four control-plane components, the operator, three agents, three kubelets and their
            # containerds (and the containers' shims).
            assert len(running.stdout.split()) >= 14, "".join(seen[-20:])
            demo.send_signal(signal.SIGINT)
            # Stopping a running demo is how it is meant to end: a clean exit.
            assert demo.wait(timeout=90) == 0
        except BaseException:
            demo.send_signal(signal.SIGINT)  # stop what it started rather than wait on it forever
            raise
    leftovers = subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True, text=True, check=False)
    assert leftovers.stdout.split() == []
