"""Print what this node (or a simulated profile) would publish: `python -m dra_node_agent.discovery`.

python -m dra_node_agent.discovery --profile h100-80gb-x8 --node-name node-a
python -m dra_node_agent.discovery --sysfs-root /host/sys --dev-root /host/dev
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import yaml

from dra_node_agent.devices import check_inventory
from dra_node_agent.discovery.detect import select_backends
from dra_node_agent.discovery_config import DiscoveryConfig
from dra_node_agent.simulated.discovery import available_profiles


async def _main(args: argparse.Namespace) -> int:
    config = DiscoveryConfig(
        node_name=args.node_name,
        backends=tuple(args.backends.split(",")),
        simulated_profiles=tuple(args.profile),
        driver_root=args.driver_root,
        dev_root=args.dev_root,
        sysfs_root=args.sysfs_root,
    )
    status = 0
    for backend in await select_backends(config):
        inventory = await backend.discover()
        problems = check_inventory(inventory)
        status = status or (1 if problems else 0)
        document = {
            "driver": inventory.driver,
            "available": inventory.available,
            "errors": list(inventory.errors) + problems,
            "devices": inventory.slice_devices(),
        }
        sys.stdout.write(yaml.safe_dump(document, sort_keys=False, explicit_start=True))
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dra_node_agent.discovery", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--node-name", default="node", help="Node name (seeds UUIDs of simulated devices).")
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        help=f"Simulated profile: {', '.join(available_profiles())}.",
    )
    parser.add_argument("--backends", default="auto", help="auto, or a comma list of nvidia,tpu.")
    parser.add_argument("--driver-root", default="/")
    parser.add_argument("--dev-root", default="/dev")
    parser.add_argument("--sysfs-root", default="/sys")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return asyncio.run(_main(args))


if __name__ == "__main__":
    raise SystemExit(main())
