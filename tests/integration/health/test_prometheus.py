"""A real Prometheus scrapes the agent's /metrics (the agent's own HttpEndpoints, with a health monitor
over a fake NVML) and the operator's (``dra-operator run`` against the local cluster), evaluates the
shipped rule file, and answers queries for the device health series through its HTTP API."""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_devcluster.cluster import free_port
from dra_node_agent.health import HealthMonitor, HealthSettings
from dra_node_agent.http_endpoints import HttpEndpoints
from dra_node_agent.nvidia.health_probe import NvmlHealthProbe
from tests.integration.operator.conftest import Operators
from tests.unit.agent.health.fakes import Clock, discover, fake_nvml, h100
from tests.unit.agent.health.tools import require

from .conftest import eventually

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "manifests" / "monitoring" / "rules" / "accel-dra.rules.yaml"
DRIVER = "prom-test.nvidia.com"
AGENT_JOB = "accel-dra/accel-dra-node-agent"
OPERATOR_JOB = "accel-dra/accel-dra-operator"


@pytest.fixture
async def agent_endpoint(tmp_path: Path) -> AsyncIterator[tuple[int, HealthMonitor]]:
    """The agent's metrics endpoint with a monitor whose gpu-1 took XID 79."""
    fake = fake_nvml(h100(0), h100(1))
    fake.nvmlInitWithFlags(0)
    devices = discover(fake, tmp_path)
    fake.nvmlShutdown()
    clock = Clock()
    monitor = HealthMonitor(
        driver=DRIVER,
        node_name="prom-node",
        probe=NvmlHealthProbe(nvml=fake, event_timeout_ms=50, clock=clock),
        devices=devices,
        settings=HealthSettings(poll_interval=0.5),
        clock=clock,
    )
    endpoints = HttpEndpoints(address="127.0.0.1:0")
    await endpoints.start()
    await monitor.start()
    fake.inject_xid(fake.gpus[1].uuid, 79)

    async def tainted() -> bool:
        return bool(monitor.taints_for("gpu-1"))

    await eventually(tainted, what="gpu-1 unhealthy")
    assert endpoints.port is not None
    try:
        yield endpoints.port, monitor
    finally:
        await monitor.stop()
        await endpoints.stop()


def launch(binary: str, *, config: Path, port: int, workdir: Path) -> subprocess.Popen[bytes]:
    log = (workdir / "prometheus.log").open("wb")
    return subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def api_get(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


async def query(port: int, expr: str) -> list[dict[str, Any]]:
    try:
        body = await asyncio.to_thread(api_get, port, "/api/v1/query", query=expr)
    except OSError:
        return []  # not listening yet
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


async def test_prometheus_scrapes_device_health_and_evaluates_the_rules(
    agent_endpoint: tuple[int, HealthMonitor], operators: Operators, tmp_path: Path
) -> None:
    binary = require("prometheus")
    agent_port, _ = agent_endpoint
    operator = operators.start()
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {"job_name": AGENT_JOB, "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}]},
                    {
                        "job_name": OPERATOR_JOB,
                        "static_configs": [{"targets": [f"127.0.0.1:{operator.port}"]}],
                    },
                ],
            }
        )
    )
    proc = launch(binary, config=config, port=port, workdir=tmp_path)
    try:

        async def unhealthy() -> list[dict[str, Any]]:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            return await query(
                port, f'dra_agent_device_health_state{{driver="{DRIVER}",state="unhealthy"}} == 1'
            )

        (series,) = await eventually(unhealthy, limit=90, what="the unhealthy device series in Prometheus")
        assert series["metric"]["device"] == "gpu-1"
        assert series["metric"]["job"] == AGENT_JOB

        healthy = await query(port, f'dra_agent_device_healthy{{driver="{DRIVER}"}}')
        assert {s["metric"]["device"]: s["value"][1] for s in healthy} == {"gpu-0": "1", "gpu-1": "0"}
        xids = await query(port, f'dra_agent_xid_errors_total{{driver="{DRIVER}"}}')
        assert [(s["metric"]["xid"], s["value"][1]) for s in xids] == [("79", "1")]
        taints = await query(port, f'dra_agent_device_taint_info{{driver="{DRIVER}"}}')
        assert [(s["metric"]["key"], s["metric"]["value"]) for s in taints] == [(f"{DRIVER}/xid", "79")]
        power = await query(port, f'dra_agent_device_power_watts{{driver="{DRIVER}",device="gpu-0"}}')
        assert [s["value"][1] for s in power] == ["75"]

        async def operator_up() -> list[dict[str, Any]]:
            return await query(port, f'up{{job="{OPERATOR_JOB}"}} == 1')

        await eventually(operator_up, limit=60, what="the operator's target up")
        assert await query(port, "dra_operator_watch_events_total")

        # The shipped rule file is loaded and the unhealthy alert is on its way (for: 1m).
        async def alert() -> list[dict[str, Any]]:
            body = await asyncio.to_thread(api_get, port, "/api/v1/alerts")
            return [
                a
                for a in body["data"]["alerts"]
                if a["labels"]["alertname"] == "DRADeviceUnhealthy" and a["labels"].get("driver") == DRIVER
            ]

        (pending,) = await eventually(alert, limit=60, what="DRADeviceUnhealthy pending")
        assert pending["state"] in {"pending", "firing"}
        assert pending["labels"]["device"] == "gpu-1"
        assert pending["labels"]["node"] == "prom-node"
        assert pending["labels"]["model"] == "NVIDIA H100 80GB HBM3"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0, (tmp_path / "prometheus.log").read_text()
