"""The health monitor of one driver: probes in, taints, health reports, metrics and Events out.

``HealthMonitor`` runs a probe (NVML or TPU presence) off the event loop: the probe's event thread
hands observations over with ``call_soon_threadsafe`` and polls run in ``asyncio.to_thread``. Each
device has a ``DeviceHealthState``; a change of any device's state or problems

- sets ``changed`` (and calls ``on_change``) so the agent republishes its slices with
  ``decorate(devices)``: taints on unhealthy devices, or those devices left out where the server has
  no device taints;
- wakes the kubelet health streams (``health_source()``), which also repeat the report every
  ``heartbeat_interval`` so kubelet never marks devices Unknown for staleness;
- updates the metrics, and writes a Warning Event on the Node (Normal when a device recovers);
- calls the change listeners with the devices that changed (the device status writer).

Time comes from ``clock`` (Unix seconds), so tests drive recovery without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dra_api.aiotasks import BackgroundTasks
from dra_api.kube import ApiClient
from dra_api.kubeletapi.model import DeviceHealth, HealthStatus
from dra_node_agent.devices import DiscoveredDevice
from dra_node_agent.health import metrics
from dra_node_agent.health.events import NodeEvents
from dra_node_agent.health.probe import HealthProbe, PollResult, XidReport
from dra_node_agent.health.state import DEFAULT_HISTORY, DeviceHealthState, Observation, ProblemKind, State
from dra_node_agent.health.taints import TaintEffect, decorate_devices, render_taints

logger = logging.getLogger(__name__)

# At stop, Events still being posted get this many seconds before they are cancelled.
EVENT_POST_GRACE: Final = 5.0

_KUBELET_HEALTH: Mapping[State, HealthStatus] = {
    State.HEALTHY: HealthStatus.HEALTHY,
    State.UNHEALTHY: HealthStatus.UNHEALTHY,
    State.UNKNOWN: HealthStatus.UNKNOWN,
}


@dataclass(frozen=True)
class HealthSettings:
    """How the monitor behaves; the agent fills it from its own settings."""

    # Seconds between polls of every device (ECC, row remap, temperature, presence).
    poll_interval: float = 10.0
    # Seconds a problem must stay unseen before its taint goes and the device counts as healthy.
    recovery_period: float = 300.0
    # Effect of the taints: NoSchedule keeps new claims away, NoExecute also evicts running pods.
    taint_effect: TaintEffect = TaintEffect.NO_SCHEDULE
    # Seconds between repeated health reports on an otherwise quiet kubelet stream (kubelet: 30 s).
    heartbeat_interval: float = 10.0
    # Per-device staleness timeout sent to kubelet (seconds); None keeps kubelet's default.
    health_check_timeout: int | None = None
    # Transitions kept per device.
    history_size: int = DEFAULT_HISTORY
    # Whether to write Events on the Node (needs an API client).
    node_events: bool = True


def _model(device: DiscoveredDevice) -> str:
    for key in ("productName", "accelerator", "tpuGen", "profile"):
        attr = device.attributes.get(key)
        if attr is not None:
            return str(attr.value)
    return device.kind


class HealthMonitor:
    """Watches one driver's devices. ``start``/``stop`` from the agent; everything else is cheap."""

    def __init__(
        self,
        *,
        driver: str,
        node_name: str,
        probe: HealthProbe,
        devices: Sequence[DiscoveredDevice],
        settings: HealthSettings | None = None,
        api: ApiClient | None = None,
        clock: Callable[[], float] = time.time,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.driver = driver
        self.node_name = node_name
        self.probe = probe
        self.settings = settings or HealthSettings()
        self._clock = clock
        self._on_change = on_change
        self._listeners: list[Callable[[Sequence[str]], None]] = []
        self._events = NodeEvents(api=api, node_name=node_name) if api and self.settings.node_events else None
        self._devices: tuple[DiscoveredDevice, ...] = ()
        self._states: dict[str, DeviceHealthState] = {}
        self._announced: dict[str, tuple[State, frozenset[tuple[ProblemKind, str]]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._event_posts = BackgroundTasks()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._check_lock = asyncio.Lock()  # one poll at a time: the probe keeps per-GPU counters
        self._report_changed = asyncio.Event()
        self.changed = asyncio.Event()
        # False where the API server drops device taints (DRADeviceTaints off): devices leave instead.
        self.taints_supported = True
        self.version = 0
        self.set_devices(devices)

    # --- devices -----------------------------------------------------------------------------------
    def set_devices(self, devices: Sequence[DiscoveredDevice]) -> None:
        """Follow a new inventory: new devices start unknown, gone ones lose their state and series."""
        names = {d.name for d in devices}
        for gone in [n for n in self._states if n not in names]:
            del self._states[gone]
            self._announced.pop(gone, None)
            metrics.forget_device(driver=self.driver, device=gone)
        for device in devices:
            if device.name not in self._states:
                self._states[device.name] = DeviceHealthState(
                    device=device.name,
                    recovery_period=self.settings.recovery_period,
                    history_size=self.settings.history_size,
                )
            metrics.DEVICE_INFO.labels(
                driver=self.driver,
                node=self.node_name,
                device=device.name,
                uuid=device.uuid,
                model=_model(device),
            ).set(1)
        self._devices = tuple(devices)
        set_probe_devices = getattr(self.probe, "set_devices", None)
        if set_probe_devices is not None:
            set_probe_devices(self._devices)
        self._export(list(self._states))

    def states(self) -> Mapping[str, DeviceHealthState]:
        return dict(self._states)

    def add_change_listener(self, listener: Callable[[Sequence[str]], None]) -> None:
        """Call ``listener`` on the event loop with the names of the devices whose state or problems
        changed, after each change; it must return at once."""
        self._listeners.append(listener)

    def taints_for(self, device: str) -> list[dict[str, str]]:
        state = self._states.get(device)
        if state is None or state.state is not State.UNHEALTHY:
            return []
        return render_taints(driver=self.driver, problems=state.active(), effect=self.settings.taint_effect)

    def taints(self) -> dict[str, list[dict[str, str]]]:
        return {name: found for name in self._states if (found := self.taints_for(name))}

    def decorate(self, devices: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Slice devices as they should be published now (taints added, or tainted devices left out)."""
        return decorate_devices(devices, taints=self.taints(), taints_supported=self.taints_supported)

    def report(self) -> list[DeviceHealth]:
        """The complete device list for kubelet's health stream."""
        now = int(self._clock())
        return [
            DeviceHealth(
                pool=self.node_name,
                device=name,
                health=_KUBELET_HEALTH[state.state],
                last_updated=now,
                health_check_timeout=self.settings.health_check_timeout,
                message=state.message()[:1024],
            )
            for name, state in sorted(self._states.items())
        ]

    def health_source(self) -> MonitorHealthSource:
        return MonitorHealthSource(self)

    # --- running -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the probe's event watch and the poll loop (a probe that fails leaves devices unknown)."""
        self._loop = asyncio.get_running_loop()
        try:
            await asyncio.to_thread(
                self.probe.start, devices=self._devices, emit=self._emit_threadsafe, xid=self._xid_threadsafe
            )
            metrics.MONITOR_UP.labels(driver=self.driver, backend=self.probe.backend).set(1)
        except Exception as exc:  # NVML missing or broken: keep serving, report health as unknown
            logger.error(
                "health monitor of driver %s cannot start its %s probe: %s",
                self.driver,
                self.probe.backend,
                exc,
            )
            metrics.MONITOR_UP.labels(driver=self.driver, backend=self.probe.backend).set(0)
        self._task = asyncio.create_task(self._run(), name=f"health-{self.driver}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await asyncio.to_thread(self.probe.stop)
        # A stopped monitor's series would say "healthy" for devices nobody watches any more.
        for name in self._states:
            metrics.forget_device(driver=self.driver, device=name)
        metrics.TELEMETRY.forget(driver=self.driver)
        metrics.MONITOR_UP.remove_by_labels({"driver": self.driver})
        await self._event_posts.drain(grace=EVENT_POST_GRACE)

    async def _run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:  # a probe bug must not end health monitoring
                logger.exception("health check of driver %s failed", self.driver)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.settings.poll_interval)
            self._wake.clear()

    async def check(self) -> None:
        """One pass: poll every device, then let quiet problems expire."""
        async with self._check_lock:
            await self._check()

    async def _check(self) -> None:
        devices = self._devices
        now = self._clock()
        try:
            result = await asyncio.to_thread(self.probe.poll, devices=devices, now=now)
        except Exception as exc:
            logger.warning("health poll of driver %s failed: %s", self.driver, exc)
            result = PollResult(unknown={d.name: f"health check failed: {exc}" for d in devices})
        else:
            metrics.LAST_CHECK.labels(driver=self.driver).set(now)
        metrics.TELEMETRY.update(driver=self.driver, readings=result.telemetry)
        changed: list[str] = []
        for observation in result.observations:
            if self._apply(observation):
                changed.append(observation.device)
        for name, reason in result.unknown.items():
            state = self._states.get(name)
            if state is not None and state.mark_unknown(now=now, reason=reason):
                changed.append(name)
        now = self._clock()
        for name, state in self._states.items():
            if state.expire(now=now):
                changed.append(name)
        self._changed(changed)

    def observe(self, observation: Observation) -> None:
        """Apply one observation now (on the event loop)."""
        self._changed([observation.device] if self._apply(observation) else [])

    def _apply(self, observation: Observation) -> bool:
        """Returns whether the device's state or its set of problems changed."""
        state = self._states.get(observation.device)
        if state is None:
            return False
        before = set(state.problems)
        moved = state.observe(observation)
        added = set(state.problems) - before
        for kind, _ in added:
            metrics.HEALTH_EVENTS.labels(driver=self.driver, device=observation.device, type=kind.value).inc()
        return moved or bool(added)

    def _emit_threadsafe(self, observation: Observation) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.observe, observation)

    def _xid_threadsafe(self, report: XidReport) -> None:
        # prometheus_client is thread-safe: count at once, in the probe's thread.
        metrics.XID_ERRORS.labels(
            driver=self.driver, device=report.device, xid=str(report.xid), fatal=str(report.fatal).lower()
        ).inc()

    # --- consequences ------------------------------------------------------------------------------
    def _changed(self, devices: list[str]) -> None:
        if not devices:
            return
        unique = list(dict.fromkeys(devices))
        self._export(unique)
        for name in unique:
            self._announce(name)
        self.version += 1
        self._report_changed.set()
        self._report_changed = asyncio.Event()
        self.changed.set()
        if self._on_change is not None:
            self._on_change()
        for listener in self._listeners:
            try:
                listener(unique)
            except Exception:  # a listener's bug must not stop health monitoring
                logger.exception("health change listener of driver %s failed", self.driver)

    def _export(self, devices: list[str]) -> None:
        for name in devices:
            state = self._states.get(name)
            if state is None:
                continue
            metrics.DEVICE_HEALTHY.labels(driver=self.driver, device=name).set(
                1 if state.state is State.HEALTHY else 0
            )
            for option in State:
                metrics.DEVICE_HEALTH_STATE.labels(driver=self.driver, device=name, state=option.value).set(
                    1 if state.state is option else 0
                )
            metrics.DEVICE_TAINT_INFO.remove_by_labels({"driver": self.driver, "device": name})
            for taint in self.taints_for(name):
                metrics.DEVICE_TAINT_INFO.labels(
                    driver=self.driver,
                    device=name,
                    key=taint["key"],
                    value=taint.get("value", ""),
                    effect=taint["effect"],
                ).set(1)

    def _announce(self, name: str) -> None:
        """Count transitions and write Events: into unhealthy, new problems, and recovery."""
        state = self._states[name]
        problems = frozenset(state.problems)
        old_state, old_problems = self._announced.get(name, (State.UNKNOWN, frozenset()))
        self._announced[name] = (state.state, problems)
        if state.state is not old_state:
            metrics.HEALTH_TRANSITIONS.labels(driver=self.driver, device=name, state=state.state.value).inc()
        if state.state is State.UNHEALTHY and (old_state is not State.UNHEALTHY or problems - old_problems):
            logger.warning("device %s of driver %s is unhealthy: %s", name, self.driver, state.message())
            self._event(type="Warning", reason="DeviceUnhealthy", message=self._describe(name))
        elif old_state is State.UNHEALTHY and state.state is not State.UNHEALTHY:
            logger.info("device %s of driver %s recovered", name, self.driver)
            self._event(
                type="Normal",
                reason="DeviceRecovered",
                message=f"Device {self.driver}/{name} is healthy again; its taints are removed",
            )

    def _describe(self, name: str) -> str:
        state = self._states[name]
        taints = ", ".join(f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in self.taints_for(name))
        consequence = f"tainted {taints}" if self.taints_supported else "left out of the ResourceSlice"
        return f"Device {self.driver}/{name} is unhealthy ({state.message()}); {consequence}"

    def _event(self, *, type: str, reason: str, message: str) -> None:
        if self._events is None:
            return
        self._event_posts.spawn(self._events.record(type=type, reason=reason, message=message))

    async def wait_change(self, *, timeout: float) -> None:  # noqa: ASYNC109 - a bounded wait is the point
        """Return after the next change of any device, or after ``timeout`` seconds."""
        event = self._report_changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=timeout)


class MonitorHealthSource:
    """A ``HealthSource`` for the plugin server: the full report at once, on every change and heartbeat."""

    def __init__(self, monitor: HealthMonitor) -> None:
        self._monitor = monitor

    async def watch(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        while True:
            # Take the wake-up event before yielding, so a change while the consumer is busy is not lost.
            event = self._monitor._report_changed
            yield self._monitor.report()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=self._monitor.settings.heartbeat_interval)


async def republish_on_change(
    monitor: HealthMonitor,
    *,
    devices: Callable[[], Sequence[Mapping[str, Any]]],
    publish: Callable[[list[dict[str, Any]]], Awaitable[Any]],
    retry: Callable[[], None] | None = None,
) -> None:
    """Run forever: after each health change, publish ``monitor.decorate(devices())``.

    ``publish`` is the publisher's ``publish`` coroutine function; after a failed publication
    ``retry`` (the publisher's ``mark_dirty``) hands it to the publisher's own retry loop, which
    keeps the last devices it was given.
    """
    while True:
        await monitor.changed.wait()
        monitor.changed.clear()
        try:
            await publish(monitor.decorate(devices()))
        except Exception as exc:
            logger.warning("republishing after a health change of driver %s failed: %s", monitor.driver, exc)
            if retry is not None:
                retry()
