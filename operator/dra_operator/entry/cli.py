"""``dra-operator``: subcommands ``run`` (the operator) and ``simulate`` (when installed).

``simulate`` lives in ``dra_operator.entry.simulate``, written separately; when that module exists it
provides ``main(argv) -> int`` and is dispatched to, otherwise the subcommand says it is missing.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import sys
from collections.abc import Sequence

from dra_operator.base import settings as settings_mod

USAGE = """usage: dra-operator <command> [flags]

commands:
  run       run the operator (Kopf) against the cluster
  simulate  allocate claims offline and explain the result (if installed)
  release-claims  before an uninstall: list (or --release) the claims holding the operator's finalizer

'dra-operator <command> --help' shows a command's flags and exit status; errors are one line on
stderr with exit status 2 (for run: bad flags, an unusable kubeconfig, an API server that cannot be
reached at start).
"""


def _fail(message: object) -> int:
    print(f"dra-operator run: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def _check_feature_gates(text: str) -> None:
    from dra_operator.allocator.gates import FeatureGates

    try:
        FeatureGates.from_flag(text)
    except ValueError as exc:
        raise ValueError(f"--feature-gates: {exc}") from None


def _run(argv: Sequence[str]) -> int:
    """Flags and the kubeconfig are checked before anything starts; what can only fail at start-up
    (the first request, the metrics port) is one line too. See EXIT_STATUS in settings."""
    from dra_api import kube  # kubernetes_asyncio: half a second that simulate need not pay

    try:
        settings = settings_mod.parse(argv)
        _check_feature_gates(settings.feature_gates)
        kube.check_connection_config(settings.kubeconfig)
    except (ValueError, kube.ClusterConfigError) as exc:
        return _fail(exc)
    logging.basicConfig(
        level=getattr(logging, settings.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Kopf logs every handler run at INFO; with a handler per watch event that drowns the log.
    logging.getLogger("kopf.objects").setLevel(max(logging.WARNING, logging.getLogger().level))
    from dra_operator.entry import runner

    try:
        asyncio.run(runner.run(settings))
    except (
        kube.ClusterConfigError,
        kube.ClusterUnreachable,
        kube.UnsupportedServer,
        runner.StartupError,
    ) as exc:
        # Not retried here: in a pod the kubelet restarts the operator, as it did before these
        # errors had a line of their own; at a terminal the user fixes the cause.
        return _fail(exc)
    except KeyboardInterrupt:
        return 130
    return 0


def _simulate(argv: Sequence[str]) -> int:
    if importlib.util.find_spec("dra_operator.entry.simulate") is None:
        print(
            "dra-operator simulate: not available in this build (no dra_operator.entry.simulate)",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module("dra_operator.entry.simulate")
    result: int = module.main(list(argv))
    return result


def _release_claims(argv: Sequence[str]) -> int:
    from dra_operator.entry import releaseclaims

    return releaseclaims.main(argv)


COMMANDS = {"run": _run, "simulate": _simulate, "release-claims": _release_claims}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if args else 2
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"dra-operator: unknown command {args[0]!r}\n{USAGE}", end="", file=sys.stderr)
        return 2
    return command(args[1:])


if __name__ == "__main__":
    sys.exit(main())
