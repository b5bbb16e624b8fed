"""What a tenant's text can do to the agent's log and to the error the kubelet shows (security review
L2), and how many log lines one failing claim may cause."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from dra_node_agent.claim_messages import ClaimMessageLimiter
from dra_node_agent.cli import OneLineFormatter
from tests.unit.agent.prepare.test_prepare_configs import GPU, NVIDIA, REF, claim, entry, make

FORGED = "\n2026-11-27 10:00:00,000 INFO dra_node_agent.prepare.claim_steps: prepared kube-system/forged"


def _agent_log() -> tuple[logging.Handler, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler, out


async def test_a_config_key_with_a_newline_cannot_forge_a_log_line(tmp_path: Path) -> None:
    handler, claims = await make(tmp_path, driver=GPU, profile="h100-80gb-x8")
    key = "x" + FORGED
    # A claim's unknown key and an unknown strategy, each carrying a forged line.
    claims.objects["c"] = claim(
        GPU, [("gpu", "gpu-0")], [entry(GPU, {"apiVersion": NVIDIA, "kind": "GpuConfig", key: 1})]
    )
    log, out = _agent_log()
    agent = logging.getLogger("dra_node_agent")
    agent.addHandler(log)
    try:
        error = (await handler.prepare([REF]))[REF.uid].error
        claims.objects["c"] = claim(
            GPU,
            [("gpu", "gpu-0")],
            [
                entry(
                    GPU, {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": {"strategy": "MPS" + FORGED}}
                )
            ],
        )
        strategy_error = (await handler.prepare([REF]))[REF.uid].error
    finally:
        agent.removeHandler(log)
    # The kubelet's error: one line, the key shown escaped (it becomes the pod's Event).
    for text in (error, strategy_error):
        assert "\n" not in text, text
        assert "\r" not in text, text
        assert "\\n2026-11-27 10:00:00,000 INFO" in text, text
    assert 'unknown field "x\\n2026-11-27' in error
    # The agent's log: every record is one line, and no line is the forged one.
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert not [line for line in lines if line.startswith("2026-11-27 10:00:00,000")], lines
    assert all("prepare of ResourceClaim ns/c" in line for line in lines), lines


def test_the_formatter_escapes_every_control_character_and_keeps_tracebacks() -> None:
    formatter = OneLineFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "key %s", ("a\rb\x1b[31mc\u2028d",), None)
    assert formatter.format(record) == "WARNING key a\\rb\\u001b[31mc\\u2028d"
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    text = formatter.format(failed)
    assert text.startswith("ERROR failed\nTraceback")


async def test_a_claim_failing_every_retry_logs_once_and_counts_the_rest(tmp_path: Path) -> None:
    handler, claims = await make(tmp_path, driver=GPU, profile="h100-80gb-x8")
    claims.objects["c"] = claim(GPU, [("gpu", "gpu-0")], [entry(GPU, {"apiVersion": NVIDIA, "kind": "Nope"})])
    before = REGISTRY.get_sample_value("dra_agent_claim_messages_dropped_total", {"kind": "log"}) or 0.0
    log, out = _agent_log()
    logging.getLogger("dra_node_agent").addHandler(log)
    try:
        errors = {(await handler.prepare([REF]))[REF.uid].error for _ in range(20)}
    finally:
        logging.getLogger("dra_node_agent").removeHandler(log)
    assert len(errors) == 1  # the kubelet hears every time
    assert 'no kind "Nope"' in errors.pop()
    assert len(out.getvalue().splitlines()) == 1
    after = REGISTRY.get_sample_value("dra_agent_claim_messages_dropped_total", {"kind": "log"}) or 0.0
    assert after - before == 19


def test_the_limiter_bursts_refills_and_forgets_the_oldest_claim() -> None:
    now = [0.0]
    limiter = ClaimMessageLimiter(
        kind="test", burst=3, interval=10, repeat_after=100, max_claims=2, clock=lambda: now[0]
    )
    assert [limiter.allow("a", f"m{i}").allowed for i in range(5)] == [True, True, True, False, False]
    now[0] = 10.0  # one token back
    verdict = limiter.allow("a", "m5")
    assert verdict.allowed
    assert verdict.dropped_before == 2
    assert "2 earlier messages about this claim held back" in verdict.suffix()
    assert not limiter.allow("a", "m5").allowed  # the same text again: held back as a repeat
    now[0] = 200.0
    assert limiter.allow("a", "m5").allowed  # a repeat after repeat_after is news again
    limiter.allow("b", "x")
    limiter.allow("c", "x")
    assert len(limiter) == 2  # "a", the least recently heard of, is forgotten


@pytest.mark.parametrize("claims", [10_000])
def test_many_claims_keep_the_limiter_bounded(claims: int) -> None:
    limiter = ClaimMessageLimiter(kind="test")
    for i in range(claims):
        limiter.allow(f"claim-{i}", "failed")
    assert len(limiter) == 4096
