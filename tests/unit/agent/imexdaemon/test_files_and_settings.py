"""compute-domain-daemon's files and settings: imexd.cfg rendered from the agent's template, the
nodes file, the hosts file (its other lines kept, nothing but addresses and daemon names written),
and the environment it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_node_agent.imexdaemon import files
from dra_node_agent.imexdaemon.settings import DaemonSettings, SettingsError
from dra_node_agent.imexdaemon.supervisor import backoff_seconds

from .conftest import CLIQUE, DOMAIN, OTHER_HOSTS, SimNode


def test_config_rendered_from_template_and_nodes_file(sim: SimNode) -> None:
    s = sim.settings()
    files.write_config(
        template_file=s.template_file,
        config_file=s.config_file,
        nodes_file=s.nodes_file,
        pod_ip="10.0.0.7",
        max_nodes=3,
    )
    config = Path(s.config_file).read_text().splitlines()
    assert "IMEX_CMD_BIND_INTERFACE_IP=10.0.0.7" in config
    assert f"IMEX_NODE_CONFIG_FILE={s.nodes_file}" in config
    assert "SERVER_PORT=50000" in config
    assert "IMEX_CMD_PORT=50005" in config
    assert not any("${" in line for line in config)
    assert Path(s.nodes_file).read_text() == (
        "compute-domain-daemon-0000\ncompute-domain-daemon-0001\ncompute-domain-daemon-0002\n"
    )


def test_missing_template_is_named(sim: SimNode) -> None:
    s = sim.settings()
    Path(s.template_file).unlink()
    with pytest.raises(files.FilesError, match=r"imexd\.cfg\.tmpl"):
        files.write_config(
            template_file=s.template_file,
            config_file=s.config_file,
            nodes_file=s.nodes_file,
            pod_ip="10.0.0.7",
            max_nodes=3,
        )


def test_hosts_file_maps_daemons_and_keeps_other_lines(sim: SimNode) -> None:
    daemons: list[dict[str, Any]] = [
        {"nodeName": "a", "ipAddress": "10.0.0.1", "index": 0},
        {"nodeName": "b", "ipAddress": "fd00::2", "index": 2},
        # Left out: an address with a line of its own in it, an index out of range or not a number.
        {"nodeName": "c", "ipAddress": "10.0.0.3\n6.6.6.6 evil", "index": 1},
        {"nodeName": "d", "ipAddress": "10.0.0.4", "index": 4},
        {"nodeName": "e", "ipAddress": "10.0.0.5", "index": True},
        {"nodeName": "f", "ipAddress": "10.0.0.6", "index": "3"},
    ]
    mapping = files.address_map(daemons, max_nodes=4)
    assert mapping == {"compute-domain-daemon-0000": "10.0.0.1", "compute-domain-daemon-0002": "fd00::2"}
    assert files.update_hosts(str(sim.hosts), mapping)
    assert sim.hosts.read_text() == (
        OTHER_HOSTS + "10.0.0.1\tcompute-domain-daemon-0000\nfd00::2\tcompute-domain-daemon-0002\n"
    )
    assert not files.update_hosts(str(sim.hosts), mapping)  # unchanged: not rewritten

    # A daemon that left is no longer mapped; an old line of a daemon name goes too.
    sim.hosts.write_text(sim.hosts.read_text() + "10.9.9.9 compute-domain-daemon-0003 # stale\n")
    assert files.update_hosts(str(sim.hosts), {"compute-domain-daemon-0002": "10.0.0.8"})
    assert sim.hosts.read_text() == OTHER_HOSTS + "10.0.0.8\tcompute-domain-daemon-0002\n"
    assert [p.name for p in sim.root.iterdir() if p.name.startswith(".hosts")] == []  # no temp file left


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_seconds(failures=n, cap=30.0) for n in (1, 2, 3, 5, 6, 7, 500)] == [
        1,
        2,
        4,
        16,
        30,
        30,
        30,
    ]


def _env(**changes: str) -> dict[str, str]:
    env = {
        "COMPUTE_DOMAIN_UUID": DOMAIN,
        "COMPUTE_DOMAIN_NAME": "cd",
        "COMPUTE_DOMAIN_NAMESPACE": "team-a",
        "CLIQUE_ID": CLIQUE,
        "NODE_NAME": "node-a",
        "POD_IP": "10.0.0.1",
        "POD_NAME": "daemon-a",
        "POD_NAMESPACE": "accel-dra",
        "MAX_NODES_PER_IMEX_DOMAIN": "8",
    }
    return {**env, **changes}


def test_settings_from_the_daemonsets_environment() -> None:
    s = DaemonSettings.from_env(_env())
    assert (s.domain_uid, s.clique_id, s.pod_ip, s.max_nodes, s.idle) == (
        DOMAIN,
        CLIQUE,
        "10.0.0.1",
        8,
        False,
    )
    assert (s.config_file, s.hosts_file) == ("/imexd/imexd.cfg", "/etc/hosts")
    assert DaemonSettings.from_env(_env(CLIQUE_ID="", POD_IP="")).idle


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"COMPUTE_DOMAIN_UUID": ""}, "COMPUTE_DOMAIN_UUID is not set (the daemon claim's CDI spec"),
        ({"COMPUTE_DOMAIN_UUID": "Not-A-Uid"}, "COMPUTE_DOMAIN_UUID: 'Not-A-Uid' is not a UID"),
        ({"POD_IP": ""}, "POD_IP is not set"),
        ({"POD_IP": "10.0.0.1 evil"}, "POD_IP: '10.0.0.1 evil' is not an IP address"),
        ({"NODE_NAME": ""}, "NODE_NAME is not set"),
        ({"MAX_NODES_PER_IMEX_DOMAIN": "0"}, "MAX_NODES_PER_IMEX_DOMAIN: 0 is not between 1 and 576"),
        ({"MAX_NODES_PER_IMEX_DOMAIN": "x"}, "MAX_NODES_PER_IMEX_DOMAIN: 'x' is not a whole number"),
        (
            {"COMPUTE_DOMAIN_DAEMON_POLL_SECONDS": "0"},
            "COMPUTE_DOMAIN_DAEMON_POLL_SECONDS: 0.0 is not between",
        ),
    ],
)
def test_settings_refused_with_the_variable_named(changes: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        DaemonSettings.from_env(_env(**changes))
    assert str(info.value).startswith(message)
