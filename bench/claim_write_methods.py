"""Benchmark: how fast the API server takes claim status writes as a JSON merge patch and as a PUT.

The operator writes ``status.allocation`` with a merge patch carrying the resourceVersion. The API
server applies a merge patch to the current object (encode, merge, decode) before the update; a
full-object PUT skips that step. This measures both on one local control plane, with a
ServiceAccount token as in ``bench.operator_allocation``: for each of three rounds, 1000 new claims
per method, written from one client with 16 in flight.

    .venv/bin/python -m bench.claim_write_methods [--claims 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from typing import Any

from kubernetes_asyncio import client

from bench.clusters import cluster_for
from bench.operator_allocation import GROUP, VERSION, bounded, gpu_claim, service_account_kubeconfigs
from dra_api.kube import make_api_client
from dra_devcluster import LocalCluster

NS = "bench-methods"


async def _round(custom: Any, method: str, names: list[str]) -> float:
    created = await bounded(
        [
            custom.create_namespaced_custom_object(
                GROUP, VERSION, NS, "resourceclaims", gpu_claim(n, NS, "x")
            )
            for n in names
        ],
        50,
    )

    async def write(obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        allocation = {
            "devices": {
                "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "p", "device": name}]
            }
        }
        if method == "merge patch":
            await custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                NS,
                "resourceclaims",
                name,
                {
                    "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                    "status": {"allocation": allocation},
                },
                _content_type="application/merge-patch+json",
            )
        else:
            await custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, NS, "resourceclaims", name, {**obj, "status": {"allocation": allocation}}
            )

    start = time.monotonic()
    await bounded([write(obj) for obj in created], 16)
    return len(names) / (time.monotonic() - start)


async def bench(cluster: LocalCluster, *, claims: int, rounds: int) -> None:
    _, kubeconfig = service_account_kubeconfigs(cluster)
    api = await make_api_client(kubeconfig=kubeconfig)
    try:
        custom: Any = client.CustomObjectsApi(api)
        core: Any = client.CoreV1Api(api)
        await core.create_namespace({"metadata": {"name": NS}})
        rates: dict[str, list[float]] = {"merge patch": [], "put": []}
        for i in range(rounds):
            for method, found in rates.items():
                names = [f"{method.split()[0]}{i}-{j:04d}" for j in range(claims)]
                found.append(await _round(custom, method, names))
        print(f"claim status writes, one client (16 in flight), {rounds} rounds of {claims}:")
        for method, found in rates.items():
            print(f"  {method}: " + ", ".join(f"{r:.0f}/s" for r in found))
    finally:
        await api.close()


def main(argv: Sequence[str] | None = None, *, cluster: LocalCluster | None = None) -> None:
    """The benchmark on a control plane of its own, or on ``cluster`` (see :mod:`bench.clusters`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with cluster_for(cluster, prefix="bench-methods-") as used:
        asyncio.run(bench(used, claims=args.claims, rounds=args.rounds))


if __name__ == "__main__":
    main()
