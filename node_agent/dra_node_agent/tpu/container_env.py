"""The TPU_* environment of a TPU claim's containers, as GKE's device plugin and Google's TPU DRA
driver set it: the (sub-)slice topology, its bounds, the visible chips and the worker identity.

``TpuEnv`` hands it to the CDI writer (its ``VendorEnv``), which puts it into the claim's spec;
it is pure (no I/O).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dra_node_agent.devices import DiscoveredDevice, DiscoveredInventory, TpuHostInfo
from dra_node_agent.opaqueconfig import DriverConfig, TpuConfig
from dra_node_agent.tpu.discovery import GENERATIONS, chips_per_host_bounds, host_topology
from dra_node_agent.tpu.workers import TpuWorkers

TPU_RUNTIME_METRICS_FIRST_PORT = 8431
_ENV_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def _bounds(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def tpu_topology_wrap(*, generation: str, dims: Sequence[int]) -> str:
    """TPU_TOPOLOGY_WRAP: 3D generations wrap every dim iff all are >= 4; 2D ones wrap dims of 16."""
    gen = GENERATIONS.get(generation)
    padded = [*dims, 1, 1][:3]
    if gen is not None and gen.dims == 3:
        wrap = all(d >= 4 for d in padded)
        return ",".join(["true" if wrap else "false"] * 3)
    return ",".join("true" if d == 16 else "false" for d in padded)


def multihost_worker(
    *, host: TpuHostInfo, chips: int, config: TpuConfig | None, workers: TpuWorkers | None
) -> tuple[int, tuple[str, ...]] | None:
    """The worker ID and the workers' hostnames (in index order, maybe none) of a container with
    ``chips`` chips of this host, when they span a multi-host slice and the ID is known; else None.

    Per field the claim's ``TpuConfig`` comes first, then ``workers`` (derived from the pod's
    Indexed Job or JobSet at prepare), then the host's tpu-env WORKER_ID.
    """
    if chips != host.chips_on_host or host.single_host:
        return None  # a single-host slice, or a sub-slice of this host: worker 0 of "localhost"
    worker_id = host.worker_id
    hostnames = host.worker_hostnames
    if workers is not None:
        worker_id, hostnames = workers.worker_id, workers.hostnames
    if config is not None and config.worker_id is not None:
        worker_id = config.worker_id
    if config is not None and config.worker_hostnames:
        hostnames = config.worker_hostnames
    return None if worker_id is None else (worker_id, tuple(hostnames))


def tpu_claim_env(
    *,
    host: TpuHostInfo,
    chips: int,
    driver: str,
    node_name: str | None,
    config: TpuConfig | None = None,
    workers: TpuWorkers | None = None,
) -> tuple[str, ...]:
    """The TPU_* environment a container needs for `chips` chips of this host.

    With every chip of the host the slice is the host's slice (possibly multi-host: TPU_TOPOLOGY and
    TPU_ACCELERATOR_TYPE are the whole slice's, TPU_HOST_BOUNDS its hosts per dimension). With
    fewer, the container gets a single-host sub-slice of its own. TPU_VISIBLE_CHIPS counts from 0
    because a container only sees its own chips and libtpu numbers those from 0.

    The worker identity of a multi-host slice comes, per variable, from the claim's `TpuConfig`
    first, then from `workers` (derived from the pod's Indexed Job or JobSet at prepare), then from
    the host's tpu-env WORKER_ID. A single-host slice is always worker 0 of "localhost".
    """
    gen = GENERATIONS.get(host.generation)
    dims_count = gen.dims if gen is not None else len(host.dims)
    if chips == host.chips_on_host:
        topology = host.topology
        per_host = host.chips_per_host_bounds
        dims = host.dims
        padded = [*dims, 1, 1][:3]
        host_bounds = [max(1, d // b) for d, b in zip(padded, per_host, strict=True)]
        slice_chips = host.slice_chips
        single_host = host.single_host
    else:
        topology = host_topology(chips, dims=dims_count)
        per_host = chips_per_host_bounds(chips)
        dims = tuple(int(d) for d in topology.split("x"))
        host_bounds = [1, 1, 1]
        slice_chips = chips
        single_host = True
    env = [
        "TPU_SKIP_MDS_QUERY=true",
        f"TPU_ACCELERATOR_TYPE={host.generation}-{slice_chips * host.cores_per_chip}",
        f"TPU_TOPOLOGY={topology}",
        f"TPU_TOPOLOGY_WRAP={tpu_topology_wrap(generation=host.generation, dims=dims)}",
        "TPU_TOPOLOGY_ALT=false",
        f"TPU_CHIPS_PER_HOST_BOUNDS={_bounds(per_host)}",
        f"TPU_HOST_BOUNDS={_bounds(host_bounds)}",
        f"TPU_VISIBLE_CHIPS={','.join(str(i) for i in range(chips))}",
        "TPU_RUNTIME_METRICS_PORTS="
        + ",".join(str(TPU_RUNTIME_METRICS_FIRST_PORT + i) for i in range(chips)),
        # Unprefixed twins, as GKE's device plugin and the TPU DRA driver also set them.
        f"CHIPS_PER_HOST_BOUNDS={_bounds(per_host)}",
        f"HOST_BOUNDS={_bounds(host_bounds)}",
        f"WRAP={tpu_topology_wrap(generation=host.generation, dims=dims)}",
        "ALT=false",
        f"DRA_RESOURCE_DRIVER_NAME={driver}",
    ]
    identity = multihost_worker(host=host, chips=chips, config=config, workers=workers)
    if single_host:
        env += ["TPU_WORKER_ID=0", "TPU_WORKER_HOSTNAMES=localhost"]
    elif identity is not None:
        # Multi-host identity normally comes from the workload controller; set it only when known.
        worker_id, hostnames = identity
        env.append(f"TPU_WORKER_ID={worker_id}")
        if hostnames:
            env.append(f"TPU_WORKER_HOSTNAMES={','.join(hostnames)}")
    resilient = dims_count == 3 and len(dims) == 3 and all(d >= 4 for d in dims)
    if config is not None and config.ici_resiliency is not None:
        resilient = config.ici_resiliency
    if resilient or (config is not None and config.ici_resiliency is not None):
        env.append(f"ENABLE_ICI_RESILIENCY={'true' if resilient else 'false'}")
    if node_name:
        env.append(f"KUBERNETES_NODE_NAME={node_name}")
    return tuple(env)


def tpu_device_env(*, device: DiscoveredDevice, claim_uid: str) -> str:
    """TPU_DEVICE_<id>_RESOURCE_CLAIM=<claim UID>, <id> being `accel0` or the VFIO group."""
    local = _ENV_NAME_UNSAFE.sub("_", device.local_id or device.name)
    return f"TPU_DEVICE_{local}_RESOURCE_CLAIM={claim_uid}"


class TpuEnv:
    """The CDI writer's ``VendorEnv`` for TPU drivers; its context of a claim is the pod's
    ``TpuWorkers`` (``multihost.TpuWorkerResolver``). An inventory without a TPU host (no chips
    found) gets no environment."""

    def device_env(
        self, device: DiscoveredDevice, *, claim_uid: str, inventory: DiscoveredInventory
    ) -> tuple[str, ...]:
        if inventory.tpu_host is None:
            return ()
        return (tpu_device_env(device=device, claim_uid=claim_uid),)

    def claim_env(
        self,
        devices: Sequence[DiscoveredDevice],
        *,
        inventory: DiscoveredInventory,
        node_name: str | None,
        config: DriverConfig | None,
        context: TpuWorkers | None,
    ) -> tuple[str, ...]:
        if inventory.tpu_host is None:
            return ()
        return tpu_claim_env(
            host=inventory.tpu_host,
            chips=len(devices),
            driver=inventory.driver,
            node_name=node_name,
            # Prepare passes the claim's tpu.google.com TpuConfig, the one that shapes these.
            config=config if isinstance(config, TpuConfig) else None,
            workers=context,
        )
