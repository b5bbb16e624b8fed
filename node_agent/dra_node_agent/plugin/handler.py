"""What the plugin servers call: the driver's prepare/unprepare logic and its device health feed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol

from dra_api.kubeletapi.model import ClaimRef, DeviceHealth, PrepareResult


class DRAHandler(Protocol):
    """The driver side of NodePrepareResources / NodeUnprepareResources, independent of the DRA version.

    Both calls must be idempotent: kubelet repeats them after restarts and timeouts (45 s per call).
    The servers fill in an error entry for any claim the handler leaves out, and turn an exception into
    an error entry for every claim of the call, so a handler bug never fails the RPC.
    """

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        """Prepare the claims; the result is keyed by claim UID."""
        ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """Undo prepare; the result maps claim UID to an error message, "" on success."""
        ...


class HealthSource(Protocol):
    """Device health reports for the kubelet's NodeWatchResources stream.

    ``watch()`` is called once per kubelet stream (usually an async generator) and yields the complete
    device list of the driver each time, starting with the current state. kubelet marks a device
    Unknown once its ``last_updated`` is older than its timeout (30 s by default), so a source must
    yield at least that often even when nothing changed.
    """

    def watch(self) -> AsyncIterator[Sequence[DeviceHealth]]: ...
