"""Smoke runs of the benchmarks that drive the operator (or stand in for it) through the API
server: ``claim_write_methods``, ``hostile_claims`` and ``operator_allocation``, each through its
``main`` with the smallest arguments that still take every step, and the figures it prints checked
for sense (never for size).

They share one control plane of their own, started for this module, not the session's: they
install cluster-wide what the session's tests must not find later (the operator's ServiceAccount,
ClusterRole and binding from ``manifests/base``, the claim finalizer policy for the shipped class
names, an operator allocating those classes, Nodes and slices under the shipped driver's name).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from bench import claim_write_methods, hostile_claims, operator_allocation
from dra_devcluster import LocalCluster, resolve_kubernetes_version
from tests.benchrun import NUMBER, find, number


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        workdir=tmp_path_factory.mktemp("operator-benches"), kubernetes=resolve_kubernetes_version()
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_claim_write_methods(own_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    claim_write_methods.main(["--claims", "4", "--rounds", "2"], cluster=own_cluster)
    out = capsys.readouterr().out
    find(r"^claim status writes, one client \(16 in flight\), 2 rounds of 4:$", out)
    for method in ("merge patch", "put"):
        rates = find(rf"^  {method}: {NUMBER}/s, {NUMBER}/s$", out)
        assert number(rates[1]) > 0
        assert number(rates[2]) > 0
    # Every claim got its allocation by the method's write.
    claims = own_cluster.get_json("resourceclaims", "-n", claim_write_methods.NS)["items"]
    assert len(claims) == 2 * 2 * 4
    assert all(c["status"]["allocation"]["devices"]["results"] for c in claims)


def test_hostile_claims(own_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    hostile_claims.main(
        ["--nodes", "9", "--rate", "4", "--seconds", "1", "--timeout", "240"], cluster=own_cluster
    )
    out = capsys.readouterr().out
    find(r"^--- 10 hostile claims created$", out)
    summary = out.split("9 nodes x 8 GPUs, operator defaults:", 1)[1]
    for name in ("without", "with"):
        line = find(
            rf"^  {name}\s+(\d+) claims: p50 {NUMBER} s, p99 {NUMBER} s, max {NUMBER} s; operator CPU "
            rf"{NUMBER} s \({NUMBER} ms per ordinary claim\); /healthz (\d+) of (\d+) probes failed$",
            summary,
        )
        assert int(line[1]) == 4
        assert number(line[2]) <= number(line[3]) <= number(line[4])
        assert int(line[7]) <= int(line[8])
    find(r"^placements searched in worker threads: \d+$", out)


SCENARIOS = (
    "burst: claims created while the operator runs",
    "backlog: claims created first, then the operator started",
    "reference allocator, burst: claims created while it writes",
    "reference allocator, backlog: claims created first",
    "compiled reference (JSON), burst: bench/go_writer in the operator's place",
    "compiled reference (protobuf), burst: bench/go_writer in the operator's place",
)


def test_operator_allocation(own_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    # More claims than GPUs: the two that cannot fit must be explained, not waited for.
    operator_allocation.main(
        ["--nodes", "2", "--gpus", "2", "--claims", "6", "--writes", "2"], cluster=own_cluster
    )
    out = capsys.readouterr().out
    find(r"^nodes x GPUs: 2 x 2; claims: 6; operator --max-concurrent-writes=2$", out)
    find(r"^claim finalizer policy: applied \(one write per allocation\)$", out)
    sections = {part.split("\n", 1)[0]: part for part in out.split("\n--- ")[1:]}
    for title in SCENARIOS:
        (section,) = [text for head, text in sections.items() if head.startswith(title)]
        find(rf"^4 claims allocated \(2 cannot fit\) after {NUMBER} s -> {NUMBER} claims/s", section)
        latency = find(rf"^creation->allocation p50 {NUMBER} s, p99 {NUMBER} s, max {NUMBER} s$", section)
        assert number(latency[1]) <= number(latency[2]) <= number(latency[3])
        writes = find(rf"^claim writes \(PATCH\) in the window: {NUMBER} -> ", section)
        if title.startswith(("reference", "compiled")):
            # One write per allocated claim, none for those that do not fit.
            assert number(writes[1]) == 4
        else:
            # With the policy one write per allocation. Each of the two left waiting is told why, and
            # told again when the why changes, which it may as each of the 4 allocations lands; a
            # claim written on every pass would show dozens.
            assert 4 <= number(writes[1]) <= 4 + 2 * (1 + 4)
        find(
            rf"^CPU seconds in the window: .*kube-apiserver {NUMBER}.* \(window {NUMBER} s, \d+ cores\)$",
            section,
        )
        if title.startswith(("burst", "backlog")):
            find(rf"^operator CPU per allocated claim: {NUMBER} ms$", section)
            find(rf"^operator RSS after allocating: {NUMBER} MiB$", section)
        if title.startswith("compiled"):
            find(r"; it wrote 4 allocations$", section)
    raw = find(rf"^3 rounds of 6: {NUMBER}/s, {NUMBER}/s, {NUMBER}/s$", out)
    assert all(number(r) > 0 for r in raw.groups())
    find(
        rf"^burst bound for any allocator: 4 / \(6 / {NUMBER}/s \+ 4 / {NUMBER}/s\) = {NUMBER} claims/s", out
    )
    for line in (
        "operator claims/s vs raw (median): burst",
        "reference allocator claims/s vs raw (median): burst",
        "operator claims/s vs the reference allocator: burst",
        "operator burst claims/s vs the burst bound:",
        "compiled reference burst claims/s vs the burst bound: JSON",
        "operator burst claims/s vs the compiled reference (JSON):",
    ):
        find(rf"^{re.escape(line)} \d+ %", out)
