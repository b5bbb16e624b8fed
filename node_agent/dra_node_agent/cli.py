"""``dra-node-agent``: the node agent's command line.

``dra-node-agent run [flags]`` (or just ``dra-node-agent [flags]``) runs the agent until
SIGTERM/SIGINT; every flag also reads from an environment variable (``DRA_AGENT_<FLAG>``), see
``dra-node-agent run --help``.
``dra-node-agent profiles`` lists the built-in simulated hardware profiles.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import Final

from dra_api.oneline import OneLineParser
from dra_node_agent import lean_imports
from dra_node_agent import settings as settings_module
from dra_node_agent.tenant_text import one_line

logger = logging.getLogger(__name__)

MAX_LOG_MESSAGE: Final = 65536  # characters of one log message; a longer one is cut

_RUN_DESCRIPTION = """\
Run the DRA node agent: discover this node's accelerators (NVIDIA GPUs through NVML, Google TPUs
through PCI sysfs, or a simulated profile), publish them as ResourceSlices (one pool per driver,
named after the node), and serve the kubelet plugin sockets (registration, DRA v1 and v1beta1,
device health) that prepare and unprepare claims: per-claim CDI specs, a checkpoint that survives
restarts. SIGTERM stops serving and removes the sockets; the ResourceSlices stay so running pods
are undisturbed by a restart.

Each flag can also be set by environment variable (shown per flag); a flag wins over the
environment, the environment over the default."""

_RUN_EPILOG = """\
exit status: 0 stopped by SIGTERM or SIGINT; 2 a bad flag or environment variable (an unknown
simulated profile, a folder it cannot write, a metrics address it cannot listen on), an unusable
kubeconfig (none outside a pod, missing, malformed), or an API server that serves no
resource.k8s.io version this driver speaks. Each error is one line on stderr. An API server that
cannot be reached is retried, at start-up too, with a warning per attempt."""


_Parser = OneLineParser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dra-node-agent", description="Kubernetes DRA node agent for NVIDIA GPUs and Google TPUs."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    run = commands.add_parser(
        "run",
        help="run the agent",
        description=_RUN_DESCRIPTION,
        epilog=_RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    settings_module.add_arguments(run)
    commands.add_parser("profiles", help="list the built-in simulated hardware profiles")
    return parser


class OneLineFormatter(logging.Formatter):
    """Each message on one line, its control characters escaped: a tenant's text in a message (a
    config key with a newline) cannot start a log line of its own. Tracebacks keep their lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message, limit=MAX_LOG_MESSAGE)
        return super().formatMessage(record)


def _configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # The API client logs whole response bodies at DEBUG; that is never what an agent log needs.
    logging.getLogger("kubernetes_asyncio").setLevel(max(logging.INFO, logging.getLevelName(level.upper())))


def _profiles() -> int:
    from dra_node_agent.simulated.discovery import available_profiles, profile_summary

    names = available_profiles()
    summary = profile_summary(names)
    width = max((len(n) for n in names), default=4)
    print(f"{'NAME':<{width}}  DESCRIPTION")
    for name in names:
        print(f"{name:<{width}}  {summary[name]}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    # Before anything imports kubernetes_asyncio: its generated client is loaded on demand.
    lean_imports.install()
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not arguments or (arguments[0].startswith("-") and arguments[0] not in ("-h", "--help")):
        arguments.insert(0, "run")  # `dra-node-agent [flags]` runs the agent, as a DaemonSet does
    args = build_parser().parse_args(arguments)
    if args.command == "profiles":
        return _profiles()
    from dra_api import kube  # imports kubernetes_asyncio: only after lean_imports.install()

    try:
        settings = settings_module.load_settings(args=args)
        _check_before_start(settings)
    except (settings_module.SettingsError, kube.ClusterConfigError) as exc:
        return _fail(exc)
    _configure_logging(settings.log_level)
    from dra_node_agent.agent import run_agent

    try:
        return asyncio.run(run_agent(settings))
    except (settings_module.SettingsError, kube.ClusterConfigError, kube.UnsupportedServer) as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        return 130


def _fail(message: object) -> int:
    print(f"dra-node-agent: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def _check_before_start(settings: settings_module.Settings) -> None:
    """What would otherwise fail only after the agent logged in and started serving: the simulated
    profiles, the folders it writes, the kubeconfig (or the pod it runs in)."""
    from dra_api import kube
    from dra_node_agent.agent import discovery_config
    from dra_node_agent.simulated.record import simulated_profiles

    try:
        simulated_profiles(discovery_config(settings))
    except ValueError as exc:  # ProfileError included
        raise settings_module.SettingsError(f"setting simulate_profile: {exc}") from None
    settings_module.check_folders(settings)
    kube.check_connection_config(settings.kubeconfig)


if __name__ == "__main__":
    sys.exit(main())
