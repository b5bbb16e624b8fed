"""manifests/monitoring: rules checked and tested by promtool, the PrometheusRule identical to the rule
file, the dashboard's queries naming only metrics the components export, and the agent's exposition
passing ``promtool check metrics``."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import yaml

import dra_node_agent.prepare  # noqa: F401 - registers the claim operation metrics the agent exports
from dra_node_agent.checkpoint import CheckpointCorrupt
from dra_node_agent.checkpoint_report import CorruptionReporter
from dra_node_agent.health.monitor import HealthMonitor, HealthSettings
from dra_node_agent.nvidia.health_probe import NvmlHealthProbe
from dra_operator.model.cluster import ClusterModel
from dra_operator.model.metrics import Metrics

from .fakes import Clock, discover, fake_nvml, h100
from .tools import require

ROOT = Path(__file__).resolve().parents[4]
MONITORING = ROOT / "manifests" / "monitoring"
RULES = MONITORING / "rules" / "accel-dra.rules.yaml"
RULE_TESTS = MONITORING / "rules" / "accel-dra.rules.test.yaml"
DASHBOARD = MONITORING / "dashboards" / "accel-dra-devices.json"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def promtool(
    *args: str, stdin: bytes | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [require("promtool"), *args], input=stdin, cwd=cwd, capture_output=True, timeout=120, check=False
    )


def test_prometheusrule_has_the_rule_files_groups() -> None:
    rule = load(MONITORING / "prometheusrule.yaml")
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == load(RULES)["groups"]
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {
        "DRADeviceUnhealthy",
        "DRAXidErrorBurst",
        "DRAPrepareErrors",
        "DRACheckpointCorrupt",
        "DRANodeAgentDown",
        "DRAOperatorClaimsWaitingForScheduler",
        "DRAOperatorSlowAllocations",
    } <= alerts


def test_promtool_checks_the_rules() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert b"SUCCESS: 11 rules found" in result.stdout


def test_promtool_rule_tests_fire_the_device_unhealthy_alert() -> None:
    assert "DRADeviceUnhealthy" in RULE_TESTS.read_text()
    result = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert b"SUCCESS" in result.stdout


@pytest.mark.parametrize(
    ("alert", "expr", "never"),
    [
        ("DRADeviceUnhealthy", 'state="unhealthy"} == 1', 'state="unhealthy"} == 2'),
        ("DRACheckpointCorrupt", "dra_agent_checkpoint_corrupt == 1", "dra_agent_checkpoint_corrupt == 2"),
        (
            "DRAOperatorClaimsWaitingForScheduler",
            "(dra_operator_scheduler_wait_longest_seconds) > 60",
            "(dra_operator_scheduler_wait_longest_seconds) > 6000",
        ),
        ("DRAOperatorSlowAllocations", "[10m]))\n          ) > 10\n", "[10m]))\n          ) > 100\n"),
    ],
)
def test_promtool_rule_test_fails_when_the_alert_does_not_fire(
    tmp_path: Path, alert: str, expr: str, never: str
) -> None:
    # The same test against a rule file whose alert never fires must fail: the test bites.
    assert expr in RULES.read_text()
    broken = RULES.read_text().replace(expr, never)
    (tmp_path / RULES.name).write_text(broken)
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    result = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0
    assert alert.encode() in result.stdout + result.stderr


async def agent_exposition(tmp_path: Path) -> bytes:
    """The default registry as the agent's /metrics serves it, with every health series populated."""
    fake = fake_nvml(h100(0), h100(1))
    fake.nvmlInitWithFlags(0)
    devices = discover(fake, tmp_path)
    clock = Clock()
    monitor = HealthMonitor(
        driver="exposition.nvidia.com",
        node_name="node-x",
        probe=NvmlHealthProbe(nvml=fake, event_timeout_ms=50, clock=clock),
        devices=devices,
        settings=HealthSettings(poll_interval=3600),
        clock=clock,
    )
    await monitor.start()
    try:
        fake.inject_xid(fake.gpus[0].uuid, 79)
        for _ in range(100):
            if monitor.taints_for("gpu-0"):
                break
            await monitor.wait_change(timeout=0.1)
        await monitor.check()
        assert monitor.taints_for("gpu-0")
        return prometheus_client.generate_latest()
    finally:
        await monitor.stop()


async def test_promtool_checks_the_agent_exposition(tmp_path: Path) -> None:
    reporter = CorruptionReporter(
        driver="exposition.nvidia.com",
        path=tmp_path / "checkpoint.json",
        events=None,
        loop=asyncio.get_running_loop(),
    )
    reporter(CheckpointCorrupt("checkpoint checkpoint.json: top level is not an object"))
    body = await agent_exposition(tmp_path)
    assert b'dra_agent_device_healthy{device="gpu-0",driver="exposition.nvidia.com"} 0.0' in body
    assert b'dra_agent_checkpoint_corrupt{driver="exposition.nvidia.com"} 1.0' in body
    result = promtool("check", "metrics", stdin=body)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


async def test_dashboard_queries_name_exported_metrics(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert exprs
    agent = (await agent_exposition(tmp_path)).decode()
    operator_metrics = Metrics()
    operator_metrics.attach_model(ClusterModel(), frozenset)
    operator = prometheus_client.generate_latest(operator_metrics.registry).decode()
    exported = set(re.findall(r"^# TYPE (\w+) (\w+)", agent + operator, re.MULTILINE))
    names: set[str] = set()
    for name, kind in exported:
        names.add(name)
        if kind == "counter":
            names.add(f"{name}_total")
        if kind == "histogram":
            names.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
    for expr in exprs:
        for used in re.findall(r"\b(dra_(?:agent|operator)_\w+)", expr):
            assert used in names, f"dashboard query {expr!r} uses {used}, which nothing exports"


def test_operator_rules_name_exported_metrics() -> None:
    metrics = Metrics()
    metrics.attach_model(ClusterModel(), frozenset)
    metrics.attach_scheduler_wait(lambda: 0.0)
    exposition = prometheus_client.generate_latest(metrics.registry).decode()
    exported: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (dra_operator_\w+) (\w+)", exposition, re.MULTILINE):
        exported.add(name)
        if kind == "counter":
            exported.add(f"{name}_total")
        if kind == "histogram":
            exported.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
    used = set(re.findall(r"\b(dra_operator_\w+)", RULES.read_text()))
    assert "dra_operator_scheduler_wait_longest_seconds" in used
    assert "dra_operator_allocation_wait_seconds_bucket" in used
    assert used <= exported, f"rules use {sorted(used - exported)}, which the operator does not export"
    # The histogram's reasons are all there before the first allocation.
    for reason in ("none", "scheduler_busy", "unallocatable"):
        assert f'dra_operator_allocation_wait_seconds_count{{reason="{reason}"}} 0.0' in exposition


def test_kustomization_lists_its_files_and_labels_the_dashboard() -> None:
    kustomization = load(MONITORING / "kustomization.yaml")
    for resource in kustomization["resources"]:
        assert (MONITORING / resource).is_file(), resource
    (generator,) = kustomization["configMapGenerator"]
    assert generator["options"]["labels"] == {"grafana_dashboard": "1"}
    (entry,) = generator["files"]
    assert (MONITORING / entry.split("=", 1)[1]) == DASHBOARD
    for monitor in ("podmonitor-node-agent.yaml", "podmonitor-operator.yaml"):
        doc = load(MONITORING / monitor)
        assert doc["kind"] == "PodMonitor"
        assert doc["spec"]["podMetricsEndpoints"][0]["port"] == "http"
