"""``dra-operator run``: wire the parts together and run Kopf embedded (``kopf.operator``).

Besides Kopf's own tasks, seven of ours run beside it: the claim watch (see
:mod:`dra_operator.watch.claimwatch`), the claim worker, the Event poster (see
:mod:`dra_operator.client.events`),
the heartbeat (liveness and peering state), the sweeper (slices of vanished nodes, stale
reservations), the explainer of claims kube-scheduler leaves pending (see
:mod:`dra_operator.reporters.pending`), and the HTTP server for ``/healthz`` and ``/metrics``. They are
created before Kopf starts, so Kopf's shutdown leaves them to us, and we stop them when Kopf
returns.

One active instance, chosen through the ClusterKopfPeering object ``accel-dra-operator`` (Kopf's
format, so an instance of an older release that still lets Kopf pause its streams agrees on the
same one): :mod:`dra_operator.watch.peering` renews this instance's entry every couple of seconds,
decides active or standby by Kopf's rule, and fences writes: every write to claims, slices and
classes checks it first, so an instance that lost its entry (or is stopping) writes nothing before
the other can start. Priorities are random per instance, because the rule pauses *both* instances
on a tie. SIGTERM hands over at once: the instance steps down, removes its entry, then stops Kopf.
Every allocation write also carries a resourceVersion precondition, so even two active instances
could not double-write a claim.

Kopf itself runs standalone: its watches run on the standby too, as controller-runtime's caches do,
and its handlers only feed the model (the one write among them, a DeviceClass repair, checks that
this instance is active). So the standby lists the cluster once at start and its watches keep its
model current; a takeover queues every claim and allocates at once, instead of listing the whole
cluster first (at 5,000 nodes and 20,000 claims that listing alone took 10 s). A re-list follows in
the background, as the check the listing before allocating used to be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import kopf

from dra_api.kube import ApiClient, first_resource_version, make_api_client
from dra_api.names import PROJECT_DOMAIN
from dra_operator.allocator import FeatureGates
from dra_operator.allocator.gates import RELEASE_DEFAULTS
from dra_operator.base.settings import Settings
from dra_operator.claims.coordinator import ClaimReconciler
from dra_operator.client.connection import write_pool
from dra_operator.client.errors import error_text, transient
from dra_operator.client.events import EventSink
from dra_operator.client.kubeapi import KubeApi, server_version
from dra_operator.client.login import kubeconfig_login, service_account_login
from dra_operator.computedomains import ComputeDomainController, build_controller
from dra_operator.model.cluster import ClusterModel
from dra_operator.model.metrics import Metrics
from dra_operator.model.ownership import allocated_by_us
from dra_operator.model.workqueue import ClaimQueue
from dra_operator.planner import PlannerPlacer
from dra_operator.planner.placement import Placer
from dra_operator.reporters.extended import ExtendedResourceReporter
from dra_operator.reporters.pending import SchedulerClaimExplainer
from dra_operator.reporters.tpuslices import MixedSliceReporter
from dra_operator.upkeep.deviceclasses import DeviceClassKeeper
from dra_operator.upkeep.slices import OrphanSliceCollector
from dra_operator.watch import kopfwatchlog
from dra_operator.watch.claimwatch import ClaimWatch
from dra_operator.watch.handlers import OperatorParts, build_registry
from dra_operator.watch.liveness import Health, make_app, serve
from dra_operator.watch.peering import Peering, PeeringTimes

logger = logging.getLogger(__name__)
_NEWEST = "v{}.{}".format(*max(RELEASE_DEFAULTS))

KOPF_FINALIZER = f"{PROJECT_DOMAIN}/kopf"
LIST_PAGE_SIZE = 500
"""Objects per page of Kopf's listings (``limit``/``continue``)."""
STOP_GRACE_S = 10.0
"""After SIGTERM or SIGINT, how long Kopf may take to stop before the operator stops anyway."""


class StartupError(RuntimeError):
    """Something the operator needs to start cannot be had (the metrics port); one line."""


def configure_kopf(kopf_settings: kopf.OperatorSettings, settings: Settings) -> None:
    """Kopf's settings in the project's names and with explicit watch timeouts."""
    kopf_settings.persistence.finalizer = KOPF_FINALIZER
    kopf_settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=PROJECT_DOMAIN, v1=False
    )
    kopf_settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PROJECT_DOMAIN, key="last-handled-configuration", v1=False
    )
    # Sent as the watch's timeoutSeconds query parameter, which the API server parses as an integer.
    kopf_settings.watching.server_timeout = int(settings.watch_server_timeout_s)
    kopf_settings.watching.client_timeout = settings.watch_client_timeout_s
    kopf_settings.watching.connect_timeout = settings.watch_connect_timeout_s
    # Kopf drops a watch that brought nothing for this long and resumes it from the last version.
    kopf_settings.watching.inactivity_timeout = settings.watch_inactivity_timeout_s
    kopf_settings.networking.request_timeout = settings.request_timeout_s
    # Kopf lists in one response by default and holds it whole (every slice, node and pod as raw
    # JSON) while its handlers fill the model: a peak several times the model's size that the
    # process keeps as RSS. Pages bound it (bench/model_memory.py: 1,000 slices, 43 MiB -> 26 MiB at
    # 500 a page); 500 is what client-go's reflector and the operator's own re-lists use.
    kopf_settings.watching.chunk_size = LIST_PAGE_SIZE
    # The operator posts its own Events (with reasons users can filter on); Kopf's handler
    # chatter would only add noise on every claim.
    kopf_settings.posting.enabled = False


SWITCH_INTERVAL_S = 0.0005


@dataclass
class _Parts:
    """The running operator's parts, built once the API server answered (see :func:`_build`)."""

    api: KubeApi
    model: ClusterModel
    metrics: Metrics
    keeper: DeviceClassKeeper
    events: EventSink
    claims: ClaimReconciler
    peering: Peering | None
    health: Health
    orphans: OrphanSliceCollector
    domains: ComputeDomainController | None


async def run(
    settings: Settings,
    *,
    placer: Placer | None = None,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Connect, build the parts, serve ``/healthz`` and ``/metrics``, start our tasks, run Kopf
    until it stops; then stop each part in the reverse order (each part's stop is beside its
    start, in the context managers below)."""
    identity = settings.resolved_identity()
    # The event loop gives up the GIL at every socket call; while a search thread computes, it
    # gets it back only when the thread is asked to yield, after the switch interval (5 ms by
    # default): a few such waits per claim made ordinary claims seconds late beside hostile
    # searches. A shorter interval costs the searches a little switching.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    async with contextlib.AsyncExitStack() as stack:
        api_client, version = await stack.enter_async_context(_connected(settings))
        api = KubeApi(api_client, resource_version=version, instance=identity, writes=write_pool(api_client))
        stack.push_async_callback(api.close_writes)
        gates = await _allocation_gates(api_client, settings)
        await _discover_taint_rules(api, settings)
        parts = _build(
            api=api, api_client=api_client, settings=settings, gates=gates, placer=placer, identity=identity
        )
        await stack.enter_async_context(_serving(parts, settings))
        stop = stop_flag if stop_flag is not None else asyncio.Event()
        kopf_ready = asyncio.Event()
        await stack.enter_async_context(
            _running(parts, settings, stop=stop, kopf_ready=kopf_ready, ready_flag=ready_flag)
        )
        logger.info(
            "starting: identity %s, priority %d, ownership %s, resource.k8s.io/%s",
            identity,
            settings.priority,
            settings.ownership.value,
            version,
        )
        await _run_kopf(parts, settings, stop=stop, kopf_ready=kopf_ready)


@contextlib.asynccontextmanager
async def _connected(settings: Settings) -> AsyncIterator[tuple[ApiClient, str]]:
    """The API client and the resource.k8s.io version the server serves; closed on the way out
    (also when the first request fails: an unclosed session would add a warning to the one-line
    error)."""
    api_client = await make_api_client(kubeconfig=settings.kubeconfig)
    try:
        version = await first_resource_version(api_client, request_timeout_s=settings.request_timeout_s)
        yield api_client, version
    finally:
        await api_client.close()


def _build(
    *,
    api: KubeApi,
    api_client: ApiClient,
    settings: Settings,
    gates: FeatureGates,
    placer: Placer | None,
    identity: str,
) -> _Parts:
    model = ClusterModel()
    metrics = Metrics()
    keeper = DeviceClassKeeper(api=api, settings=settings)
    events, claims = _build_claim_path(
        api=api, settings=settings, gates=gates, placer=placer, model=model, metrics=metrics, keeper=keeper
    )
    peering, health = _build_peering(api=api, settings=settings, identity=identity, metrics=metrics)
    metrics.attach_active(identity, lambda: health.active)
    metrics.attach_synced(claims.synced.is_set)
    orphans = OrphanSliceCollector(
        model=model, api=api, drivers=settings.drivers, grace=settings.orphan_slice_grace_s
    )
    domains = (
        build_controller(
            settings=settings,
            api_client=api_client,
            events=events,
            active=lambda: health.active,
            registry=metrics.registry,
        )
        if settings.compute_domains
        else None
    )
    return _Parts(
        api=api,
        model=model,
        metrics=metrics,
        keeper=keeper,
        events=events,
        claims=claims,
        peering=peering,
        health=health,
        orphans=orphans,
        domains=domains,
    )


def _build_claim_path(
    *,
    api: KubeApi,
    settings: Settings,
    gates: FeatureGates,
    placer: Placer | None,
    model: ClusterModel,
    metrics: Metrics,
    keeper: DeviceClassKeeper,
) -> tuple[EventSink, ClaimReconciler]:
    """The claim path and what its parts share, built here and handed to them: the queue of claims
    and the Event sink, which posts at full pace only while that queue is idle."""
    queue = ClaimQueue()
    events = EventSink(api, idle=queue.idle, dropped=metrics.events_dropped)
    placer = placer or PlannerPlacer(
        policy=settings.placement_policy,
        gates=gates,
        prefer_last_devices=True,
        slice_s=settings.allocation_search_slice_s,
        budget_s=settings.allocation_search_budget_s,
        threads=settings.allocation_search_threads,
        share=settings.allocation_search_share,
    )
    if isinstance(placer, PlannerPlacer):
        search = placer.search
        metrics.attach_search_threads(lambda: search.busy, lambda: search.queued)
    claims = ClaimReconciler(
        model=model,
        placer=placer,
        api=api,
        settings=settings,
        metrics=metrics,
        compiler=keeper.compiler,
        queue=queue,
        events=events,
    )
    metrics.attach_model(model, claims.failing, claims.waiting)
    metrics.attach_scheduler_wait(claims.longest_wait)
    return events, claims


def _build_peering(
    *, api: KubeApi, settings: Settings, identity: str, metrics: Metrics
) -> tuple[Peering | None, Health]:
    """Which instance is active (none to ask when standalone), and the liveness that says so; the
    API client writes only while this instance is the active one."""
    peering = (
        None
        if settings.standalone
        else Peering(
            api=api,
            name=settings.peering_name,
            identity=identity,
            priority=settings.priority,
            times=PeeringTimes(
                renew_interval=settings.heartbeat_interval_s,
                renew_deadline=settings.peering_renew_deadline_s,
                lifetime=settings.peering_lifetime_s,
            ),
        )
    )
    health = Health(
        stale_after=settings.liveness_stale_after_s,
        identity=identity,
        active=(lambda: peering.active) if peering is not None else (lambda: True),
        heartbeat_enabled=peering is not None,
        writing=(lambda: not peering.missing) if peering is not None else (lambda: False),
    )
    api.may_write = lambda: health.active
    return peering, health


@contextlib.asynccontextmanager
async def _serving(parts: _Parts, settings: Settings) -> AsyncIterator[None]:
    """``/healthz`` and ``/metrics``, served until the way out."""
    try:
        http = await serve(
            app=make_app(health=parts.health, metrics=parts.metrics),
            host=settings.metrics_host,
            port=settings.metrics_port,
        )
    except OSError as exc:
        # asyncio's strerror repeats the address; the errno's own text does not.
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise StartupError(
            f"cannot serve /healthz and /metrics on {settings.metrics_host}:{settings.metrics_port}: {reason}"
        ) from exc
    try:
        yield
    finally:
        await http.cleanup()


def _start_tasks(
    parts: _Parts,
    settings: Settings,
    *,
    stop: asyncio.Event,
    kopf_ready: asyncio.Event,
    ready_flag: asyncio.Event | None,
) -> list[asyncio.Task[Any]]:
    """Our tasks beside Kopf's, created before Kopf starts (so Kopf's shutdown leaves them to us)."""
    claims, health, peering, events, model = (
        parts.claims,
        parts.health,
        parts.peering,
        parts.events,
        parts.model,
    )
    watch = ClaimWatch(api=parts.api, claims=claims, health=health, metrics=parts.metrics, settings=settings)
    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(watch.run(), name="claim watch"),
        asyncio.create_task(
            _worker(claims=claims, health=health, keeper=parts.keeper, peering=peering), name="claim worker"
        ),
        asyncio.create_task(
            _sweeper(claims=claims, orphans=parts.orphans, health=health, settings=settings), name="sweeper"
        ),
        asyncio.create_task(events.run(), name="events"),
        asyncio.create_task(
            _explainer(
                explainer=SchedulerClaimExplainer(claims=claims),
                extended=ExtendedResourceReporter(model=model, classes=claims.classes, events=events),
                tpu_slices=MixedSliceReporter(model=model, driver=settings.tpu_driver, events=events),
                health=health,
            ),
            name="pending claim explainer",
        ),
        asyncio.create_task(
            _take_signals(
                kopf_ready=kopf_ready,
                ready_flag=ready_flag,
                peering=peering,
                stop=stop,
                main=asyncio.current_task(),
            ),
            name="signals",
        ),
    ]
    if parts.domains is not None:
        tasks.append(asyncio.create_task(parts.domains.run(), name="compute domains"))
    if peering is not None:
        tasks += [
            asyncio.create_task(peering.run(), name="peering keep-alive"),
            asyncio.create_task(
                peering.watch(
                    server_timeout_s=int(settings.watch_server_timeout_s),
                    client_timeout_s=settings.watch_client_timeout_s,
                    connect_timeout_s=settings.watch_connect_timeout_s,
                    inactivity_timeout_s=settings.watch_inactivity_timeout_s,
                ),
                name="peering watch",
            ),
        ]
    return tasks


@contextlib.asynccontextmanager
async def _running(
    parts: _Parts,
    settings: Settings,
    *,
    stop: asyncio.Event,
    kopf_ready: asyncio.Event,
    ready_flag: asyncio.Event | None,
) -> AsyncIterator[None]:
    """Our tasks, running until the way out; then this instance's device reservations deleted,
    and the tasks cancelled and waited for."""
    tasks = _start_tasks(parts, settings, stop=stop, kopf_ready=kopf_ready, ready_flag=ready_flag)
    try:
        yield
    finally:
        # A reservation left behind would keep kube-scheduler off a node until the next active
        # instance's sweep: delete them while this one may still write.
        with contextlib.suppress(Exception):
            await parts.claims.reservations.stop(grace=2.0)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _run_kopf(
    parts: _Parts, settings: Settings, *, stop: asyncio.Event, kopf_ready: asyncio.Event
) -> None:
    """Kopf, embedded, until ``stop`` (or the forced stop after a signal); its watch log is
    counted meanwhile (:mod:`dra_operator.watch.kopfwatchlog`)."""

    def login(kopf_settings: kopf.OperatorSettings) -> kopf.ConnectionInfo | None:
        if settings.kubeconfig:
            return kubeconfig_login(settings.kubeconfig)
        return service_account_login(os.environ, trust_env=kopf_settings.networking.trust_env)

    registry = build_registry(
        OperatorParts(
            settings=settings,
            model=parts.model,
            claims=parts.claims,
            classes=parts.keeper,
            health=parts.health,
            metrics=parts.metrics,
            login=login,
            configure=lambda s: configure_kopf(s, settings),
            compute_domains=parts.domains,
        )
    )
    kopf_settings = kopf.OperatorSettings()
    configure_kopf(kopf_settings, settings)
    uninstall_watch_log = kopfwatchlog.install(
        metrics=parts.metrics, inactivity_timeout_s=settings.watch_inactivity_timeout_s
    )
    try:
        await kopf.operator(
            registry=registry,
            settings=kopf_settings,
            clusterwide=True,
            # Kopf's peering would pause its watches on the standby; dra_operator.watch.peering decides
            # which instance writes, and the standby's watches keep its model current.
            standalone=True,
            stop_flag=stop,
            ready_flag=kopf_ready,
        )
    except asyncio.CancelledError:
        if not stop.is_set():
            raise
        # The forced stop after a signal (see _take_signals): an orderly exit, not a crash.
    finally:
        uninstall_watch_log()


async def _allocation_gates(api_client: Any, settings: Settings) -> FeatureGates:
    """The gates kube-scheduler allocates with in this cluster, as far as the operator can know:
    the defaults of the release ``/version`` reports, then ``--feature-gates``. Said once."""
    try:
        FeatureGates.from_flag(settings.feature_gates)  # a misspelt gate stops before any wait
    except ValueError as exc:
        raise StartupError(f"--feature-gates: {exc}") from None
    try:
        git_version = await asyncio.wait_for(server_version(api_client), settings.request_timeout_s)
        release = FeatureGates.for_kubernetes(git_version)
    except Exception as exc:  # /version is public; without it, the newest release's defaults
        release = FeatureGates.for_kubernetes(_NEWEST)
        logger.warning("could not read the Kubernetes version (%s)", _one_line(exc))
    gates = FeatureGates.from_flag(settings.feature_gates, base=release.gates)
    off = [name for name, on in gates.to_mapping().items() if not on]
    (logger.info if release.known else logger.warning)(
        "allocating with the DRA feature gates of %s%s; off: %s",
        release.describe(),
        f", changed by --feature-gates {settings.feature_gates}" if settings.feature_gates else "",
        ", ".join(off) or "none",
    )
    return gates


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


async def _discover_taint_rules(api: KubeApi, settings: Settings) -> None:
    """Whether nodes can be reserved for claims that wait long for kube-scheduler; said once."""
    if settings.scheduler_reserve_after_s < 0:
        logger.info("node reservations are off (--scheduler-reserve-after-seconds is negative)")
        return
    try:
        version = await api.discover_taint_rules()
    except Exception as exc:  # reservations are an addition; the operator runs without them
        logger.warning("could not discover DeviceTaintRules (%s): claims only give way", exc)
        return
    if version is None:
        logger.info(
            "the API server serves no DeviceTaintRules (feature gate DRADeviceTaintRules, and "
            "resource.k8s.io/v1beta2 in 1.36): claims waiting for kube-scheduler only give way, "
            "and may wait for as long as pods ask for every device"
        )
    else:
        logger.info(
            "DeviceTaintRules served (resource.k8s.io/%s): a claim waiting %g s for kube-scheduler "
            "gets devices reserved",
            version,
            settings.scheduler_reserve_after_s,
        )


async def _take_signals(
    *,
    kopf_ready: asyncio.Event,
    ready_flag: asyncio.Event | None,
    peering: Peering | None,
    stop: asyncio.Event,
    main: asyncio.Task[Any] | None,
) -> None:
    """Once Kopf runs (it installs its own SIGTERM and SIGINT handlers as it starts), take the
    signals over: step down and leave the peering first, then let Kopf stop. A second signal
    stops at once. Kopf's own farewell retries for about a minute when the API server cannot be
    reached; the process is stopped STOP_GRACE_S after the signal regardless, well inside a pod's
    default 30 s termination grace period."""
    await kopf_ready.wait()
    if threading.current_thread() is threading.main_thread():
        loop = asyncio.get_running_loop()
        handing_over: list[asyncio.Task[None]] = []

        def force_stop() -> None:
            if main is not None and not main.done():
                logger.warning("Kopf did not stop within %g s of the signal; stopping now", STOP_GRACE_S)
                main.cancel()

        def on_signal(sig: signal.Signals) -> None:
            if handing_over or peering is None:
                stop.set()
                loop.call_later(STOP_GRACE_S, force_stop)
                return
            logger.info("%s received: handing over to the standby, then stopping", sig.name)
            task = asyncio.create_task(peering.farewell(), name="farewell")
            task.add_done_callback(lambda _: stop.set())
            handing_over.append(task)
            loop.call_later(STOP_GRACE_S, force_stop)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
    if ready_flag is not None:
        ready_flag.set()


async def _worker(
    *, claims: ClaimReconciler, health: Health, keeper: DeviceClassKeeper, peering: Peering | None
) -> None:
    """List the cluster into the model once, active or not (the watches keep it current from then
    on); allocate while active, taking over with the model as the standby kept it."""
    while not claims.synced.is_set():
        try:
            await claims.resync()
        except Exception as exc:
            _failed_will_retry("initial listing", exc, claims)
            await asyncio.sleep(2.0)
    was_active = stood_by = False
    while True:
        if not health.active:
            was_active = False
            stood_by = True
            if peering is not None:
                peering.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(peering.changed.wait(), timeout=1.0)
            else:
                await asyncio.sleep(1.0)
            continue
        if not was_active:
            was_active = True
            try:
                if stood_by:  # active right after the listing at start needs no catching up
                    await claims.take_over()
                await keeper.ensure_all()
                await claims.reservations.sweep()
            except Exception as exc:
                _failed_will_retry("taking over", exc, claims)
                was_active = False
                await asyncio.sleep(2.0)
                continue
        worker = asyncio.create_task(claims.run(active=lambda: health.active))
        while health.active and not worker.done():
            await asyncio.wait({worker}, timeout=0.5)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        if worker.done() and not worker.cancelled() and worker.exception() is not None:
            logger.error("claim worker died: %s; restarting", worker.exception())


def _failed_will_retry(what: str, exc: Exception, claims: ClaimReconciler) -> None:
    """Say that ``what`` failed and will be tried again: one line for an API error that may pass
    (the API server unreachable, 5xx), the traceback for anything else; counted either way."""
    if transient(exc):
        logger.warning("%s failed (%s); retrying", what, error_text(exc))
    else:
        logger.exception("%s failed; retrying", what)
    claims.metrics.reconcile_errors.labels("Resync").inc()


async def _sweeper(
    *, claims: ClaimReconciler, orphans: OrphanSliceCollector, health: Health, settings: Settings
) -> None:
    """Cleanup that no watch event announces in time: orphaned slices, stale reservations; and the
    periodic re-list of the model."""
    interval = max(1.0, min(settings.orphan_slice_grace_s, settings.stale_reservation_sweep_s) / 2)
    since_reservations = since_relist = 0.0
    while True:
        await asyncio.sleep(interval)
        if not claims.synced.is_set():
            continue
        # The standby's model is the one a takeover allocates from: it gets the periodic re-list too.
        since_relist += interval
        if settings.full_relist_interval_s > 0 and since_relist >= settings.full_relist_interval_s:
            since_relist = 0.0
            claims.request_relist()
        if not health.active:
            continue
        try:
            await orphans.sweep()
        except Exception:
            logger.exception("orphan slice sweep failed")
            claims.metrics.reconcile_errors.labels("ResourceSlice").inc()
        since_reservations += interval
        if since_reservations >= settings.stale_reservation_sweep_s:
            since_reservations = 0.0
            for key, claim in list(claims.model.claims.items()):
                if allocated_by_us(claim) and claim.status.reserved_for:
                    claims.mark(key)


async def _explainer(
    *,
    explainer: SchedulerClaimExplainer,
    extended: ExtendedResourceReporter,
    tpu_slices: MixedSliceReporter,
    health: Health,
) -> None:
    """Explain the claims kube-scheduler leaves pending, say which claim serves each pod's
    extended resources and which TPU Jobs span two slices, on the active instance only (a
    standby's model may lag, and two instances would post every Event twice). A pass every few
    seconds: a claim is looked at again only after the explanation interval, so a pass costs a scan
    of the pending claims and of the pods."""
    claims = explainer.claims
    tick = min(5.0, max(0.5, explainer.after / 2)) if explainer.enabled else 2.0
    while True:
        await asyncio.sleep(tick)
        if not health.active or not claims.synced.is_set():
            continue
        now = time.time()
        try:
            if explainer.enabled:
                await explainer.sweep(now=now)
            extended.sweep(now=now)
            tpu_slices.sweep()
        except Exception:
            logger.exception("explaining pending claims failed")
            claims.metrics.reconcile_errors.labels("ResourceClaim").inc()
