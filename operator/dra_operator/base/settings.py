"""The operator's settings: one dataclass, filled from flags and ``DRA_OPERATOR_*`` environment variables.

Precedence: a flag given on the command line wins over the environment, which wins over the default.
Every field's docstring is the flag's help text.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import itertools
import logging
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_api import computedomains as cd
from dra_api.names import GPU_CLASS, GPU_DRIVER, MIG_CLASS, TPU_CLASS, TPU_DRIVER
from dra_api.oneline import OneLineParser

ENV_PREFIX = "DRA_OPERATOR_"


class Ownership(enum.StrEnum):
    """Which ResourceClaims the operator allocates."""

    STANDALONE = "standalone"
    ALL = "all"
    NONE = "none"


PLACEMENT_POLICIES = ("first-fit", "bin-pack", "spread")
SEARCH_BUDGET_S = 5.0
"""The default of --allocation-search-budget-seconds, and of the same budget in ``simulate`` and
``kubectl dra explain``."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``dra-operator run`` can be told; see each field's docstring."""

    kubeconfig: str | None = None
    """Kubeconfig file to use; unset means the in-cluster ServiceAccount."""

    ownership: Ownership = Ownership.STANDALONE
    """Which claims the operator allocates: 'standalone' (claims of its classes that no Pod owns;
    the scheduler keeps template claims), 'all' (every claim of its classes) or 'none'."""

    gpu_class: str = GPU_CLASS
    """Name of the DeviceClass for whole NVIDIA GPUs."""

    tpu_class: str = TPU_CLASS
    """Name of the DeviceClass for Google TPUs."""

    mig_class: str = MIG_CLASS
    """Name of the DeviceClass for MIG partitions (only managed when mig_enabled)."""

    gpu_driver: str = GPU_DRIVER
    """Driver name the GPU node agents publish their ResourceSlices under."""

    tpu_driver: str = TPU_DRIVER
    """Driver name the TPU node agents publish their ResourceSlices under."""

    mig_enabled: bool = False
    """Whether to create and keep the MIG DeviceClass."""

    gpu_extended_resource_name: str = "nvidia.com/gpu"
    """Extended resource the GPU class serves (DeviceClass.spec.extendedResourceName, Kubernetes
    1.34+ with DRAExtendedResource), so device-plugin style pods (``limits: nvidia.com/gpu: 1``) get
    GPUs through DRA; empty leaves it out. Left out too when the API server does not know the field."""

    tpu_extended_resource_name: str = "google.com/tpu"
    """Extended resource the TPU class serves (as for the GPU class); empty leaves it out."""

    manage_device_classes: bool = True
    """Whether to create the driver's DeviceClasses and repair them when they drift."""

    peering_name: str = "accel-dra-operator"
    """Name of the ClusterKopfPeering object that keeps a second instance paused."""

    standalone: bool = False
    """Run without peering (no second-instance protection); for development only."""

    priority: int = field(default_factory=lambda: random.randint(1, 1_000_000))
    """Peering priority; the live instance with the highest priority is the active one. Random by
    default, so two instances never tie (Kopf pauses both instances on a tie)."""

    peering_lifetime_s: int = 12
    """How long a peer's keep-alive counts (L): a standby takes over at most this long after the
    active instance died. Must exceed the renew deadline by the clock difference between the
    operator's nodes plus the API server's watch delay."""

    peering_renew_deadline_s: float = 8.0
    """The active instance stops writing when its keep-alive could not be renewed for this long
    (D; a slow or unreachable API server), before a standby may take over at the lifetime."""

    identity: str | None = None
    """Peering identity; defaults to $POD_ID, or host, pid and a random suffix."""

    metrics_host: str = "0.0.0.0"
    """Address the /metrics and /healthz server binds to."""

    metrics_port: int = 8080
    """Port of the /metrics and /healthz server."""

    heartbeat_interval_s: float = 2.0
    """How often (R) the operator renews its keep-alive in the peering object; the same write is
    the heartbeat its watch must bring back (liveness). Must be below the renew deadline."""

    liveness_stale_after_s: float = 90.0
    """/healthz fails when the active operator has seen no heartbeat on its watch for this long."""

    watch_server_timeout_s: float = 300.0
    """Server-side timeout of each watch request (timeoutSeconds): the API server ends the stream
    after it and the operator resumes from the last resourceVersion. 5 min, as client-go's
    reflectors, so every watch is a fresh request at least that often even through a proxy or load
    balancer that keeps a dead one open, at the cost of one request per watch per 5 min."""

    watch_client_timeout_s: float = 330.0
    """Client-side total deadline of each watch request: a stream the server failed to end after its
    timeout is dropped anyway. Must exceed the server timeout; the 30 s over it is slack for a busy
    server."""

    watch_inactivity_timeout_s: float = 70.0
    """A watch that brings nothing for this long, not even a bookmark, is taken as silently stalled
    (a half-open connection, a network path or proxy that stopped forwarding): it is dropped, logged
    and counted (dra_operator_watch_restarts_total), and resumes from the last resourceVersion it
    saw (a fresh listing if that is too old). The API server sends watches that ask for bookmarks
    (all of the operator's do) one about every minute, so 70 s never drops a quiet healthy watch;
    much lower values only add reconnects on idle watches. Applies to Kopf's watches too."""

    watch_connect_timeout_s: float = 30.0
    """Timeout for establishing a watch connection; a watch that could not connect is retried."""

    request_timeout_s: float = 60.0
    """Timeout of any other API request."""

    placement_policy: str = "first-fit"
    """How the operator picks a node for a claim: 'first-fit' (stable node order), 'bin-pack' (the
    node with the fewest free matching devices that still fits) or 'spread' (the most free)."""

    allocation_search_budget_s: float = SEARCH_BUDGET_S
    """CPU seconds one claim's placement may use per attempt, across every node: CEL selectors, the
    feasibility check and the search for devices together (upstream has 10 s per node and no
    limit across nodes). A claim that uses it up is told so, with what the search found, and is
    tried again after --allocation-search-backoff-seconds, doubling up to
    --allocation-search-backoff-max-seconds; other claims are not held up meanwhile."""

    allocation_search_slice_s: float = 0.05
    """How long a placement may run on the operator's event loop, in the loop thread's CPU time.
    Nearly every claim is placed within it; one that is not is searched again in a worker thread
    (with the whole budget), so watches, /healthz and other claims never wait on a long search for
    more than this."""

    allocation_search_threads: int = 2
    """Worker threads for the searches that outgrow their slice of the event loop. One search per
    namespace runs at a time and namespaces take turns, so one tenant's hard claims cannot keep
    another's waiting; the threads share the interpreter with the event loop (Python's GIL)."""

    allocation_search_share: float = 0.5
    """The most of the interpreter (Python's GIL) the worker threads' searches take together while
    they run, in (0, 1]: one searches at a time, in turns of 5 ms of its CPU time, each followed by
    a rest that leaves the event loop the rest of the interpreter. Lower keeps other claims faster
    while hard searches run; higher answers hard claims sooner."""

    allocation_search_backoff_s: float = 30.0
    """How long a claim whose search used its whole budget waits before it is searched again; the
    wait doubles with each such attempt, up to --allocation-search-backoff-max-seconds. Changes in
    the cluster do not bring it back sooner: a claim too hard to place would otherwise be searched
    again on every change."""

    allocation_search_backoff_max_s: float = 600.0
    """The longest wait between two searches of a claim that keeps using its whole budget."""

    scheduler_headroom: int = 2
    """While pods wait for kube-scheduler, the operator allocates a device only where the free devices
    ahead of it in its slice (kube-scheduler takes devices from the front, the operator from the
    back) exceed what those pods could take on its node by at least this many: a margin for pods,
    claims and allocations that one of the two allocators has not seen yet. Two allocators writing
    different claims cannot be serialised by the API server; this keeps them apart instead. A claim
    that finds no such device waits, says so (WaitingForScheduler) and is placed again as soon as
    those pods, their claims or the devices change."""

    scheduler_reserve_after_s: float = 2.0
    """A claim that has given way to kube-scheduler this long (counted from its creation) while
    pods keep taking every device it could use gets devices reserved for it on one node: a
    DeviceTaintRule (NoSchedule) per device keeps kube-scheduler from giving them to another pod
    (the pods using them keep them), and the claim takes them once they are free. Needs
    DeviceTaintRules (feature gate DRADeviceTaintRules; served as resource.k8s.io/v1beta2 in 1.36)
    and RBAC to create and delete them; without them claims only give way. At most one node in
    four holds a reservation at a time. Negative: never reserve."""

    scheduler_pending_explain_after_s: float = 30.0
    """How long a claim of the operator's classes that kube-scheduler owns (the operator does not
    allocate it) may stay unallocated, while its pod waits unscheduled, before the operator posts a
    Warning NotAllocatableYet Event on it saying why its allocator could not place the claim
    either. Only an Event: such claims are never written to. 0 turns these Events off."""

    scheduler_pending_explain_interval_s: float = 300.0
    """How often, at most, the operator works out and posts that explanation again for one claim;
    an unchanged explanation is posted again only after 30 minutes (or this interval, if longer)."""

    feature_gates: str = ""
    """DRA feature gates this cluster sets differently from its release's defaults, as on
    kube-scheduler: ``DRAPartitionableDevices=true,...``. The operator allocates with the defaults of
    the release the API server reports (``/version``) and these on top, so that it places claims as
    kube-scheduler would. Gates that do not change allocation are ignored; a misspelt DRA gate stops
    the operator at start-up."""

    max_concurrent_writes: int = 8
    """How many claims the operator writes to the API server at once (finalizer, then
    status.allocation). Placement stays one claim at a time in memory, and each placed claim's
    devices are held in the model until its writes end, so claims written together never share a
    device; more in flight hides API round trips, fewer spares a slow API server."""

    verify_placer_index: bool = False
    """After every event, compare the placer's free-device index with the cluster model; on a
    difference, log an error naming it, count it in dra_operator_placer_index_repairs_total and
    rebuild the index. Costs O(devices in use) per event: for tests and for chasing a suspected
    bug, not for production."""

    orphan_slice_grace_s: float = 30.0
    """How long a ResourceSlice of a deleted node may stay before the operator deletes it."""

    stale_reservation_sweep_s: float = 60.0
    """How often reservedFor entries of vanished pods are looked for on the claims it allocated."""

    full_relist_interval_s: float = 600.0
    """How often the model is listed again from scratch, as a safety net beside the re-list after a
    watch gap (0: never). It is what catches a deletion during a gap in a watch whose re-list
    returned no objects at all."""

    compute_domains: bool = False
    """Run the ComputeDomain controller: NVIDIA's ComputeDomain API (resource.nvidia.com/v1beta1,
    the crds/ of this project) served as NVIDIA's compute-domain controller serves it, with its
    two DeviceClasses kept in place (compute-domain-default-channel.nvidia.com,
    compute-domain-daemon.nvidia.com)."""

    compute_domain_namespace: str = ""
    """Namespace of the ComputeDomains' IMEX daemons (their DaemonSets, claim templates and
    cliques); the node agents must be told the same. Empty: $POD_NAMESPACE, else accel-dra."""

    compute_domain_daemon_image: str = ""
    """Image of the IMEX daemon pods (the product's image, which holds compute-domain-daemon).
    Empty: accel-dra:<this operator's version>."""

    compute_domain_daemon_image_pull_policy: str = "IfNotPresent"
    """imagePullPolicy of the IMEX daemon pods (Always, IfNotPresent or Never)."""

    compute_domain_daemon_overrides: str = ""
    """YAML file of what this cluster adds to the IMEX daemon pods: hostAliases, env,
    imagePullSecrets, priorityClassName, resources (nothing else is accepted)."""

    compute_domain_imex_mode: str = "driverManaged"
    """Who runs IMEX: driverManaged (one daemon pod per node of a domain, as NVIDIA's default) or
    hostManaged (the hosts run nvidia-imex themselves: no daemons, channels in Single mode only;
    NVIDIA's HostManagedIMEXDaemon). The node agents must be told the same."""

    max_nodes_per_imex_domain: int = cd.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN
    """Most IMEX daemons in one clique of a domain (an NVL72 rack has 18 compute trays)."""

    max_compute_domains_per_namespace: int = 32
    """Most ComputeDomains the controller serves in one namespace (the oldest first); the others
    get a Warning Event and wait, so one tenant cannot fill the driver's namespace with DaemonSets."""

    compute_domain_resync_s: float = 60.0
    """How often every ComputeDomain is reconciled even without an event, and node labels of
    deleted domains are swept."""

    log_level: str = "INFO"
    """Python log level (DEBUG, INFO, WARNING, ERROR)."""

    @property
    def drivers(self) -> tuple[str, ...]:
        """The drivers whose devices this operator's classes select."""
        return (self.gpu_driver, self.tpu_driver)

    def managed_class_names(self) -> tuple[str, ...]:
        names = [self.gpu_class, self.tpu_class]
        if self.mig_enabled:
            names.append(self.mig_class)
        return tuple(names)

    def daemon_namespace(self) -> str:
        """Where the IMEX daemons of ComputeDomains live."""
        return self.compute_domain_namespace or os.environ.get("POD_NAMESPACE") or "accel-dra"

    def daemon_image(self) -> str:
        """The IMEX daemon pods' image."""
        if self.compute_domain_daemon_image:
            return self.compute_domain_daemon_image
        try:
            from importlib.metadata import version

            return f"accel-dra:{version('accel-dra')}"
        except Exception:  # not installed as a distribution (a source tree on sys.path)
            return "accel-dra:latest"

    def resolved_identity(self) -> str:
        if self.identity:
            return self.identity
        pod = os.environ.get("POD_ID")
        if pod:
            return pod
        return f"{os.uname().nodename}-{os.getpid()}-{random.randint(0, 0xFFFF):04x}"


def add_search_budget_argument(parser: argparse.ArgumentParser) -> None:
    """--search-budget-seconds of ``simulate`` and ``kubectl dra explain``: the operator's budget by
    default, so that they answer as the operator does, in the time it takes."""
    parser.add_argument(
        "--search-budget-seconds",
        dest="budget_s",
        type=_positive_seconds,
        default=SEARCH_BUDGET_S,
        metavar="SECONDS",
        help=f"CPU seconds the placement may use, across every node (default {SEARCH_BUDGET_S:g}, as the "
        "operator's --allocation-search-budget-seconds)",
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (true/false), got {text!r}")


def _converter(f: dataclasses.Field[Any]) -> Any:
    kind = str(f.type)
    if "Ownership" in kind:
        return Ownership
    if "bool" in kind:
        return _parse_bool
    if "int" in kind and "str" not in kind:
        return int
    if "float" in kind:
        return float
    return str


def _flag(name: str) -> str:
    return "--" + name.removesuffix("_s").replace("_", "-") + ("-seconds" if name.endswith("_s") else "")


# The global hold after kube-scheduler activity that --scheduler-headroom replaced; its flag is
# still accepted so that manifests which set it keep starting.
_DEPRECATED_GRACE = "deprecated_scheduler_grace_s"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field; defaults stay None so the environment and dataclass defaults can apply."""
    for f in dataclasses.fields(Settings):
        help_text = " ".join(_FIELD_DOCS.get(f.name, "").split())
        env = ENV_PREFIX + f.name.upper().removesuffix("_S")
        # --peering is what Kopf calls it (and what the Deployment passes).
        aliases = ["--peering"] if f.name == "peering_name" else []
        parser.add_argument(
            _flag(f.name),
            *aliases,
            dest=f.name,
            type=_converter(f),
            default=None,
            help=f"{help_text} (env {env})",
        )
    parser.add_argument(
        "--scheduler-grace-seconds",
        dest=_DEPRECATED_GRACE,
        type=float,
        default=None,
        help="Deprecated, no effect: the operator now gives way to kube-scheduler per device "
        "(see --scheduler-headroom). (env DRA_OPERATOR_SCHEDULER_GRACE)",
    )


def from_sources(*, args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from parsed flags over ``DRA_OPERATOR_*`` environment variables over the defaults."""
    environ = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        given = getattr(args, f.name, None) if args is not None else None
        if given is not None:
            values[f.name] = given
            continue
        env_name = ENV_PREFIX + f.name.upper().removesuffix("_S")
        raw = environ.get(env_name)
        if raw is not None and raw != "":
            try:
                values[f.name] = _converter(f)(raw)
            except ValueError as exc:
                raise ValueError(f"environment variable {env_name}: {exc}") from exc
    if getattr(args, _DEPRECATED_GRACE, None) is not None or environ.get("DRA_OPERATOR_SCHEDULER_GRACE"):
        logging.getLogger(__name__).warning(
            "--scheduler-grace-seconds (DRA_OPERATOR_SCHEDULER_GRACE) is deprecated and has no effect: "
            "the operator gives way to kube-scheduler per device (--scheduler-headroom)"
        )
    if "kubeconfig" not in values and environ.get("KUBECONFIG"):
        values["kubeconfig"] = environ["KUBECONFIG"]
    policy = values.get("placement_policy", "first-fit")
    if policy not in PLACEMENT_POLICIES:
        raise ValueError(f"placement_policy: {policy!r} is not one of {', '.join(PLACEMENT_POLICIES)}")
    _check_peering_times(values)
    _check_watch_times(values)
    if values.get("scheduler_headroom", 0) < 0:
        raise ValueError(f"scheduler_headroom: must not be negative, got {values['scheduler_headroom']}")
    if values.get("max_concurrent_writes", 1) < 1:
        raise ValueError(f"max_concurrent_writes: must be at least 1, got {values['max_concurrent_writes']}")
    _check_ranges(values)
    _check_search(values)
    _check_compute_domains(values)
    return Settings(**values)


IMEX_MODES = ("driverManaged", "hostManaged")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


def _check_compute_domains(values: Mapping[str, Any]) -> None:
    mode = values.get("compute_domain_imex_mode", "driverManaged")
    if mode not in IMEX_MODES:
        raise ValueError(f"compute_domain_imex_mode: {mode!r} is not one of {', '.join(IMEX_MODES)}")
    policy = values.get("compute_domain_daemon_image_pull_policy", "IfNotPresent")
    if policy not in PULL_POLICIES:
        raise ValueError(
            f"compute_domain_daemon_image_pull_policy: {policy!r} is not one of {', '.join(PULL_POLICIES)}"
        )
    for name in ("max_nodes_per_imex_domain", "max_compute_domains_per_namespace"):
        if values.get(name, 1) < 1:
            raise ValueError(f"{name}: must be at least 1, got {values[name]}")
    if values.get("compute_domain_resync_s", 1.0) <= 0:
        raise ValueError(
            f"compute_domain_resync: must be positive, got {values['compute_domain_resync_s']:g} s"
        )


def _check_search(values: Mapping[str, Any]) -> None:
    defaults = Settings()
    budget = values.get("allocation_search_budget_s", defaults.allocation_search_budget_s)
    piece = values.get("allocation_search_slice_s", defaults.allocation_search_slice_s)
    threads = values.get("allocation_search_threads", defaults.allocation_search_threads)
    backoff = values.get("allocation_search_backoff_s", defaults.allocation_search_backoff_s)
    most = values.get("allocation_search_backoff_max_s", defaults.allocation_search_backoff_max_s)
    if not 0 < piece <= budget:
        raise ValueError(
            "allocation search: need 0 < allocation_search_slice <= allocation_search_budget, got "
            f"{piece:g} s and {budget:g} s"
        )
    if threads < 1:
        raise ValueError(f"allocation_search_threads: must be at least 1, got {threads}")
    share = values.get("allocation_search_share", defaults.allocation_search_share)
    if not 0 < share <= 1:
        raise ValueError(f"allocation_search_share: must be in (0, 1], got {share:g}")
    if not 0 < backoff <= most:
        raise ValueError(
            "allocation search: need 0 < allocation_search_backoff <= allocation_search_backoff_max, got "
            f"{backoff:g} s and {most:g} s"
        )


def _check_ranges(values: Mapping[str, Any]) -> None:
    """What would otherwise fail only once the operator is running (the port at its bind, the
    timeout at the first request) or be ignored (an unknown log level reads as INFO)."""
    port = values.get("metrics_port", 0)
    if not 0 <= port <= 65535:
        raise ValueError(f"metrics_port: {port} is not a port number (0-65535)")
    timeout = values.get("request_timeout_s", 1.0)
    if timeout <= 0:
        raise ValueError(f"request_timeout: must be positive, got {timeout:g} s")
    level = values.get("log_level", "INFO")
    if not isinstance(logging.getLevelName(level.upper()), int):
        raise ValueError(f"log_level: {level!r} is not one of DEBUG, INFO, WARNING, ERROR")


def _check_peering_times(values: Mapping[str, Any]) -> None:
    defaults = Settings()
    interval = values.get("heartbeat_interval_s", defaults.heartbeat_interval_s)
    deadline = values.get("peering_renew_deadline_s", defaults.peering_renew_deadline_s)
    lifetime = values.get("peering_lifetime_s", defaults.peering_lifetime_s)
    if not 0 < interval < deadline < lifetime:
        raise ValueError(
            "peering timing: need heartbeat_interval < peering_renew_deadline < peering_lifetime, got "
            f"{interval:g} s, {deadline:g} s and {lifetime} s (for a slow API server raise the deadline "
            "and the lifetime together)"
        )


def _check_watch_times(values: Mapping[str, Any]) -> None:
    defaults = Settings()
    server = values.get("watch_server_timeout_s", defaults.watch_server_timeout_s)
    client = values.get("watch_client_timeout_s", defaults.watch_client_timeout_s)
    inactivity = values.get("watch_inactivity_timeout_s", defaults.watch_inactivity_timeout_s)
    connect = values.get("watch_connect_timeout_s", defaults.watch_connect_timeout_s)
    if not 0 < server < client:
        raise ValueError(
            "watch timing: need 0 < watch_server_timeout < watch_client_timeout (the client's deadline "
            f"is the backstop for a stream the server does not end), got {server:g} s and {client:g} s"
        )
    if inactivity <= 0 or connect <= 0:
        raise ValueError(
            f"watch timing: watch_inactivity_timeout ({inactivity:g} s) and watch_connect_timeout "
            f"({connect:g} s) must be positive"
        )


EXIT_STATUS = """\
exit status: 0 stopped by SIGTERM or SIGINT; 2 a bad flag or environment variable, an unusable
kubeconfig (none outside a pod, missing, malformed), an API server that does not answer the first
request within --request-timeout-seconds or serves no resource.k8s.io version this driver speaks,
a metrics port that cannot be bound. Each error is one line on stderr. Once running, the operator
retries an API server that goes away instead of exiting."""


class _Parser(OneLineParser):
    error_class = ValueError


def parse(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``argv`` and ``env``; ``ValueError`` (one line) for anything unusable."""
    parser = _Parser(
        prog="dra-operator run", epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return from_sources(args=parser.parse_args(list(argv)), env=env)


def _field_docs() -> dict[str, str]:
    """Attribute docstrings, read from this module's source (they are not kept at runtime)."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    tree = ast.parse(inspect.getsource(Settings))
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = after.value.value
    return docs


_FIELD_DOCS = _field_docs()
