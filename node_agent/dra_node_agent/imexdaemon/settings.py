"""The daemon's settings, from the environment the DaemonSet and the daemon claim's CDI spec give it.

The operator's DaemonSet sets ``NODE_NAME``, ``POD_IP``, ``POD_UID``, ``POD_NAME``,
``POD_NAMESPACE`` and ``MAX_NODES_PER_IMEX_DOMAIN``; the node agent's prepare of the daemon claim
adds ``CLIQUE_ID`` (empty without NVLink fabric) and ``COMPUTE_DOMAIN_UUID/NAME/NAMESPACE``. The
``COMPUTE_DOMAIN_DAEMON_*`` variables move the files and the API credentials, for tests.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from dra_api import computedomains as cd
from dra_node_agent.nvidia import imex_config

# NVIDIA's IMEX domain holds at most this many nodes (an NVL576 system); more is a typo.
MAX_NODES_LIMIT: Final = 576


class SettingsError(ValueError):
    """A variable is missing or wrong; the message names it."""


@dataclass(frozen=True)
class DaemonSettings:
    """What one IMEX daemon needs to know (see the module docstring for where each comes from)."""

    # The domain's UID; unset means the daemon claim's CDI spec never reached the container.
    domain_uid: str
    # The domain's name and namespace, for log lines.
    domain_name: str
    domain_namespace: str
    # <cluster UUID>.<clique ID> of this node's GPUs; empty on a node without NVLink fabric (idle).
    clique_id: str
    # This node, the daemon's pod and its address (IMEX's command service binds to it).
    node_name: str
    pod_ip: str
    pod_name: str
    pod_namespace: str
    # Most daemons in one clique: the nodes file lists this many DNS names.
    max_nodes: int = cd.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN
    # The domain's folder (the agent's template, the rendered config and nodes file).
    config_dir: str = imex_config.FOLDER
    # The hosts file the daemon keeps the DNS names in (nvidia-imex resolves them through it).
    hosts_file: str = "/etc/hosts"
    # A kubeconfig file; empty: the pod's ServiceAccount.
    kubeconfig: str = ""
    # How often the clique is read and nvidia-imex-ctl asked, in seconds.
    poll_seconds: float = 2.0
    # nvidia-imex is restarted after 1 s, doubling up to this many seconds while it keeps failing.
    max_backoff_seconds: float = 30.0

    @property
    def idle(self) -> bool:
        return not self.clique_id

    @property
    def config_file(self) -> str:
        return f"{self.config_dir}/imexd.cfg"

    @property
    def template_file(self) -> str:
        return f"{self.config_dir}/{imex_config.TEMPLATE_NAME}"

    @property
    def nodes_file(self) -> str:
        return f"{self.config_dir}/nodes.cfg"

    @staticmethod
    def from_env(env: Mapping[str, str]) -> DaemonSettings:
        def need(name: str) -> str:
            value = env.get(name, "").strip()
            if not value:
                raise SettingsError(f"{name} is not set{_WHY.get(name, '')}")
            return value

        uid = need("COMPUTE_DOMAIN_UUID")
        if not cd.is_uid(uid):
            raise SettingsError(f"COMPUTE_DOMAIN_UUID: {uid!r} is not a UID")
        clique_id = env.get("CLIQUE_ID", "").strip()
        pod_ip = env.get("POD_IP", "").strip()
        if clique_id:
            pod_ip = need("POD_IP")
            try:
                ipaddress.ip_address(pod_ip)
            except ValueError:
                raise SettingsError(f"POD_IP: {pod_ip!r} is not an IP address") from None
        return DaemonSettings(
            domain_uid=uid,
            domain_name=env.get("COMPUTE_DOMAIN_NAME", ""),
            domain_namespace=env.get("COMPUTE_DOMAIN_NAMESPACE", ""),
            clique_id=clique_id,
            node_name=need("NODE_NAME"),
            pod_ip=pod_ip,
            pod_name=need("POD_NAME"),
            pod_namespace=need("POD_NAMESPACE"),
            max_nodes=_number(env, "MAX_NODES_PER_IMEX_DOMAIN", cd.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN),
            config_dir=env.get("COMPUTE_DOMAIN_DAEMON_CONFIG_DIR") or imex_config.FOLDER,
            hosts_file=env.get("COMPUTE_DOMAIN_DAEMON_HOSTS_FILE") or "/etc/hosts",
            kubeconfig=env.get("COMPUTE_DOMAIN_DAEMON_KUBECONFIG", ""),
            poll_seconds=_seconds(env, "COMPUTE_DOMAIN_DAEMON_POLL_SECONDS", 2.0),
            max_backoff_seconds=_seconds(env, "COMPUTE_DOMAIN_DAEMON_MAX_BACKOFF_SECONDS", 30.0),
        )


_WHY: Final = {
    "COMPUTE_DOMAIN_UUID": " (the daemon claim's CDI spec did not reach this container: is CDI on?)",
    "POD_IP": " (the DaemonSet sets it from status.podIP)",
}


def _number(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise SettingsError(f"{name}: {text!r} is not a whole number") from None
    if not 1 <= value <= MAX_NODES_LIMIT:
        raise SettingsError(f"{name}: {value} is not between 1 and {MAX_NODES_LIMIT}")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"{name}: {text!r} is not a number of seconds") from None
    if not 0.05 <= value <= 3600:
        raise SettingsError(f"{name}: {value} is not between 0.05 and 3600 seconds")
    return value
