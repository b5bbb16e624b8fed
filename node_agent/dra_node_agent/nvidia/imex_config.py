"""The IMEX daemon's configuration, shared by the node agent and ``compute-domain-daemon``.

The agent writes the template into a domain's folder when it prepares the domain's daemon claim
(``imexd.cfg.tmpl``); the daemon, which knows its pod IP only once running, renders it into
``imexd.cfg`` and writes ``nodes.cfg``, the static list of the domain's DNS names
(``compute-domain-daemon-0000`` ...), which its ``/etc/hosts`` maps to the daemons' addresses as
they join. The settings are NVIDIA's for daemons in pods: logs to stderr, no daemonizing, peers on
port 50000, the command service on the pod IP's port 50005, and recovery quorum on restart.
"""

from __future__ import annotations

import string
from typing import Final

FOLDER: Final = "/imexd"
CONFIG: Final = f"{FOLDER}/imexd.cfg"
TEMPLATE: Final = f"{FOLDER}/imexd.cfg.tmpl"
NODES: Final = f"{FOLDER}/nodes.cfg"
TEMPLATE_NAME: Final = "imexd.cfg.tmpl"
DNS_NAME_FORMAT: Final = "compute-domain-daemon-{index:04d}"
SERVER_PORT: Final = 50000
COMMAND_PORT: Final = 50005

TEMPLATE_TEXT: Final = f"""\
# nvidia-imex configuration of a ComputeDomain's IMEX daemon (accel-dra). Written by the node agent
# as a template; compute-domain-daemon fills in its pod IP and writes imexd.cfg next to it.
LOG_LEVEL=4
LOG_FILE_NAME=
LOG_APPEND_TO_LOG=0
LOG_USE_SYSLOG=0
DAEMONIZE=0
BIND_INTERFACE_IP=
SERVER_PORT={SERVER_PORT}
IMEX_NODE_CONFIG_FILE=${{IMEX_NODE_CONFIG_FILE}}
NETWORK_INTERFACE=
IMEX_WAIT_FOR_QUORUM=RECOVERY
IMEX_ENABLE_AUTH_ENCRYPTION=0
IMEX_CMD_ENABLED=1
IMEX_CMD_BIND_INTERFACE_IP=${{IMEX_CMD_BIND_INTERFACE_IP}}
IMEX_CMD_PORT={COMMAND_PORT}
IMEX_CMD_UNIX_DOMAIN_PATH=
IMEX_NODE_DISCONNECTED_GRACE_TIME=-1
"""


def render(template: str, *, pod_ip: str, nodes_file: str = NODES) -> str:
    """The daemon's imexd.cfg from the template the agent wrote."""
    return string.Template(template).safe_substitute(
        IMEX_CMD_BIND_INTERFACE_IP=pod_ip, IMEX_NODE_CONFIG_FILE=nodes_file
    )


def dns_name(index: int) -> str:
    return DNS_NAME_FORMAT.format(index=index)


def nodes_file(max_nodes: int) -> str:
    """The static nodes.cfg: one DNS name per possible daemon of a clique."""
    return "".join(f"{dns_name(i)}\n" for i in range(max_nodes))
