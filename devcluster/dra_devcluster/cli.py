"""``dra-local-cluster``: build the control-plane binaries or the product image, or run a local cluster."""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from dra_devcluster.binaries import (
    BINARY_NAMES,
    CONTAINERD_VERSION,
    ETCD_VERSION,
    HELM_VERSION,
    KUBERNETES_VERSION,
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
from dra_devcluster.node import NodeStartError

_FAKE_NODES_HINT = (
    "A machine that cannot run a kubelet can still run the control plane with Node objects that have "
    "none: dra-local-cluster up --fake-nodes."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dra-local-cluster",
        description=f"A real Kubernetes {KUBERNETES_VERSION} control plane (etcd {ETCD_VERSION}) on loopback",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "build", help="find or build the control-plane and node binaries and helm; print where they are"
    )
    image = sub.add_parser(
        "image",
        help="build the product image accel-dra:<version> as an OCI archive (mmdebstrap, no Docker)",
    )
    image.add_argument("--out", type=Path, help="copy the archive into this directory (e.g. dist)")
    image.add_argument("--rebuild", action="store_true", help="build even when the cache has it")
    up = sub.add_parser("up", help="start a control plane and keep it running until Ctrl-C")
    up.add_argument(
        "--workdir", type=Path, help="directory for certs, data and logs (default: a new temp dir)"
    )
    up.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="number of real nodes (kubelet + containerd) to start (default 1)",
    )
    up.add_argument(
        "--fake-nodes",
        action="store_true",
        help="create Node objects without a kubelet instead (for machines that cannot run one)",
    )
    up.add_argument("--exit", action="store_true", help="stop again right after start-up (smoke test)")
    demo = sub.add_parser(
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

    started = time.monotonic()
    try:
        image = ensure_product_image(rebuild=rebuild)
    except ImageBuildError as err:
        print(f"error: building the image: {err}", file=sys.stderr)
        return 2
    path = image.path
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        if args.command == "build":
            started = time.monotonic()
            binaries = ensure_binaries()
            print(
                f"binaries for Kubernetes {KUBERNETES_VERSION} / etcd {ETCD_VERSION} "
                f"ready in {time.monotonic() - started:.0f} s (cache: {cache_dir()}):"
            )
            for name in BINARY_NAMES:
                print(f"  {name}: {getattr(binaries, name.replace('-', '_'))}")
            started = time.monotonic()
            helm = ensure_helm()
            print(f"helm {HELM_VERSION} ready in {time.monotonic() - started:.0f} s: {helm}")
            started = time.monotonic()
            node = ensure_node_binaries()
            print(
                f"node binaries (kubelet {KUBERNETES_VERSION}, containerd {CONTAINERD_VERSION}) ready in "
                f"{time.monotonic() - started:.0f} s (cache: {node_cache_dir()}):"
            )
            for name in (*NODE_BINARY_NAMES, "runc"):
                print(f"  {name}: {getattr(node, name.replace('-', '_'))}")
            print(f"  CNI plugins: {node.cni_dir}")
            return 0
        if args.command == "image":
            return _image(out=args.out, rebuild=args.rebuild)
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="accel-dra-cluster-"))
        _stop_on_signals()
        if args.command == "demo":
            from dra_devcluster.demo import run_demo

            return run_demo(workdir=workdir, exit_after=args.exit, fake_nodes=args.fake_nodes)
        with LocalCluster(workdir=workdir) as cluster:
            for i in range(args.nodes):
                if args.fake_nodes:
                    cluster.add_node(f"node-{i + 1}")
                else:
                    cluster.add_real_node(f"node-{i + 1}")
            print(f"\nControl plane ready at {cluster.server} in {cluster.timings['start_s']:.1f} s.")
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
    except NodeStartError as err:
        print(f"error: {err}\n{_FAKE_NODES_HINT}", file=sys.stderr)
        return 2
    except (BinariesUnavailable, ControlPlaneError) as err:
        hint = f"\n{_FAKE_NODES_HINT}" if isinstance(err, NodeUnavailable) else ""
        print(f"error: {err}{hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Everything started was stopped on the way out of the cluster's context manager.
        print("stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
