"""The operator as a real process against the real control plane.

``operators`` starts ``dra-operator run`` subprocesses (admin kubeconfig, their own metrics port,
the project's peering object) and stops them after the test; a test can SIGKILL one to exercise
restarts. Every one of them compares its placer's index with its model after every event
(``--verify-placer-index``), and a test whose operators logged a disagreement fails. Each test
uses its own namespace, node names and DeviceClass names, so tests sharing the session's cluster
stay independent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dra_devcluster import LocalCluster
from dra_devcluster.cluster import free_port

REPO = Path(__file__).resolve().parents[3]
GPU_DRIVER = "gpu.nvidia.com"
TPU_DRIVER = "tpu.google.com"
INDEX_DISAGREES = "placer index disagrees"  # what the operator logs when --verify-placer-index finds one


@dataclass
class OperatorProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    args: list[str]
    identity: str

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def metric(self, name: str, labels: str = "") -> float:
        """Sum of the samples of ``name`` whose label text contains ``labels``."""
        status, text = self.get("/metrics")
        assert status == 200, text
        total = 0.0
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            metric, _, label_text = series.partition("{")
            if metric == name and labels in label_text:
                total += float(value)
        return total

    def kill(self) -> None:
        """SIGKILL: no cleanup, no peering farewell, as when a node dies."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Operators:
    cluster: LocalCluster
    workdir: Path
    gpu_class: str
    tpu_class: str
    started: list[OperatorProcess] = field(default_factory=list)

    def start(
        self, *extra: str, wait_active: bool = True, name: str = "op", kubeconfig: Path | None = None
    ) -> OperatorProcess:
        port = free_port()
        identity = f"{name}-{len(self.started)}-{os.getpid()}"
        log = self.workdir / f"{identity}.log"
        args = [
            sys.executable,
            "-m",
            "dra_operator.entry.cli",
            "run",
            f"--kubeconfig={kubeconfig or self.cluster.kubeconfig}",
            f"--metrics-port={port}",
            "--metrics-host=127.0.0.1",
            f"--gpu-class={self.gpu_class}",
            f"--tpu-class={self.tpu_class}",
            f"--identity={identity}",
            "--heartbeat-interval-seconds=2",
            "--peering-lifetime-seconds=10",
            "--orphan-slice-grace-seconds=2",
            "--stale-reservation-sweep-seconds=5",
            *extra,
        ]
        env = {**os.environ, "DRA_OPERATOR_VERIFY_PLACER_INDEX": "true"}
        with log.open("ab") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        op = OperatorProcess(proc=proc, port=port, log=log, args=args, identity=identity)
        self.started.append(op)
        if wait_active:
            self.wait_active(op)
        return op

    def wait_active(self, op: OperatorProcess, *, timeout: float = 90) -> None:
        def active() -> bool:
            assert op.proc.poll() is None, f"operator exited with {op.proc.returncode}:\n{op.log_tail()}"
            status, text = op.get("/healthz")
            return status == 200 and "standby" not in text and "no heartbeat object" not in text

        self.cluster.wait_for(active, timeout=timeout, interval=0.5, what=f"operator {op.identity} active")

    def stop_all(self) -> None:
        for op in self.started:
            op.stop()

    def index_disagreements(self) -> list[str]:
        """Lines in which an operator said its placer's index disagreed with its model."""
        found = []
        for op in self.started:
            try:
                text = op.log.read_text(errors="replace")
            except OSError:
                continue
            found += [f"{op.identity}: {line}" for line in text.splitlines() if INDEX_DISAGREES in line]
        return found


def install_peering(cluster: LocalCluster) -> None:
    cluster.kubectl("apply", "-f", str(REPO / "crds" / "clusterkopfpeerings.kopf.dev.yaml"))
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev", "--timeout=60s"
    )
    cluster.kubectl("apply", "-f", str(REPO / "manifests" / "base" / "operator-peering.yaml"))


@pytest.fixture
def operators(
    local_cluster: LocalCluster, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Operators]:
    install_peering(local_cluster)
    tag = request.node.name.replace("_", "-")[:30].strip("-").lower()
    ops = Operators(cluster=local_cluster, workdir=tmp_path, gpu_class=f"{tag}-gpu", tpu_class=f"{tag}-tpu")
    yield ops
    ops.stop_all()
    disagreements = ops.index_disagreements()
    assert not disagreements, "the operator's placer index disagreed with its model:\n" + "\n".join(
        disagreements[:10]
    )
    for cls in (ops.gpu_class, ops.tpu_class):
        local_cluster.kubectl("delete", "deviceclass", cls, "--ignore-not-found", "--wait=false")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        ops = getattr(item, "funcargs", {}).get("operators")
        if report.failed and ops is not None:
            for op in ops.started:
                report.sections.append((f"operator {op.identity} log", op.log_tail(150)))
    return report


@pytest.fixture
def scratch(local_cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[list[tuple[str, ...]]]:
    """Objects to delete after the test: (kind, name) or (kind, name, namespace)."""
    created: list[tuple[str, ...]] = []
    yield created
    for entry in reversed(created):
        kind, name, *ns = entry
        args = ["delete", kind, name, "--ignore-not-found", "--wait=false"]
        if ns:
            args += ["-n", ns[0]]
        local_cluster.kubectl(*args, check=False)


def claims_json(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json("resourceclaims", "-n", namespace)["items"]
    return items


def events_for(cluster: LocalCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json(
        "events", "-n", namespace, f"--field-selector=involvedObject.name={name}"
    )["items"]
    return items


def device_ids(claim: dict[str, Any]) -> list[tuple[str, str, str]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [
        (r["driver"], r["pool"], r["device"]) for r in (allocation.get("devices") or {}).get("results") or []
    ]


def assert_no_double_booking(claims: Sequence[dict[str, Any]]) -> None:
    seen: dict[tuple[str, str, str], str] = {}
    for claim in claims:
        for device in device_ids(claim):
            other = seen.get(device)
            assert other is None, f"device {device} allocated to both {other} and {claim['metadata']['name']}"
            seen[device] = claim["metadata"]["name"]
