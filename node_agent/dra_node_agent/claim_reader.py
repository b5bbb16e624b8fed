"""Reading a ResourceClaim for NodePrepareResources: the kubelet only sends namespace, name and UID.

``ClaimReader.read`` GETs the claim in the served ``resource.k8s.io`` version, checks that it is
still the object the kubelet means (same UID) and that it is allocated, and keeps what this driver
needs: its own allocation results and the allocation's config entries.

Each GET has a deadline (``request_timeout``) and a failed one (timeout, connection error, 429, 5xx)
is tried again a few times with a short back-off, all well inside the kubelet's own deadline for the
prepare call, so a stalled connection to the API server makes prepare wait a little or fail with a
clear error that the kubelet retries, never hang.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_api.kubeletapi.model import ClaimRef
from dra_api.model import ModelError, ResourceClaim
from dra_api.names import RESOURCE_GROUP
from dra_api.quantity import Quantity

logger = logging.getLogger(__name__)

READ_TIMEOUT_S = 10.0
READ_ATTEMPTS = 3
# 3 x 10 s plus 0.5 s and 1 s of back-off: under the kubelet's 45 s deadline for a prepare call.
_RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})


class ClaimError(Exception):
    """The claim cannot be prepared as it stands; the message names the claim and why."""


class ClaimGone(ClaimError):
    """The API server has no claim with the kubelet's UID: deleted, or replaced under the same name."""


@dataclass(frozen=True)
class AllocatedDevice:
    """One result of the claim's allocation for this driver."""

    request: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    shared: bool = False  # consumed capacity was allocated: the device serves several claims
    # What the share consumes of each of the device's capacities (``consumedCapacity``), in base
    # units (bytes, counts), by capacity name.
    consumed: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class ClaimAllocation:
    """What prepare needs of one claim: its identity and this driver's part of the allocation."""

    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    # ``status.allocation.devices.config`` as v1 JSON, every driver's (class entries and claim
    # entries, as the allocator copied them); ``opaqueconfig`` picks and validates this driver's.
    config_entries: tuple[Mapping[str, Any], ...]
    # ``status.reservedFor`` entries that are Pods, as (name, uid): the pods that use the claim.
    pods: tuple[tuple[str, str], ...] = ()
    # The CEL expressions of the claim's requests that this driver's results answer (subrequests
    # included), for the multi-host check that a claim keeps to one TPU slice.
    selectors: tuple[str, ...] = ()


def describe(ref: ClaimRef) -> str:
    return f"ResourceClaim {ref.namespace}/{ref.name} (uid {ref.uid})"


def driver_allocation(*, ref: ClaimRef, obj: Mapping[str, Any], driver: str) -> ClaimAllocation:
    """This driver's results and configs from a claim object (any served version)."""
    try:
        claim = ResourceClaim.from_json(obj)
    except ModelError as exc:
        raise ClaimError(f"{describe(ref)}: cannot read the claim: {exc}") from exc
    if claim.metadata.uid != ref.uid:
        raise ClaimGone(
            f"{describe(ref)}: the API server has a claim of that name with uid {claim.metadata.uid}; "
            "the kubelet's claim was deleted and replaced"
        )
    allocation = claim.status.allocation
    if allocation is None:
        raise ClaimError(f"{describe(ref)}: status.allocation is empty; the claim is not allocated")
    devices = tuple(
        AllocatedDevice(
            request=result.request,
            pool=result.pool,
            device=result.device,
            admin_access=bool(result.admin_access),
            share_id=result.share_id,
            shared=result.share_id is not None or bool(result.consumed_capacity),
            consumed=_consumed(ref, result.device, result.consumed_capacity),
        )
        for result in allocation.devices
        if result.driver == driver
    )
    entries = tuple(entry.to_json() for entry in allocation.config)
    pods = tuple(
        (r.name, r.uid) for r in claim.status.reserved_for if r.resource == "pods" and not r.api_group
    )
    answered = {d.request.split("/", 1)[0] for d in devices}
    selectors: list[str] = []
    for request in claim.spec.requests:
        if request.name not in answered:
            continue
        specs = [sub.spec for sub in request.first_available]
        if request.exactly is not None:
            specs = [request.exactly]
        selectors.extend(sel.cel for spec in specs for sel in spec.selectors if sel.cel)
    return ClaimAllocation(
        ref=ref, devices=devices, config_entries=entries, pods=pods, selectors=tuple(selectors)
    )


def _consumed(ref: ClaimRef, device: str, consumed: Mapping[str, Quantity]) -> tuple[tuple[str, int], ...]:
    """A result's consumed capacity in base units; a fraction of a byte or share is no share of a
    GPU, and fails the prepare naming it."""
    out = []
    for name in sorted(consumed):
        amount = consumed[name].as_int()
        if amount is None or amount < 0:
            raise ClaimError(
                f"{describe(ref)}: device {device}: consumedCapacity {name} {consumed[name]} is not a "
                "whole, non-negative amount"
            )
        out.append((name.rpartition("/")[2], amount))
    return tuple(out)


class ClaimSource(Protocol):
    """Where prepare gets a claim's allocation from (the API server, through ``ClaimReader``)."""

    async def read(self, ref: ClaimRef) -> ClaimAllocation: ...


class ClaimReader:
    """GETs claims for one driver through the served resource.k8s.io version."""

    def __init__(
        self,
        *,
        api: client.ApiClient,
        driver: str,
        api_version: str,
        request_timeout: float = READ_TIMEOUT_S,
        attempts: int = READ_ATTEMPTS,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self._custom = client.CustomObjectsApi(api)
        self.driver = driver
        self.api_version = api_version
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        self.attempts = max(1, attempts)
        self._sleep = sleep

    async def get(self, ref: ClaimRef) -> dict[str, Any]:
        for attempt in range(1, self.attempts + 1):
            try:
                obj: Any = await self._custom.get_namespaced_custom_object(
                    RESOURCE_GROUP,
                    self.api_version,
                    ref.namespace,
                    "resourceclaims",
                    ref.name,
                    _request_timeout=self._timeout,
                )
                return dict(obj)
            except ApiException as exc:
                if exc.status == 404:
                    raise ClaimGone(f"{describe(ref)}: not found in the API server") from exc
                why = f"{exc.status} {exc.reason}"
                if exc.status not in _RETRIED_STATUS or attempt == self.attempts:
                    raise ClaimError(f"{describe(ref)}: reading it failed: {why}") from exc
            except (aiohttp.ClientError, TimeoutError) as exc:
                why = (
                    f"{type(exc).__name__}: {exc}"
                    if str(exc)
                    else f"{type(exc).__name__} (no answer in time)"
                )
                if attempt == self.attempts:
                    raise ClaimError(
                        f"{describe(ref)}: reading it failed after {attempt} attempts: {why}"
                    ) from exc
            delay = 0.5 * 2 ** (attempt - 1)
            logger.warning(
                "reading %s failed (%s), attempt %d of %d; retrying in %g s",
                describe(ref),
                why,
                attempt,
                self.attempts,
                delay,
            )
            await self._sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def read(self, ref: ClaimRef) -> ClaimAllocation:
        return driver_allocation(ref=ref, obj=await self.get(ref), driver=self.driver)
