"""``compute-domain-daemon check``: the daemon pod's startup, readiness and liveness probe.

Ready when idle (no NVLink clique on the node), or when ``nvidia-imex-ctl -q`` says READY for the
daemon's config, as NVIDIA's probe asks. It imports neither the API client nor the supervisor, and
asks one subprocess, so it stays cheap at a probe every second while the pod starts."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

from dra_node_agent.imexdaemon.process import IMEX_CTL, query_ready
from dra_node_agent.nvidia import imex_config


def check(env: Mapping[str, str], *, ctl_program: str = IMEX_CTL) -> tuple[bool, str]:
    """Whether the daemon is ready, and one line saying so or why not."""
    if not env.get("COMPUTE_DOMAIN_UUID", "").strip():
        return (
            False,
            "not ready: COMPUTE_DOMAIN_UUID is not set "
            "(the daemon claim's CDI spec did not reach this container)",
        )
    if not env.get("CLIQUE_ID", "").strip():
        return True, "ready: idle, no NVLink clique on this node"
    config = f"{env.get('COMPUTE_DOMAIN_DAEMON_CONFIG_DIR') or imex_config.FOLDER}/imexd.cfg"
    if not os.path.isfile(config):
        return False, f"not ready: {config} is not written yet (the daemon is joining its clique)"
    ready, why = asyncio.run(query_ready(config_file=config, program=ctl_program))
    return ready, f"{'ready' if ready else 'not ready'}: {why}"
