"""Operator failover: time from the active instance's death to the standby's first allocation.

Two ``dra-operator run`` processes with peering and the default timing run against the local
control plane; claims arrive steadily (one every ``--claim-interval`` s) before, during and after
each failover. Per round the active instance is SIGKILLed (a node loss, an OOM kill) or SIGTERMed
(a rolling update, a drain), and the driver polls the standby's
``dra_operator_allocations_total`` until it moves. Between rounds a replacement instance starts
with a lower priority (so it becomes the new standby, as in a rolling update), and the round's
claims are checked: every one allocated exactly once (one "allocated" log line over all
instances), no device in two claims, then deleted.

``python -m bench.operator_failover --rounds 10`` prints p50 and max per kind; the integration
test (tests/integration/operator/test_failover.py) runs fewer rounds with the same driver.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.operator_chaos import double_booked, gpu_slice, standalone_claim
from dra_devcluster import LocalCluster
from dra_devcluster.cluster import free_port

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class FailoverConfig:
    namespace: str
    gpu_class: str
    tpu_class: str
    driver: str
    nodes: tuple[str, ...]
    gpus: int = 32
    claim_interval_s: float = 0.5
    before_s: float = 2.0
    """Claims arrive this long before the kill ..."""
    after_s: float = 2.0
    """... and this long after the new instance's first allocation."""
    claims_each_side: int = 2
    """At least this many claims are created before the kill, and as many again after the new
    instance's first allocation, however long their creation takes (on a loaded machine each
    ``kubectl apply`` may take longer than ``claim_interval_s``)."""
    claims_timeout_s: float = 120.0
    takeover_timeout_s: float = 90.0
    extra_args: tuple[str, ...] = ()


class Instance:
    """One ``dra-operator run`` process, its metrics port and its log."""

    def __init__(
        self,
        *,
        cluster: LocalCluster,
        config: FailoverConfig,
        workdir: Path,
        name: str,
        priority: int,
        kubeconfig: Path | None = None,
        verify_index: bool = True,
    ):
        """``kubeconfig``: the operator's credentials (default: the cluster's admin);
        ``verify_index``: compare the placer's index with the model after every event (a check
        for tests, whose cost grows with the cluster)."""
        self.name = name
        self.port = free_port()
        self.log = workdir / f"{name}.log"
        self.started_at = time.time()
        args = [
            sys.executable,
            "-m",
            "dra_operator.entry.cli",
            "run",
            f"--kubeconfig={kubeconfig or cluster.kubeconfig}",
            f"--metrics-port={self.port}",
            "--metrics-host=127.0.0.1",
            f"--gpu-class={config.gpu_class}",
            f"--tpu-class={config.tpu_class}",
            f"--gpu-driver={config.driver}",
            f"--identity={name}",
            f"--priority={priority}",
            *config.extra_args,
        ]
        env = {**os.environ, "DRA_OPERATOR_VERIFY_PLACER_INDEX": str(verify_index).lower()}
        env.pop("KUBECONFIG", None)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)

    def metric(self, name: str, labels: str = "") -> float | None:
        """The sum of a metric's samples whose label text contains ``labels``; None while the
        endpoint does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as response:
                text = response.read().decode()
        except (urllib.error.URLError, OSError):
            return None
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or (
                line.startswith(name + "{") and labels in line.partition("}")[0]
            ):
                total += float(line.rpartition(" ")[2])
        return total

    def active(self) -> bool:
        return self.metric("dra_operator_active") == 1.0

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Round:
    kind: str
    old: str
    new: str
    takeover_s: float
    claims: int


@dataclass
class FailoverReport:
    rounds: list[Round] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Claims not allocated exactly once, devices in two claims; empty when all went well."""
    written_as_killed: int = 0
    """Claims whose allocation an instance wrote as it was SIGKILLed, too late to log it."""

    def figures(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for kind in sorted({r.kind for r in self.rounds}):
            times = [r.takeover_s for r in self.rounds if r.kind == kind]
            out[kind] = {
                "rounds": len(times),
                "p50_s": round(statistics.median(times), 2),
                "max_s": round(max(times), 2),
                "min_s": round(min(times), 2),
            }
        return out


class ClaimFeed:
    """Creates claims ``<prefix>-N`` every ``interval`` seconds in a thread until stopped."""

    def __init__(self, cluster: LocalCluster, config: FailoverConfig, prefix: str) -> None:
        self.cluster, self.config, self.prefix = cluster, config, prefix
        self.created: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"claims {prefix}", daemon=True)

    def __enter__(self) -> ClaimFeed:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            name = f"{self.prefix}-{len(self.created)}"
            self.cluster.apply([standalone_claim(name, self.config.namespace, self.config.gpu_class)])
            self.created.append(name)
            self._stop.wait(self.config.claim_interval_s)


def _claims(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def once_problems(
    claims: Sequence[Mapping[str, Any]],
    names: Sequence[str],
    counts: Mapping[str, int],
    *,
    killed_at: float | None = None,
) -> tuple[list[str], int]:
    """The claims of ``names`` not allocated exactly once by the operators' logs (``counts``),
    and how many of them were written by an instance as it was SIGKILLed at ``killed_at``.

    Such a claim has an allocation and no "allocated" line: the write reached the API server, the
    log line after its response was never written. Nothing else writes without that line (the
    instances that live on log every write), and a second write would have failed its
    resourceVersion precondition, so it counts as allocated once if it existed at the kill. The
    devices are checked apart (:func:`double_booked`)."""
    by_name = {str(c["metadata"]["name"]): c for c in claims}
    problems: list[str] = []
    silent = 0
    for name in names:
        count = counts.get(name, 0)
        claim = by_name.get(name)
        if count == 0 and killed_at is not None and claim is not None and _written_before(claim, killed_at):
            silent += 1
        elif count != 1:
            problems.append(f"claim {name} allocated {count} times")
    return problems, silent


def _written_before(claim: Mapping[str, Any], when: float) -> bool:
    """Whether the claim holds an allocation and was created by ``when`` (the timestamp's whole
    seconds: up to 1 s later)."""
    if not (claim.get("status") or {}).get("allocation"):
        return False
    created = str((claim.get("metadata") or {}).get("creationTimestamp") or "")
    try:
        stamp = datetime.datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return False
    return stamp <= when


def allocation_counts(logs: Sequence[Path], namespace: str) -> dict[str, int]:
    """How often each claim of ``namespace`` was allocated, from the operators' logs."""
    counts: dict[str, int] = {}
    marker = f"claim {namespace}/"
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            at = line.find(marker)
            if at < 0 or ": allocated " not in line:
                continue
            name = line[at + len(marker) :].split(":", 1)[0]
            counts[name] = counts.get(name, 0) + 1
    return counts


class Failover:
    def __init__(self, *, cluster: LocalCluster, config: FailoverConfig, workdir: Path) -> None:
        self.cluster, self.config, self.workdir = cluster, config, workdir
        self.instances: list[Instance] = []
        self.priority = 1_000_000
        self.report = FailoverReport()

    def prepare(self) -> None:
        c = self.cluster
        c.kubectl("apply", "-f", str(REPO / "crds" / "clusterkopfpeerings.kopf.dev.yaml"))
        c.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev", "--timeout=60s")
        c.kubectl("apply", "-f", str(REPO / "manifests" / "base" / "operator-peering.yaml"))
        c.create_namespace(self.config.namespace)
        for node in self.config.nodes:
            c.add_node(node)
        c.apply([gpu_slice(node, self.config.gpus, self.config.driver) for node in self.config.nodes])

    def start_instance(self) -> Instance:
        self.priority -= 1  # each newcomer ranks below the running ones: it becomes the standby
        inst = Instance(
            cluster=self.cluster,
            config=self.config,
            workdir=self.workdir,
            name=f"failover-{len(self.instances)}",
            priority=self.priority,
        )
        self.instances.append(inst)
        return inst

    def running(self) -> list[Instance]:
        return [i for i in self.instances if i.proc.poll() is None]

    def roles(self) -> tuple[Instance, Instance]:
        """Wait until exactly two instances run, one active and one standby."""

        def settled() -> tuple[Instance, Instance] | None:
            live = self.running()
            for inst in live:
                # Up, and its model listed: a standby before that would list at the takeover.
                if inst.metric("dra_operator_model_synced") != 1.0:
                    return None
            active = [i for i in live if i.active()]
            standby = [i for i in live if not i.active()]
            if len(active) == 1 and len(standby) == 1:
                return active[0], standby[0]
            return None

        result: tuple[Instance, Instance] = self.cluster.wait_for(
            settled, timeout=120, interval=0.5, what="one active and one standby operator"
        )
        return result

    def run_round(self, kind: signal.Signals, index: int) -> Round:
        active, standby = self.roles()
        prefix = f"r{index}-{kind.name.lower()}"
        with ClaimFeed(self.cluster, self.config, prefix) as feed:
            time.sleep(self.config.before_s)
            self._wait_created(feed, self.config.claims_each_side, what="before the signal")
            base = standby.metric("dra_operator_allocations_total") or 0.0
            killed_at = time.monotonic()
            killed_wall = time.time()
            active.signal(kind)

            def moved() -> bool:
                assert standby.proc.poll() is None, f"standby exited:\n{standby.tail()}"
                value = standby.metric("dra_operator_allocations_total")
                return value is not None and value > base

            self.cluster.wait_for(
                moved,
                timeout=self.config.takeover_timeout_s,
                interval=0.02,
                what="the standby's first allocation",
            )
            takeover = time.monotonic() - killed_at
            at_takeover = len(feed.created)
            time.sleep(self.config.after_s)
            self._wait_created(feed, at_takeover + self.config.claims_each_side, what="after the takeover")
        active.proc.wait(timeout=60)
        self._check_round(feed.created, killed_at=killed_wall if kind == signal.SIGKILL else None)
        self.start_instance()
        return Round(
            kind=kind.name, old=active.name, new=standby.name, takeover_s=takeover, claims=len(feed.created)
        )

    def _wait_created(self, feed: ClaimFeed, count: int, *, what: str) -> None:
        self.cluster.wait_for(
            lambda: len(feed.created) >= count,
            timeout=self.config.claims_timeout_s,
            interval=0.1,
            what=f"{count} claims created {what}",
        )

    def _check_round(self, names: list[str], *, killed_at: float | None) -> None:
        ns = self.config.namespace

        def all_allocated() -> list[dict[str, Any]] | None:
            items = _claims(self.cluster, ns)
            done = [c for c in items if (c.get("status") or {}).get("allocation")]
            return items if len(done) == len(items) >= len(names) else None

        items = self.cluster.wait_for(all_allocated, timeout=120, interval=0.5, what="every claim allocated")
        self.report.problems += double_booked(items)
        counts = allocation_counts([i.log for i in self.instances], ns)
        problems, silent = once_problems(items, names, counts, killed_at=killed_at)
        self.report.problems += problems
        self.report.written_as_killed += silent
        self.cluster.kubectl("delete", "resourceclaims", "--all", "-n", ns, "--timeout=120s")

    def run(
        self, kinds: Sequence[signal.Signals], on_round: Callable[[Round], None] = lambda _: None
    ) -> None:
        self.start_instance()
        self.start_instance()
        for index, kind in enumerate(kinds):
            result = self.run_round(kind, index)
            self.report.rounds.append(result)
            on_round(result)

    def stop(self) -> None:
        for inst in self.instances:
            inst.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each kind (SIGKILL, SIGTERM)")
    parser.add_argument("--claim-interval", type=float, default=0.5)
    args = parser.parse_args()
    config = FailoverConfig(
        namespace="failover",
        gpu_class="gpu.nvidia.com",
        tpu_class="tpu.google.com",
        driver="gpu.nvidia.com",
        nodes=("failover-0", "failover-1"),
        gpus=64,
        claim_interval_s=args.claim_interval,
    )
    workdir = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    kinds = [signal.SIGKILL, signal.SIGTERM] * args.rounds
    started = time.monotonic()
    with LocalCluster(workdir=workdir / "cluster") as cluster:
        os.environ.pop("KUBECONFIG", None)
        failover = Failover(cluster=cluster, config=config, workdir=workdir)
        failover.prepare()
        try:
            failover.run(
                kinds,
                on_round=lambda r: print(
                    f"{r.kind:8} {r.old} -> {r.new}: first allocation {r.takeover_s:.2f} s after the signal "
                    f"({r.claims} claims in the round)",
                    flush=True,
                ),
            )
        finally:
            failover.stop()
    report = failover.report
    print(
        json.dumps(
            {
                "figures": report.figures(),
                "problems": report.problems[:20],
                "written_as_killed": report.written_as_killed,
                "wall_s": round(time.monotonic() - started, 1),
                "logs": str(workdir),
            },
            indent=1,
        )
    )
    if report.problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
