"""The node agent's main loop: discovery -> ResourceSlices -> kubelet plugin servers, per driver.

Start-up order per driver: discover devices, publish the pool (a failure here is retried in the
background, the plugin still starts so prepared claims can be unprepared), load the checkpoint,
start the health monitor and the device status writer (``status.devices`` of prepared claims, which
follows the monitor), then serve the plugin sockets. SIGTERM/SIGINT stops the plugin servers (their
sockets are removed, so kubelet sees the driver go) and leaves the ResourceSlices in place: a
restarted agent finds them unchanged and running pods are not disturbed.

A GPU a claim holds for passthrough is bound to vfio-pci: its GPU and MIG devices leave the slice
and the health monitor's watch while it is (and its passthrough device while a container holds
it), following the prepare handler's ``holds``; a change of them republishes at once, after a
discovery pass (NVML sees the GPU again once it is given back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_api.kube import ApiClient, UnsupportedServer, first_resource_version, make_api_client
from dra_node_agent import prepare_tools
from dra_node_agent.checkpoint_report import CorruptionReporter
from dra_node_agent.claim_reader import ClaimReader
from dra_node_agent.device_status import DeviceStatusWriter, KubeClaimStatusApi, StatusSupport
from dra_node_agent.devices import DiscoveredDevice, DiscoveredInventory, DiscoveryBackend
from dra_node_agent.discovery.detect import select_backends
from dra_node_agent.discovery_config import DiscoveryConfig
from dra_node_agent.driver_health import DriverHealth, attach_health
from dra_node_agent.health import HealthSettings, TaintEffect
from dra_node_agent.health.events import NodeEvents
from dra_node_agent.http_endpoints import HttpEndpoints
from dra_node_agent.nvidia.health_probe import DEFAULT_IGNORED_XIDS, parse_xid_list
from dra_node_agent.plugin import RunningPlugin, serve_plugin
from dra_node_agent.prepare import Holds, PrepareHandler
from dra_node_agent.publisher import SlicePublisher
from dra_node_agent.settings import Settings, SettingsError, describe
from dra_node_agent.tpu.discovery import DEFAULT_TPU_ENV_FILE
from dra_node_agent.vendor_record import ApiAccess

logger = logging.getLogger(__name__)

# A PrepareStarted entry younger than this may belong to a prepare still in flight elsewhere
# (a second agent during a rolling update); the periodic clean-up leaves it alone.
STALE_PREPARE_AGE = 120.0
STALE_CLEANUP_INTERVAL = 600.0


@dataclass
class DriverRuntime:
    """Everything running for one driver."""

    backend: DiscoveryBackend
    inventory: DiscoveredInventory
    publisher: SlicePublisher
    handler: PrepareHandler
    checkpoint_reporter: CorruptionReporter | None = None
    device_status: DeviceStatusWriter | None = None
    plugin: RunningPlugin | None = None
    health: DriverHealth | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # Set when the claims' holds of GPUs for passthrough change: discover and publish now.
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def published_devices(self) -> list[DiscoveredDevice]:
        """The inventory's devices but those the claims' holds keep out (``prepare.holds``)."""
        holds = self.handler.holds
        return [d for d in self.inventory.devices if holds.published(d)]

    def watched_devices(self) -> list[DiscoveredDevice]:
        """The devices the health monitor watches (never a GPU for passthrough)."""
        holds = self.handler.holds
        return [d for d in self.inventory.devices if holds.watched(d)]

    def undecorated_slice_devices(self) -> list[dict[str, Any]]:
        return [d.to_slice_device() for d in self.published_devices()]

    def slice_devices(self) -> list[dict[str, Any]]:
        """The devices to publish, with the health monitor's taints applied."""
        devices = self.undecorated_slice_devices()
        return self.health.decorate(devices) if self.health is not None else devices

    def holds_changed(self, holds: Holds) -> None:
        """The prepare handler's holds changed: watch what is ours again, discover and publish."""
        del holds  # read through the handler
        if self.health is not None:
            self.health.set_devices(self.watched_devices())
        self.wake.set()


def discovery_config(settings: Settings) -> DiscoveryConfig:
    return DiscoveryConfig(
        node_name=settings.node_name,
        backends=settings.backends,
        simulated_profiles=settings.simulate_profile,
        gpu_driver=settings.gpu_driver_name,
        tpu_driver=settings.tpu_driver_name,
        driver_root=str(settings.driver_root),
        host_driver_root=str(settings.host_driver_root),
        cdi_hook_path=settings.nvidia_cdi_hook_path or None,
        dev_root=str(settings.dev_root),
        sysfs_root=str(settings.sysfs_root),
        proc_root=str(settings.proc_root),
        # Only a file named explicitly applies to simulated hosts: the machine's own is not theirs.
        tpu_env_path=settings.tpu_env_file or (None if settings.simulate_profile else DEFAULT_TPU_ENV_FILE),
        simulation_dir=str(settings.state_dir / "simulated"),
        dynamic_mig=settings.dynamic_mig,
        passthrough=settings.passthrough_support,
        consumable_shares=settings.consumable_shares,
        compute_domains=settings.compute_domains,
        imex_host_managed=settings.compute_domain_imex_mode == "hostManaged",
        strict_fabric=settings.nvlink_fabric_strict,
    )


async def _rediscover(runtime: DriverRuntime, *, interval: float) -> None:
    """Re-discover every ``interval`` seconds, or at once when woken (``DriverRuntime.wake``), and
    republish when the devices changed or it was woken."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(runtime.wake.wait(), timeout=interval)
        woken = runtime.wake.is_set()
        runtime.wake.clear()
        try:
            inventory = await runtime.backend.discover()
        except Exception:  # a discovery bug must not stop the agent; the last inventory stays
            logger.exception("re-discovery of driver %s failed", runtime.backend.driver)
            continue
        if not inventory.available:
            continue
        changed = (inventory.slice_devices(), inventory.counter_sets) != (
            runtime.inventory.slice_devices(),
            runtime.inventory.counter_sets,
        )
        if changed:
            logger.info("devices of driver %s changed; republishing", inventory.driver)
            runtime.inventory = inventory
            runtime.handler.set_inventory(inventory)
            if runtime.health is not None:
                runtime.health.set_devices(runtime.watched_devices())
        if changed or woken:
            try:
                await runtime.publisher.publish(
                    runtime.slice_devices(),
                    inventory.slice_counter_sets(),
                    guards=inventory.guard_counter_sets(),
                )
            except Exception as exc:  # the publisher's own loop retries with the devices it was given
                logger.warning(
                    "publishing the devices of driver %s failed (will retry): %s", inventory.driver, exc
                )
                runtime.publisher.mark_dirty()


async def _clean_up_stale_claims(handler: PrepareHandler, *, interval: float) -> None:
    """At start and then every ``interval`` seconds, drop interrupted prepares of deleted claims."""
    older_than = 0.0  # at start every PrepareStarted entry is from a process that is gone
    while True:
        try:
            await handler.clean_up_stale(older_than=older_than)
        except Exception:  # a failed pass is retried next time; it must not stop the agent
            logger.exception("stale claim clean-up of driver %s failed", handler.driver)
        older_than = STALE_PREPARE_AGE
        await asyncio.sleep(interval)


async def _start_driver(
    *,
    settings: Settings,
    api: ApiClient,
    api_version: str,
    backend: DiscoveryBackend,
    status_support: StatusSupport,
) -> DriverRuntime:
    driver = backend.driver
    inventory = await backend.discover()
    for problem in inventory.errors:
        logger.warning("discovery of driver %s: %s", driver, problem)
    publisher = SlicePublisher(
        api=api,
        driver=driver,
        node_name=settings.node_name,
        api_version=api_version,
        resync_delay=settings.slice_resync_delay,
        resync_interval=settings.resync_interval,
        request_timeout=settings.api_request_timeout,
        watch_inactivity_timeout=settings.watch_inactivity_timeout,
    )
    device_status = None
    if await asyncio.to_thread(prepare_tools.writes_device_status, backend):
        device_status = DeviceStatusWriter(
            driver=driver,
            api=KubeClaimStatusApi(
                api=api, api_version=api_version, request_timeout=settings.api_request_timeout
            ),
            support=status_support,
            vendor=await asyncio.to_thread(prepare_tools.status_data, backend),
        )
    handler = await _prepare_handler(
        settings=settings,
        api=api,
        api_version=api_version,
        backend=backend,
        inventory=inventory,
        device_status=device_status,
    )
    # Listening before the first load, so a checkpoint found corrupt at start is reported too.
    reporter = CorruptionReporter(
        driver=driver,
        path=handler.store.path,
        events=NodeEvents(api=api, node_name=settings.node_name, component=driver),
        loop=asyncio.get_running_loop(),
    )
    handler.store.add_corruption_listener(reporter)
    await handler.start()
    runtime = DriverRuntime(
        backend=backend,
        inventory=inventory,
        publisher=publisher,
        handler=handler,
        checkpoint_reporter=reporter,
        device_status=device_status,
    )
    handler.add_holds_listener(runtime.holds_changed)
    if settings.health_enabled:
        runtime.health = await _attach_health(runtime, settings=settings, api=api, api_version=api_version)
    if device_status is not None:
        if runtime.health is not None:
            device_status.use_health(runtime.health.monitor)
            runtime.health.monitor.add_change_listener(device_status.devices_changed)
        device_status.start()
    await _serve(runtime, settings=settings)
    return runtime


async def _prepare_handler(
    *,
    settings: Settings,
    api: ApiClient,
    api_version: str,
    backend: DiscoveryBackend,
    inventory: DiscoveredInventory,
    device_status: DeviceStatusWriter | None,
) -> PrepareHandler:
    """The driver's prepare handler, with the tools its vendor's record builds."""
    driver = backend.driver
    tools = await asyncio.to_thread(
        prepare_tools.tools_for,
        backend,
        settings=settings,
        access=ApiAccess(
            api=api,
            api_version=api_version,
            node_name=settings.node_name,
            driver=driver,
            request_timeout=settings.api_request_timeout,
        ),
        mps_root=settings.checkpoint_dir(driver=driver) / "mps",
    )
    return PrepareHandler(
        driver=driver,
        node_name=settings.node_name,
        inventory=inventory,
        claims=ClaimReader(
            api=api,
            driver=driver,
            api_version=api_version,
            request_timeout=settings.claim_read_timeout,
            attempts=settings.claim_read_attempts,
        ),
        state_dir=settings.checkpoint_dir(driver=driver),
        cdi_dir=settings.cdi_dir,
        proc_root=settings.proc_root,
        max_prepared_claims=settings.max_prepared_claims,
        claim_context=tools.claim_context,
        gpu_sharing=tools.gpu_sharing,
        mps=tools.mps,
        dynamic_mig=tools.dynamic_mig,
        passthrough=tools.passthrough,
        vendor_env=tools.vendor_env,
        device_status=device_status,
        domains=tools.domains,
        ready_budget_s=settings.compute_domain_ready_timeout,
    )


async def _attach_health(
    runtime: DriverRuntime, *, settings: Settings, api: ApiClient, api_version: str
) -> DriverHealth | None:
    return await attach_health(
        backend=runtime.backend,
        devices=runtime.watched_devices(),
        slice_devices=runtime.undecorated_slice_devices,
        publisher=runtime.publisher,
        api=api,
        api_version=api_version,
        node_name=settings.node_name,
        settings=HealthSettings(
            poll_interval=settings.health_poll_interval,
            recovery_period=settings.health_recovery_period,
            taint_effect=TaintEffect(settings.health_taint_effect),
        ),
        ignored_xids=DEFAULT_IGNORED_XIDS | parse_xid_list(settings.additional_xids_to_ignore),
    )


async def _serve(runtime: DriverRuntime, *, settings: Settings) -> None:
    """Publish the pool, start the background loops, then serve the kubelet's plugin sockets."""
    driver, publisher = runtime.backend.driver, runtime.publisher
    try:
        await publisher.publish(
            runtime.slice_devices(),
            runtime.inventory.slice_counter_sets(),
            guards=runtime.inventory.guard_counter_sets(),
        )
    except Exception as exc:  # retried by the publisher's loop; the plugin must still serve unprepare
        logger.warning("first publication of driver %s failed (will retry): %s", driver, exc)
        publisher.mark_dirty()
    runtime.tasks.append(asyncio.create_task(publisher.run(), name=f"publisher-{driver}"))
    runtime.tasks.append(
        asyncio.create_task(
            _rediscover(runtime, interval=settings.resync_interval), name=f"discover-{driver}"
        )
    )
    runtime.tasks.append(
        asyncio.create_task(
            _clean_up_stale_claims(runtime.handler, interval=STALE_CLEANUP_INTERVAL),
            name=f"stale-claims-{driver}",
        )
    )
    domains = runtime.handler.domains
    if domains is not None:
        runtime.tasks.append(asyncio.create_task(domains.run(), name=f"domains-{driver}"))
    runtime.plugin = await serve_plugin(
        driver=driver,
        handler=runtime.handler,
        # A channel's prepare waits for its domain's daemon, whose claim is this driver's too.
        serialize=not runtime.handler.waits_for_readiness,
        registry_dir=settings.kubelet_registry_dir,
        plugins_dir=settings.kubelet_plugins_dir,
        instance=settings.instance or None,
        health=runtime.health.monitor.health_source() if runtime.health is not None else None,
    )


async def _stop_driver(runtime: DriverRuntime) -> None:
    if runtime.plugin is not None:
        await runtime.plugin.stop()
    if runtime.health is not None:
        await runtime.health.stop()
    if runtime.device_status is not None:
        await runtime.device_status.stop()
    for task in runtime.tasks:
        task.cancel()
    for task in runtime.tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if runtime.checkpoint_reporter is not None:
        await runtime.checkpoint_reporter.aclose()
    if runtime.handler.claim_context is not None:
        await runtime.handler.claim_context.aclose()
    if runtime.handler.domains is not None:
        await runtime.handler.domains.aclose()


async def _served_version(api: ApiClient, *, stop: asyncio.Event, request_timeout_s: float) -> str | None:
    """The resource.k8s.io version to use, retried while the API server is unreachable: a node
    agent (re)started during an API outage waits for it rather than crash-looping, since the
    kubelet's growing restart back-off would delay it long after the API server is back.

    None when asked to stop first. A server that serves no known version is a permanent error.
    """
    backoff = 1.0
    while not stop.is_set():
        try:
            return await first_resource_version(api, request_timeout_s=request_timeout_s)
        except UnsupportedServer:
            raise
        except Exception as exc:  # unreachable, TLS, 5xx: the API server may be starting
            logger.warning("API server discovery failed, retrying in %.0f s: %s", backoff, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=backoff)
            backoff = min(backoff * 2, 30.0)
    return None


def _unregistered(runtimes: Sequence[DriverRuntime]) -> str | None:
    """Why the agent is not ready: a driver the kubelet has not registered (or rejected)."""
    for runtime in runtimes:
        plugin = runtime.plugin
        if plugin is None or plugin.registered:
            continue
        if plugin.registration_error:
            return f"kubelet rejected driver {runtime.backend.driver}: {plugin.registration_error}"
        return f"waiting for the kubelet to register driver {runtime.backend.driver}"
    return None


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def run_agent(settings: Settings, *, stop: asyncio.Event | None = None) -> int:
    """Run until ``stop`` is set (by SIGTERM/SIGINT when not given); returns the exit status."""
    if stop is None:
        stop = asyncio.Event()
        _install_signal_handlers(stop)
    logger.info("starting node agent: %s", ", ".join(describe(settings)))
    # First what cannot work at all (ClusterConfigError), before anything listens.
    api = await make_api_client(kubeconfig=settings.kubeconfig)
    endpoints = HttpEndpoints(address=settings.metrics_address)
    try:
        await endpoints.start()
    except OSError as exc:
        await api.close()
        # asyncio's strerror repeats the address; the errno's own text does not.
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise SettingsError(
            f"setting metrics_address: cannot listen on {settings.metrics_address}: {reason}"
        ) from exc
    runtimes: list[DriverRuntime] = []
    try:
        api_version = await _served_version(api, stop=stop, request_timeout_s=settings.api_request_timeout)
        if api_version is None:
            return 0
        backends = await select_backends(discovery_config(settings))
        # Shared: a server that drops status.devices drops it for every driver (one log line).
        status_support = StatusSupport()
        for backend in backends:
            runtimes.append(
                await _start_driver(
                    settings=settings,
                    api=api,
                    api_version=api_version,
                    backend=backend,
                    status_support=status_support,
                )
            )
        endpoints.not_ready_because = lambda: _unregistered(runtimes)
        endpoints.ready = True
        logger.info(
            "node agent ready on node %s: drivers %s",
            settings.node_name,
            ", ".join(r.backend.driver for r in runtimes) or "none",
        )
        await stop.wait()
        logger.info("stopping: removing plugin sockets, leaving ResourceSlices in place")
    finally:
        endpoints.ready = False
        for runtime in runtimes:
            await _stop_driver(runtime)
        await endpoints.stop()
        await api.close()
    return 0
