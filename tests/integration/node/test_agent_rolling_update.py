"""A seamless agent upgrade on a real kubelet, as the DaemonSet's rolling update (maxSurge 1,
maxUnavailable 0) runs it: the new agent starts beside the old one with its own socket names (from
POD_UID), is ready only once the kubelet registered it, then the old one gets SIGTERM and exits.
A pod keeps its prepared claim throughout, new pods keep arriving, and the claim the old agent
prepared is unprepared by the new one. The agents are processes here: the project's image (and so
the DaemonSet itself on a real node) comes with the install issue.
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.agent.agentproc import GPU, AgentProcess

from .conftest import NAMESPACE, NodeWithAgent, gpu_pod, wait_gone


def _registry(setup: NodeWithAgent) -> list[str]:
    return sorted(p.name for p in setup.node.registry_dir.iterdir() if not p.name.startswith("."))


def _ready(agent: AgentProcess) -> bool:
    assert agent.process is not None
    assert agent.process.poll() is None, f"agent exited:\n{agent.log_tail(40)}"
    return agent.registered()


def _instance(setup: NodeWithAgent, pod_uid: str) -> AgentProcess:
    base = setup.agent
    return AgentProcess(
        node=base.node,
        dirs=base.dirs,
        kubeconfig=base.kubeconfig,
        profiles=base.profiles,
        extra_env={**base.extra_env, "POD_UID": pod_uid},
        log_name=f"agent-{pod_uid}.log",
    )


def test_a_rolling_update_overlaps_two_agents_and_hands_over_without_losing_a_claim(
    node_with_agent: NodeWithAgent,
) -> None:
    setup = node_with_agent
    cluster = setup.cluster
    setup.agent.stop()  # the fixture's agent uses the fixed socket names; these two use POD_UID
    # Short stand-ins for pod UIDs: the test node's folders are deep and unix socket paths are
    # limited to 107 bytes (under /var/lib/kubelet a real 36-character UID fits).
    old, new = _instance(setup, "roll-old"), _instance(setup, "roll-new")
    pods = ["roll-1", "roll-2", "roll-3"]
    try:
        old.start(wait=False)
        cluster.wait_for(lambda: _ready(old), timeout=60, what="the old agent registered and ready")
        cluster.apply(gpu_pod("roll-1", command="echo up; sleep 3600"))
        setup.wait_log("roll-1", "up")
        first = setup.claim_of("roll-1")["metadata"]["uid"]
        assert f"uid {first})" in old.log_text()

        # The surge pod: ready only once the kubelet registered it beside the old one.
        new.start(wait=False)
        cluster.wait_for(lambda: _ready(new), timeout=60, what="the new agent registered and ready")
        assert f"kubelet registered DRA driver {GPU}" in new.log_text()
        assert _registry(setup) == [f"{GPU}-roll-new-reg.sock", f"{GPU}-roll-old-reg.sock"]
        # A pod arriving while both run goes to the newest registration.
        cluster.apply(gpu_pod("roll-2", command="echo up; sleep 3600"))
        setup.wait_log("roll-2", "up")
        second = setup.claim_of("roll-2")["metadata"]["uid"]
        assert f"prepared ResourceClaim {NAMESPACE}/" in new.log_text()
        assert f"uid {second})" in new.log_text()
        assert f"uid {second})" not in old.log_text()

        # The old pod is stopped: it takes its own sockets away and exits cleanly.
        assert old.stop() == 0
        assert _registry(setup) == [f"{GPU}-roll-new-reg.sock"]
        plugin_sockets = sorted(p.name for p in (setup.node.plugins_dir / GPU).glob("*.sock"))
        assert plugin_sockets == ["dra-roll-new.sock"]
        cluster.apply(gpu_pod("roll-3", command="echo up; sleep 3600"))
        setup.wait_log("roll-3", "up")
        third = setup.claim_of("roll-3")["metadata"]["uid"]
        for pod in ("roll-1", "roll-2"):
            assert cluster.get_json("pod", pod, "-n", NAMESPACE)["status"]["phase"] == "Running"

        # Teardown by the new agent, including the claim the old one prepared.
        cluster.kubectl("delete", "pod", *pods, "-n", NAMESPACE, "--wait=false")
        for uid in (first, second, third):
            wait_gone(cluster, setup.agent.dirs.cdi_spec(uid))
        cluster.wait_for(
            lambda: not set(setup.agent.dirs.checkpoint_claims()) & {first, second, third},
            timeout=60,
            what="the three claims out of the checkpoint",
        )
        assert f"unprepared ResourceClaim {NAMESPACE}/" in new.log_text()
        assert f"uid {first})" in new.log_text().split("unprepared", 1)[1]
    finally:
        for agent in (old, new):
            if agent.process is not None and agent.process.poll() is None:
                agent.stop()
        cluster.kubectl("delete", "pod", *pods, "-n", NAMESPACE, "--ignore-not-found", "--wait=false")
        cluster.kubectl(
            "delete", "resourceclaimtemplates", *pods, "-n", NAMESPACE, "--ignore-not-found", "--wait=false"
        )
        setup.agent.start()  # the fixture's own agent, for the module's teardown


def test_a_killed_instances_sockets_are_removed_when_the_next_one_starts(
    node_with_agent: NodeWithAgent,
) -> None:
    """A SIGKILLed pod's per-pod sockets would never be reused by a pod with another UID; the next
    agent removes the ones nothing listens on, and leaves a live instance's alone."""
    setup = node_with_agent
    cluster = setup.cluster
    setup.agent.stop()
    crashed, survivor, successor = (_instance(setup, n) for n in ("roll-dead", "roll-live", "roll-next"))
    try:
        crashed.start(wait=False)
        cluster.wait_for(lambda: _ready(crashed), timeout=60, what="the first agent ready")
        crashed.kill()
        assert f"{GPU}-roll-dead-reg.sock" in _registry(setup)
        survivor.start(wait=False)
        cluster.wait_for(lambda: _ready(survivor), timeout=60, what="the second agent ready")
        assert _registry(setup) == [f"{GPU}-roll-live-reg.sock"]
        successor.start(wait=False)
        cluster.wait_for(lambda: _ready(successor), timeout=60, what="the third agent ready")
        assert _registry(setup) == [f"{GPU}-roll-live-reg.sock", f"{GPU}-roll-next-reg.sock"]
        dead = Path(setup.node.plugins_dir / GPU / "dra-roll-dead.sock")
        assert not dead.exists()
        assert "no instance listens on it any more" in survivor.log_text()
    finally:
        for agent in (survivor, successor):
            if agent.process is not None and agent.process.poll() is None:
                agent.stop()
        setup.agent.start()
