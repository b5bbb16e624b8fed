"""NodePrepareResources / NodeUnprepareResources for DRA v1 and v1beta1, sharing one implementation.

Both versions' servicers translate their messages to ``model`` dataclasses and call ``ClaimService``,
which guarantees kubelet's contract: every claim of a request gets an entry keyed by its UID, and
whatever goes wrong for a claim (bad identity, handler exception, missing or malformed result) becomes
that claim's ``error`` instead of a failed RPC.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import grpc

from dra_api.aiotasks import BackgroundTasks
from dra_api.kubeletapi import convert, dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from dra_api.kubeletapi.model import ClaimRef, PreparedDevice, PrepareResult
from dra_node_agent.plugin.handler import DRAHandler

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _describe(claim: ClaimRef) -> str:
    return f"ResourceClaim {claim.namespace}/{claim.name} (uid {claim.uid})"


def _exception_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _identity_problem(claim: ClaimRef) -> str:
    for field in ("namespace", "name", "uid"):
        if not getattr(claim, field):
            return f"{_describe(claim)}: claim {field} is empty"
    return ""


def _top_level_requests(requests: Sequence[str]) -> tuple[str, ...]:
    # kubelet matches container requests against top-level request names only, so "req/sub" must be
    # reported as "req" (as the upstream Go helper does).
    seen: dict[str, None] = {}
    for name in requests:
        seen.setdefault(name.split("/", 1)[0], None)
    return tuple(seen)


def _checked_device(device: object) -> PreparedDevice:
    if not isinstance(device, PreparedDevice):
        raise TypeError(f"driver returned a {type(device).__name__} instead of a PreparedDevice")
    for field in ("pool", "device"):
        value = getattr(device, field)
        if not isinstance(value, str) or not value:
            raise TypeError(f"driver returned a device with an empty or non-string {field}")
    for field in ("requests", "cdi_device_ids"):
        values = getattr(device, field)
        if isinstance(values, str) or not all(isinstance(v, str) for v in values):
            raise TypeError(f"driver returned a device whose {field} is not a sequence of strings")
    if device.share_id is not None and not isinstance(device.share_id, str):
        raise TypeError("driver returned a device whose share_id is not a string")
    return PreparedDevice(
        requests=_top_level_requests(device.requests),
        pool=device.pool,
        device=device.device,
        cdi_device_ids=tuple(device.cdi_device_ids),
        share_id=device.share_id,
    )


def _checked_result(claim: ClaimRef, result: object) -> PrepareResult:
    if result is None:
        return PrepareResult(error=f"{_describe(claim)}: driver returned no result for this claim")
    if not isinstance(result, PrepareResult):
        return PrepareResult(error=f"{_describe(claim)}: driver returned a {type(result).__name__} result")
    error: object = result.error
    if not isinstance(error, str):
        return PrepareResult(error=f"{_describe(claim)}: driver returned a non-string error")
    if error:
        return PrepareResult(error=error)
    try:
        devices = tuple(_checked_device(device) for device in result.devices)
    except TypeError as exc:
        return PrepareResult(error=f"{_describe(claim)}: {exc}")
    return PrepareResult(devices=devices)


class ClaimService:
    """Version-independent prepare/unprepare around a ``DRAHandler``.

    With ``serialize`` (the upstream helper's default) one handler call runs at a time.
    """

    def __init__(self, *, driver: str, handler: DRAHandler, serialize: bool) -> None:
        self._driver = driver
        self._handler = handler
        self._lock: asyncio.Lock | None = asyncio.Lock() if serialize else None
        # The RPC that started a call awaits it and reports its failure; _finished reports the rest.
        self._running = BackgroundTasks(log_failures=False)
        self._abandoned: set[asyncio.Task[Mapping[str, object]]] = set()

    async def _call(self, work: Callable[[], Awaitable[Mapping[str, T]]]) -> Mapping[str, object]:
        """Run one handler call to completion, even if kubelet gives up waiting for it.

        kubelet cancels a call after 45 s and retries later; cancelling the handler halfway through
        device setup would leave it in a state nobody recorded, so the call runs in its own task and
        only the waiting is cancelled. ``drain`` lets shutdown wait for such calls.
        """

        async def serialized() -> Mapping[str, T]:
            if self._lock is None:
                return await work()
            async with self._lock:
                return await work()

        task = self._running.spawn(serialized())
        task.add_done_callback(self._finished)
        try:
            returned = await asyncio.shield(task)
        except asyncio.CancelledError:
            self._abandoned.add(task)
            raise
        if not isinstance(returned, Mapping):
            raise TypeError(f"driver returned a {type(returned).__name__} instead of a mapping")
        return returned

    @property
    def abandoned_calls(self) -> int:
        """Handler calls still running whose RPC kubelet stopped waiting for."""
        return len(self._abandoned)

    def _finished(self, task: asyncio.Task[Mapping[str, object]]) -> None:
        if task in self._abandoned:
            # Nobody awaits this one any more, so its failure is reported here.
            self._abandoned.discard(task)
            if not task.cancelled() and task.exception() is not None:
                logger.warning(
                    "%s handler call that kubelet stopped waiting for failed: %s",
                    self._driver,
                    task.exception(),
                )

    async def drain(self, *, grace: float) -> None:
        """Wait up to ``grace`` seconds for handler calls still running after their RPC ended."""
        pending = await self._running.drain(grace=grace, cancel=False)
        if pending:
            logger.warning("stopping with %d %s handler calls still running", len(pending), self._driver)

    @staticmethod
    def _split(claims: Sequence[ClaimRef]) -> tuple[dict[str, str], list[ClaimRef]]:
        """Claims with a bad identity (-> their error) and the distinct valid ones to hand on."""
        rejected: dict[str, str] = {}
        valid: dict[str, ClaimRef] = {}
        for claim in claims:
            problem = _identity_problem(claim)
            if problem:
                rejected[claim.uid] = problem
            else:
                valid.setdefault(claim.uid, claim)
        return rejected, list(valid.values())

    def _warn_unknown(self, *, call: str, returned: Mapping[str, object], claims: Sequence[ClaimRef]) -> None:
        unknown = set(returned) - {claim.uid for claim in claims}
        if unknown:
            # kubelet rejects the whole response for UIDs it did not ask about, so they are dropped.
            logger.warning(
                "%s for driver %s returned unrequested claim UIDs %s", call, self._driver, sorted(unknown)
            )

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        rejected, valid = self._split(claims)
        results = {uid: PrepareResult(error=error) for uid, error in rejected.items()}
        if not valid:
            return results
        returned: Mapping[str, object]
        try:
            returned = await self._call(lambda: self._handler.prepare(valid))
        except Exception as exc:
            logger.exception("prepare for driver %s failed for %d claims", self._driver, len(valid))
            text = _exception_text(exc)
            results.update(
                {c.uid: PrepareResult(error=f"{_describe(c)}: prepare failed: {text}") for c in valid}
            )
            return results
        self._warn_unknown(call="prepare", returned=returned, claims=valid)
        for claim in valid:
            results[claim.uid] = _checked_result(claim, returned.get(claim.uid))
            if results[claim.uid].error:
                logger.warning("prepare %s: %s", _describe(claim), results[claim.uid].error)
        return results

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        errors, valid = self._split(claims)
        if not valid:
            return errors
        returned: Mapping[str, object]
        try:
            returned = await self._call(lambda: self._handler.unprepare(valid))
        except Exception as exc:
            logger.exception("unprepare for driver %s failed for %d claims", self._driver, len(valid))
            text = _exception_text(exc)
            errors.update({c.uid: f"{_describe(c)}: unprepare failed: {text}" for c in valid})
            return errors
        self._warn_unknown(call="unprepare", returned=returned, claims=valid)
        for claim in valid:
            error = returned.get(claim.uid)
            if error is None:
                errors[claim.uid] = f"{_describe(claim)}: driver returned no result for this claim"
            elif not isinstance(error, str):
                errors[claim.uid] = f"{_describe(claim)}: driver returned a {type(error).__name__} error"
            else:
                errors[claim.uid] = error
            if errors[claim.uid]:
                logger.warning("unprepare %s: %s", _describe(claim), errors[claim.uid])
        return errors


class DRAPluginV1Servicer(dra_v1_pb2_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``."""

    def __init__(self, *, service: ClaimService) -> None:
        self._service = service

    async def NodePrepareResources(
        self,
        request: dra_v1_pb2.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> dra_v1_pb2.NodePrepareResourcesResponse:
        results = await self._service.prepare(convert.claims_from_request(request))
        response = dra_v1_pb2.NodePrepareResourcesResponse()
        convert.fill_prepare_response(response, results)
        return response

    async def NodeUnprepareResources(
        self,
        request: dra_v1_pb2.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        errors = await self._service.unprepare(convert.claims_from_request(request))
        response = dra_v1_pb2.NodeUnprepareResourcesResponse()
        convert.fill_unprepare_response(response, errors)
        return response


class DRAPluginV1beta1Servicer(dra_v1beta1_pb2_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin``; same behaviour, no ``share_id`` on the wire."""

    def __init__(self, *, service: ClaimService) -> None:
        self._service = service

    async def NodePrepareResources(
        self,
        request: dra_v1beta1_pb2.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> dra_v1beta1_pb2.NodePrepareResourcesResponse:
        results = await self._service.prepare(convert.claims_from_request(request))
        response = dra_v1beta1_pb2.NodePrepareResourcesResponse()
        convert.fill_prepare_response(response, results)
        return response

    async def NodeUnprepareResources(
        self,
        request: dra_v1beta1_pb2.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> dra_v1beta1_pb2.NodeUnprepareResourcesResponse:
        errors = await self._service.unprepare(convert.claims_from_request(request))
        response = dra_v1beta1_pb2.NodeUnprepareResourcesResponse()
        convert.fill_unprepare_response(response, errors)
        return response
