"""Reliability scenarios N1-N6, N8, N10 and N13 (reference/reliability-scenarios.md B4).

The agent runs as a real subprocess and is really killed (SIGKILL) where the scenario says; the
kubelet's side is the test kubelet client over the real sockets, and claims are allocated by the
real kube-scheduler from the slices the agent published.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from dra_api.kubeletapi.model import ClaimRef, PrepareResult
from dra_devcluster import LocalCluster
from dra_devcluster.kubelet import KubeletClientError, KubeletPluginClient

from .agentproc import GPU, AgentProcess
from .conftest import (
    apply_in,
    gpu_pod,
    standalone_claim,
    wait_allocated_claim,
    wait_slices,
    wait_until,
)

pytestmark = pytest.mark.cluster


def claim_ref(claim: dict[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


async def prepare(agent: AgentProcess, ref: ClaimRef) -> PrepareResult:
    async with await KubeletPluginClient.register_driver(agent.dirs.registry, driver=GPU) as kubelet:
        return (await kubelet.prepare([ref]))[ref.uid]


async def unprepare(agent: AgentProcess, ref: ClaimRef) -> str:
    async with await KubeletPluginClient.register_driver(agent.dirs.registry, driver=GPU) as kubelet:
        return (await kubelet.unprepare([ref]))[ref.uid]


def allocated_pod_claim(
    cluster: LocalCluster, agent: AgentProcess, node: str, namespace: str, *, name: str = "work"
) -> ClaimRef:
    wait_slices(cluster, node)
    apply_in(cluster, namespace, gpu_pod(name=name, node=node))
    return claim_ref(wait_allocated_claim(cluster, namespace, name))


def temp_files(*folders: Path) -> list[str]:
    return sorted(str(p) for folder in folders for p in folder.rglob("*") if ".tmp-" in p.name)


def prepared_lines(agent: AgentProcess, ref: ClaimRef) -> int:
    return sum(
        1
        for line in agent.log_text().splitlines()
        if f"prepared ResourceClaim {ref.namespace}/{ref.name} (uid {ref.uid})" in line
    )


@pytest.fixture
def started(agent: AgentProcess, device_classes: tuple[str, str]) -> AgentProcess:
    agent.start()
    return agent


async def test_n1_prepare_is_idempotent_across_a_restart(
    local_cluster: LocalCluster, started: AgentProcess, node: str, namespace: str
) -> None:
    ref = allocated_pod_claim(local_cluster, started, node, namespace)
    first = await prepare(started, ref)
    assert first.error == ""
    assert await prepare(started, ref) == first
    assert started.metric("dra_agent_device_setups_total", driver=GPU) == 1
    spec = started.dirs.cdi_spec(ref.uid)
    written = spec.stat().st_ino, spec.stat().st_mtime_ns

    started.kill()
    started.start()
    assert await prepare(started, ref) == first
    assert (spec.stat().st_ino, spec.stat().st_mtime_ns) == written
    assert list(started.dirs.checkpoint_claims()) == [ref.uid]
    assert prepared_lines(started, ref) == 1  # the devices were set up once...
    assert started.metric("dra_agent_device_setups_total", driver=GPU) is None  # ...not in this process


async def test_n2_unprepare_of_unknown_or_unprepared_claims_is_a_no_op(
    local_cluster: LocalCluster, started: AgentProcess, node: str, namespace: str
) -> None:
    ref = allocated_pod_claim(local_cluster, started, node, namespace)
    assert (await prepare(started, ref)).error == ""
    before = started.dirs.checkpoint().read_bytes()
    unknown = ClaimRef(namespace=namespace, name="nobody", uid="5f0e6c3e-0000-4000-8000-000000000001")
    assert await unprepare(started, unknown) == ""
    assert started.dirs.checkpoint().read_bytes() == before
    assert await unprepare(started, ref) == ""
    emptied = started.dirs.checkpoint().read_bytes()
    assert await unprepare(started, ref) == ""
    assert started.dirs.checkpoint().read_bytes() == emptied
    assert started.dirs.checkpoint_claims() == {}


@pytest.mark.parametrize("point", ["prepare-started", "devices-set-up", "cdi-written"])
async def test_n3_crash_mid_prepare_then_retry_completes_once(
    local_cluster: LocalCluster,
    agent: AgentProcess,
    node: str,
    namespace: str,
    device_classes: tuple[str, str],
    point: str,
) -> None:
    agent.start(env={"DRA_AGENT_TEST_PAUSE_AT": point})
    ref = allocated_pod_claim(local_cluster, agent, node, namespace)
    kubelet = await KubeletPluginClient.register_driver(agent.dirs.registry, driver=GPU)
    call = asyncio.create_task(kubelet.prepare([ref], deadline=60))
    marker = agent.dirs.state / GPU / f"paused-at-{point}"
    await asyncio.to_thread(wait_until, marker.exists, timeout=30, what=f"the agent to pause at {point}")
    entry = agent.dirs.checkpoint_claims()[ref.uid]
    assert entry["state"] == "PrepareStarted"
    agent.kill()
    with pytest.raises(KubeletClientError):
        await call  # kubelet sees the call fail and will retry
    await kubelet.close()

    agent.start()  # same folders, no fault injection
    result = await prepare(agent, ref)
    assert result.error == ""
    (device,) = result.devices
    claims = agent.dirs.checkpoint_claims()
    assert list(claims) == [ref.uid]
    assert claims[ref.uid]["state"] == "PrepareCompleted"
    spec = json.loads(agent.dirs.cdi_spec(ref.uid).read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{ref.uid}-{device.device}"]
    assert sorted(p.name for p in agent.dirs.cdi.iterdir()) == [agent.dirs.cdi_spec(ref.uid).name]
    assert temp_files(agent.dirs.cdi, agent.dirs.state) == []
    assert prepared_lines(agent, ref) == 1
    assert "rolling back an interrupted prepare" in agent.log_text()


async def test_n4_leftovers_of_an_interrupted_write_are_cleaned_up(
    local_cluster: LocalCluster, started: AgentProcess, node: str, namespace: str
) -> None:
    ref = allocated_pod_claim(local_cluster, started, node, namespace)
    first = await prepare(started, ref)
    started.kill()
    checkpoint = started.dirs.checkpoint()
    before = checkpoint.read_bytes()
    # What a kill between writing the temp file and renaming it leaves behind.
    (checkpoint.parent / f".{checkpoint.name}.tmp-4242-0badc0de").write_bytes(before[: len(before) // 2])
    spec = started.dirs.cdi_spec(ref.uid)
    (spec.parent / f".{spec.name}.tmp-4242-0badc0de").write_bytes(b'{"cdiVersion": "0.')
    started.start()
    assert temp_files(started.dirs.cdi, started.dirs.state) == []
    assert checkpoint.read_bytes() == before
    assert await prepare(started, ref) == first


async def test_n4_a_full_disk_fails_the_claim_and_keeps_the_old_checkpoint(
    local_cluster: LocalCluster, started: AgentProcess, node: str, namespace: str
) -> None:
    ref = allocated_pod_claim(local_cluster, started, node, namespace)
    other = allocated_pod_claim(local_cluster, started, node, namespace, name="other")
    first = await prepare(started, ref)
    assert first.error == ""
    started.kill()
    checkpoint = started.dirs.checkpoint()
    before = checkpoint.read_bytes()
    # A file-size limit just above today's checkpoint stands in for a full disk: the next
    # checkpoint write (one more claim) fails part-way, as it would with ENOSPC.
    started.start(file_size_limit=len(before) + 16)
    refused = await prepare(started, other)
    assert "writing state failed" in refused.error
    assert "File too large" in refused.error
    assert checkpoint.read_bytes() == before
    assert temp_files(started.dirs.cdi, started.dirs.state) == []
    assert not started.dirs.cdi_spec(other.uid).exists()
    assert await prepare(started, ref) == first  # what was prepared stays prepared

    started.kill()
    started.start()  # space again: the kubelet's retry succeeds
    assert (await prepare(started, other)).error == ""
    assert sorted(started.dirs.checkpoint_claims()) == sorted([ref.uid, other.uid])


async def test_n5_corrupt_checkpoint_fails_closed_and_is_kept(
    local_cluster: LocalCluster, started: AgentProcess, node: str, namespace: str
) -> None:
    ref = allocated_pod_claim(local_cluster, started, node, namespace)
    other = allocated_pod_claim(local_cluster, started, node, namespace, name="other")
    assert (await prepare(started, ref)).error == ""
    started.kill()
    checkpoint = started.dirs.checkpoint()
    raw = bytearray(checkpoint.read_bytes())
    at = raw.index(b"PrepareCompleted")
    raw[at] = ord("X")  # one flipped byte inside the checksummed data
    checkpoint.write_bytes(bytes(raw))

    started.start()
    for claim in (ref, other):
        result = await prepare(started, claim)
        assert "checkpoint is corrupt" in result.error
        assert "checksum mismatch" in result.error
    assert "checkpoint is corrupt" in await unprepare(started, ref)
    assert checkpoint.read_bytes() == bytes(raw)  # kept for inspection, never reset
    assert started.dirs.cdi_spec(ref.uid).exists()
    assert "checksum mismatch" in started.log_text()


async def test_n6_unprepare_after_restart_and_claim_deletion_uses_the_checkpoint(
    local_cluster: LocalCluster, started: AgentProcess, node: str, namespace: str
) -> None:
    ref = allocated_pod_claim(local_cluster, started, node, namespace)
    assert (await prepare(started, ref)).error == ""
    assert started.stop() == 0
    started.start()
    local_cluster.kubectl("delete", "pod", "work", "-n", namespace, "--grace-period=0", "--force")
    wait_until(
        lambda: (
            local_cluster.kubectl("get", "resourceclaim", ref.name, "-n", namespace, check=False).returncode
            != 0
        ),
        timeout=60,
        what="the claim controller to delete the pod's claim",
    )
    assert await unprepare(started, ref) == ""
    assert not started.dirs.cdi_spec(ref.uid).exists()
    assert started.dirs.checkpoint_claims() == {}


async def test_n8_same_name_claim_waits_for_the_old_uid(
    local_cluster: LocalCluster, started: AgentProcess, node: str, namespace: str
) -> None:
    (published,) = wait_slices(local_cluster, node)
    uuid = next(d for d in published["spec"]["devices"] if d["name"] == "gpu-0")["attributes"]["uuid"][
        "string"
    ]
    only_gpu0 = f'device.attributes["{GPU}"].uuid == "{uuid}"'
    apply_in(
        local_cluster,
        namespace,
        [standalone_claim(name="shared", cel=only_gpu0), *gpu_pod(name="p1", node=node, claim_name="shared")],
    )
    old = claim_ref(wait_allocated_claim(local_cluster, namespace, "p1"))
    assert [d.device for d in (await prepare(started, old)).devices] == ["gpu-0"]

    # Grace-0 delete of pod and claim while the old UID stays prepared (its unprepare "failing").
    local_cluster.kubectl("delete", "pod", "p1", "-n", namespace, "--grace-period=0", "--force")
    local_cluster.kubectl(
        "delete", "resourceclaim", "shared", "-n", namespace, "--wait=true", "--timeout=60s"
    )
    apply_in(
        local_cluster,
        namespace,
        [standalone_claim(name="shared", cel=only_gpu0), *gpu_pod(name="p2", node=node, claim_name="shared")],
    )
    new = claim_ref(wait_allocated_claim(local_cluster, namespace, "p2"))
    assert new.uid != old.uid

    refused = await prepare(started, new)
    assert "gpu-0" in refused.error
    assert old.uid in refused.error
    assert not started.dirs.cdi_spec(new.uid).exists()
    assert list(started.dirs.checkpoint_claims()) == [old.uid]

    assert await unprepare(started, old) == ""
    result = await prepare(started, new)
    assert result.error == ""
    assert [d.device for d in result.devices] == ["gpu-0"]
    assert list(started.dirs.checkpoint_claims()) == [new.uid]


async def test_n10_reboot_invalidates_the_checkpoint(
    local_cluster: LocalCluster, started: AgentProcess, node: str, namespace: str
) -> None:
    ref = allocated_pod_claim(local_cluster, started, node, namespace)
    assert (await prepare(started, ref)).error == ""
    started.kill()
    started.dirs.boot_id.write_text("boot-two\n")
    started.start()
    assert started.dirs.checkpoint_claims() == {}
    assert not started.dirs.cdi_spec(ref.uid).exists()
    assert "dropping 1 prepared claim" in started.log_text()
    assert await unprepare(started, ref) == ""  # nothing of the old boot is reported prepared
    result = await prepare(started, ref)  # kubelet prepares again after the reboot
    assert result.error == ""
    assert started.dirs.checkpoint_claims()[ref.uid]["state"] == "PrepareCompleted"


def _stale_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()  # the file stays behind, nobody listens: what a killed process leaves


def _registry_sockets(agent: AgentProcess) -> list[str]:
    return sorted(p.name for p in agent.dirs.registry.iterdir())


async def test_n13_stale_sockets_and_registration_retry(agent: AgentProcess) -> None:
    _stale_socket(agent.dirs.registration_socket())
    _stale_socket(agent.dirs.plugins / GPU / "dra.sock")
    # kubelet finds the dead socket and fails to register; it retries later.
    with pytest.raises(KubeletClientError):
        await KubeletPluginClient.register_driver(agent.dirs.registry, driver=GPU)

    agent.start()
    async with await KubeletPluginClient.register_driver(agent.dirs.registry, driver=GPU) as kubelet:
        assert kubelet.info.name == GPU
        assert kubelet.info.endpoint == str(agent.dirs.plugins / GPU / "dra.sock")
    assert _registry_sockets(agent) == [f"{GPU}-reg.sock"]

    agent.kill()  # leaves both sockets behind again
    assert _registry_sockets(agent) == [f"{GPU}-reg.sock"]
    with pytest.raises(KubeletClientError):
        await KubeletPluginClient.register_driver(agent.dirs.registry, driver=GPU)
    agent.start()
    async with await KubeletPluginClient.register_driver(agent.dirs.registry, driver=GPU) as kubelet:
        assert kubelet.info.name == GPU
    assert _registry_sockets(agent) == [f"{GPU}-reg.sock"]
    assert sorted(p.name for p in (agent.dirs.plugins / GPU).iterdir() if p.is_socket()) == ["dra.sock"]
