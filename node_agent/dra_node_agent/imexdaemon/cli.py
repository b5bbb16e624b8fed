"""``compute-domain-daemon``: the command line of a ComputeDomain's IMEX daemon pods.

``compute-domain-daemon run`` runs until SIGTERM or SIGINT; ``compute-domain-daemon check`` is
their probe (exit 0 when ready). Both read their settings from the environment
(``imexdaemon.settings``; docs/configuration.md lists the variables).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Final

from dra_api.oneline import OneLineParser
from dra_node_agent import lean_imports
from dra_node_agent.imexdaemon.check import check
from dra_node_agent.imexdaemon.settings import DaemonSettings, SettingsError
from dra_node_agent.tenant_text import one_line

logger = logging.getLogger("compute-domain-daemon")

MAX_LOG_MESSAGE: Final = 65536

_DESCRIPTION = """\
The IMEX daemon of one node of an NVIDIA ComputeDomain (accel-dra). `run` joins the domain's
ComputeDomainClique, renders imexd.cfg and nodes.cfg, maps the daemons' DNS names in the hosts
file, supervises nvidia-imex and reports its readiness in the clique; on a node without NVLink
fabric (CLIQUE_ID empty) it idles. `check` exits 0 when the daemon is ready (idle counts as ready),
1 with one line saying why not. Settings come from the environment."""


class _OneLineFormatter(logging.Formatter):
    """One line per message: a clique entry's text cannot start a log line of its own."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message, limit=MAX_LOG_MESSAGE)
        return super().formatMessage(record)


def _configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    level = os.environ.get("COMPUTE_DOMAIN_DAEMON_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level if level in ("DEBUG", "INFO", "WARNING", "ERROR") else "INFO", handlers=[handler]
    )
    logging.getLogger("kubernetes_asyncio").setLevel(logging.WARNING)


async def _run(settings: DaemonSettings) -> None:
    # Imported here: `check` runs every few seconds and needs none of it.
    from dra_api.kube import make_api_client
    from dra_node_agent.imexdaemon.pod_api import label_own_pod
    from dra_node_agent.imexdaemon.supervisor import Supervisor
    from dra_node_agent.nvidia.imex_clique import CliqueMembership

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    api = await make_api_client(kubeconfig=settings.kubeconfig or None)
    try:
        clique = None
        if not settings.idle:
            clique = CliqueMembership(
                api=api,
                namespace=settings.pod_namespace,
                domain_uid=settings.domain_uid,
                clique_id=settings.clique_id,
                node_name=settings.node_name,
                max_nodes=settings.max_nodes,
            )

        async def label(clique_id: str) -> None:
            await label_own_pod(
                api=api, namespace=settings.pod_namespace, name=settings.pod_name, clique_id=clique_id
            )

        await Supervisor(settings=settings, clique=clique, label_pod=label).run(stop)
    finally:
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="compute-domain-daemon",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser
    )
    commands.add_parser("run", help="run the IMEX daemon until SIGTERM")
    commands.add_parser("check", help="exit 0 when the daemon is ready (the pod's probe)")
    args = parser.parse_args(argv)
    if args.command == "check":
        ready, line = check(os.environ)
        print(line)
        return 0 if ready else 1
    _configure_logging()
    try:
        settings = DaemonSettings.from_env(os.environ)
    except SettingsError as exc:
        print(f"compute-domain-daemon: {exc}", file=sys.stderr)
        return 2
    lean_imports.install()  # before anything imports kubernetes_asyncio: a smaller daemon
    from dra_api.kube import ClusterConfigError

    try:
        asyncio.run(_run(settings))
    except ClusterConfigError as exc:
        print(f"compute-domain-daemon: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
