"""``dra-local-cluster``: build the control-plane binaries or the product image, or run a local cluster.

Arguments are checked before anything is built or started. Errors, a bad argument or a missing
prerequisite alike, are one line on stderr starting ``dra-local-cluster:`` with exit status 2;
an error that carries a log or command output tail (a component or build step that failed) has
it below that line, indented. Errors of no known kind are bugs and keep their traceback.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from dra_api.oneline import OneLineParser
from dra_devcluster.binaries import (
    BINARY_NAMES,
    CONTAINERD_VERSION,
    HELM_VERSION,
    NODE_BINARY_NAMES,
    BinariesUnavailable,
    NodeUnavailable,
    cache_dir,
    ensure_binaries,
    ensure_helm,
    ensure_node_binaries,
    node_cache_dir,
)
from dra_devcluster.cluster import ControlPlaneError, LocalCluster
from dra_devcluster.images import ImageUnavailable
from dra_devcluster.node import NodeStartError
from dra_devcluster.versions import (
    DEFAULT,
    VERSION_ENV,
    KubernetesVersion,
    UnsupportedVersion,
    resolve,
    supported_list,
)

PROG = "dra-local-cluster"
_FAKE_NODES_HINT = (
    "a machine that cannot run a kubelet can still run the control plane with Node objects that have "
    "none: dra-local-cluster up --fake-nodes"
)
EXIT_STATUS = """\
exit status: 0 done (up, demo: stopped with Ctrl-C or SIGTERM, or --exit); 1 demo: not every
example pod ran; 2 a bad argument, a missing prerequisite (Debian packages, Go, a static busybox)
or a component that did not start, one line on stderr; 130 interrupted while starting."""


class _UsageError(Exception):
    """A bad argument found after parsing (a folder that cannot be created): one line."""


class _Parser(OneLineParser):
    program = PROG


def _node_count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {count}")
    return count


def _kubernetes_version(text: str) -> KubernetesVersion:
    try:
        return resolve(text)
    except UnsupportedVersion as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _writable_folder(path: Path, *, flag: str) -> Path:
    """``path``, created if need be and shown writable, so that a folder the command could not use
    is refused before anything is built or started."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise _UsageError(f"{flag} {path}: cannot create or write to it: {exc.strerror or exc}") from None
    return path


def _fail(message: object, *, hint: str = "") -> int:
    """The error's first line on stderr; the rest of a message (a log tail) indented below it."""
    first, _, detail = str(message).strip().partition("\n")
    print(f"{PROG}: {first}{'; ' + hint if hint else ''}", file=sys.stderr)
    for line in detail.splitlines():
        print(f"  {line}", file=sys.stderr)
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description=f"A real Kubernetes control plane and nodes on loopback; Kubernetes {supported_list()}",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, *, help: str) -> argparse.ArgumentParser:
        # Every command's --help ends with the exit status, as the top level's does.
        return sub.add_parser(
            name, help=help, epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter
        )

    def kubernetes_flag(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--kubernetes",
            metavar="VERSION",
            type=_kubernetes_version,
            help=f"Kubernetes version: 1.34, 1.34.x or an exact supported one ({supported_list()}); "
            f"default: ${VERSION_ENV}, else {DEFAULT.version}",
        )

    build = command(
        "build", help="find or build the control-plane and node binaries and helm; print where they are"
    )
    kubernetes_flag(build)
    image = command(
        "image",
        help="build the product image accel-dra:<version> as an OCI archive (mmdebstrap, no Docker)",
    )
    image.add_argument("--out", type=Path, help="copy the archive into this directory (e.g. dist)")
    image.add_argument("--rebuild", action="store_true", help="build even when the cache has it")
    up = command("up", help="start a control plane and keep it running until Ctrl-C")
    up.add_argument(
        "--workdir", type=Path, help="directory for certs, data and logs (default: a new temp dir)"
    )
    up.add_argument(
        "--nodes",
        type=_node_count,
        default=1,
        help="number of real nodes (kubelet + containerd) to start, 0 or more (default 1)",
    )
    up.add_argument(
        "--fake-nodes",
        action="store_true",
        help="create Node objects without a kubelet instead (for machines that cannot run one)",
    )
    up.add_argument("--exit", action="store_true", help="stop again right after start-up (smoke test)")
    kubernetes_flag(up)
    demo = command(
        "demo",
        help="the full demo: control plane, real nodes, operator, agents (simulated GPUs, TPUs), examples",
    )
    demo.add_argument("--workdir", type=Path, help="directory for everything the demo writes (default: temp)")
    demo.add_argument("--exit", action="store_true", help="print the results and stop instead of waiting")
    demo.add_argument(
        "--fake-nodes",
        action="store_true",
        help="Node objects without a kubelet, the demo plays the kubelet (for machines that cannot run one)",
    )
    kubernetes_flag(demo)
    return parser


def _stop_on_signals() -> None:
    """Ctrl-C and SIGTERM both unwind through the cluster's context manager, which stops every
    process it started. Set explicitly: a shell starting us in the background leaves SIGINT ignored,
    and SIGTERM's default would kill us without stopping the children."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def _image(*, out: Path | None, rebuild: bool) -> int:
    from dra_devcluster.productimage import ImageBuildError, ensure_product_image

    if out is not None:
        _writable_folder(out, flag="--out")
    started = time.monotonic()
    try:
        image = ensure_product_image(rebuild=rebuild)
    except ImageBuildError as err:
        return _fail(f"building the image: {err}")
    path = image.path
    if out is not None:
        path = out / image.path.name
        shutil.copyfile(image.path, path)
    how = "from the cache" if image.cached else f"built in {time.monotonic() - started:.0f} s"
    print(f"{image.name} ({how}): {path}")
    print(f"  manifest {image.manifest_digest}; {path.stat().st_size / 2**20:.0f} MiB")
    for digest in image.layer_digests:
        print(f"  layer {digest}")
    print(f"load it into containerd: ctr -n k8s.io images import {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    kubernetes: KubernetesVersion | None = None
    if args.command in ("build", "up", "demo"):
        # Before anything starts: a version named by the environment that is not supported.
        try:
            kubernetes = args.kubernetes or resolve()
        except UnsupportedVersion as err:
            return _fail(err)
    workdir: Path | None = None
    if args.command in ("up", "demo"):
        # Before anything starts: a folder the cluster could not write its first file to.
        try:
            workdir = _writable_folder(
                args.workdir or Path(tempfile.mkdtemp(prefix="accel-dra-cluster-")), flag="--workdir"
            )
        except (_UsageError, OSError) as err:  # OSError: mkdtemp in an unusable TMPDIR
            return _fail(err)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        if args.command == "build":
            started = time.monotonic()
            assert kubernetes is not None
            binaries = ensure_binaries(kubernetes=kubernetes)
            print(
                f"binaries for Kubernetes {kubernetes.version} / etcd {kubernetes.etcd} "
                f"ready in {time.monotonic() - started:.0f} s (cache: {cache_dir(kubernetes)}):"
            )
            for name in BINARY_NAMES:
                print(f"  {name}: {getattr(binaries, name.replace('-', '_'))}")
            started = time.monotonic()
            helm = ensure_helm()
            print(f"helm {HELM_VERSION} ready in {time.monotonic() - started:.0f} s: {helm}")
            started = time.monotonic()
            node = ensure_node_binaries(kubernetes=kubernetes)
            print(
                f"node binaries (kubelet {kubernetes.version}, containerd {CONTAINERD_VERSION}) ready in "
                f"{time.monotonic() - started:.0f} s (cache: {node_cache_dir(kubernetes)}):"
            )
            for name in (*NODE_BINARY_NAMES, "runc"):
                print(f"  {name}: {getattr(node, name.replace('-', '_'))}")
            print(f"  CNI plugins: {node.cni_dir}")
            return 0
        if args.command == "image":
            return _image(out=args.out, rebuild=args.rebuild)
        assert workdir is not None
        assert kubernetes is not None
        _stop_on_signals()
        if args.command == "demo":
            from dra_devcluster.demo import run_demo

            return run_demo(
                workdir=workdir, exit_after=args.exit, fake_nodes=args.fake_nodes, kubernetes=kubernetes
            )
        with LocalCluster(workdir=workdir, kubernetes=kubernetes) as cluster:
            for i in range(args.nodes):
                if args.fake_nodes:
                    cluster.add_node(f"node-{i + 1}")
                else:
                    cluster.add_real_node(f"node-{i + 1}")
            print(
                f"\nKubernetes {kubernetes.version} control plane ready at {cluster.server} in "
                f"{cluster.timings['start_s']:.1f} s."
            )
            print(f"Logs: {cluster.logs_dir}\n\nPoint kubectl at it:\n")
            print(f"  export KUBECONFIG={cluster.kubeconfig}")
            print(f"  {cluster.binaries.kubectl if cluster.binaries else 'kubectl'} get nodes\n")
            if args.exit:
                return 0
            print("Press Ctrl-C to stop everything.")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                print("\nstopping")
        return 0
    except _UsageError as err:
        return _fail(err)
    # The known ways a missing prerequisite or a failed start shows; anything else is a bug.
    except (NodeStartError, NodeUnavailable) as err:
        return _fail(err, hint=_FAKE_NODES_HINT)
    except (BinariesUnavailable, ControlPlaneError, ImageUnavailable) as err:
        return _fail(err)
    except KeyboardInterrupt:
        # Everything started was stopped on the way out of the cluster's context manager.
        print("stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
