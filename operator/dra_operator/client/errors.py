"""What a call to the API server can end in, as the operator tells the cases apart.

Writes that must not lose a race carry ``metadata.resourceVersion`` inside a merge patch: the API
server then refuses them with 409 Conflict when the object changed since it was read, which
:class:`Conflict` reports. A 404 is :class:`Gone`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException


class Conflict(Exception):
    """The object changed since it was read (HTTP 409)."""


class Gone(Exception):
    """The object does not exist (HTTP 404)."""


class Expired(Exception):
    """A watch's resourceVersion is too old for the server (410 Gone): list again."""


class WatchInactive(Exception):
    """A watch brought nothing, not even a bookmark, for its inactivity timeout: the connection is
    taken as silently stalled and dropped; resume from the last resourceVersion seen."""


class NotActive(Exception):
    """A write was refused here because this instance is not (or no longer) the active one."""


def translate(exc: ApiException) -> Exception:
    """:class:`Conflict` for a 409, :class:`Gone` for a 404, else ``exc`` itself."""
    if exc.status == 409:
        return Conflict(str(exc.reason))
    if exc.status == 404:
        return Gone(str(exc.reason))
    return exc


def transient(exc: BaseException) -> bool:
    """Whether an API call may succeed when simply tried again: throttling (429), a server-side
    error (5xx), a dropped connection or a timeout. Anything else (403, 422, bugs) will not."""
    if isinstance(exc, ApiException):
        return exc.status == 429 or (exc.status is not None and exc.status >= 500)
    return isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError))


def error_cause(exc: BaseException) -> str:
    """A short label for an API error: the HTTP status, or the exception's type."""
    if isinstance(exc, ApiException) and exc.status is not None:
        return str(exc.status)
    return type(exc).__name__


def error_text(exc: BaseException) -> str:
    """One line for a log: the status and reason of an API error, or the exception's text."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def retry_after(exc: BaseException) -> float | None:
    """The server's Retry-After (seconds) on a 429 or 503, if it sent one."""
    if not isinstance(exc, ApiException) or exc.status not in (429, 503) or not exc.headers:
        return None
    value = exc.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: never sent by the API server


async def api_error(raw: Any) -> ApiException:
    """The ApiException for an unpreloaded response with an HTTP error status (the client raises
    only when it reads the body itself), with its headers for Retry-After."""
    error = ApiException(status=raw.status, reason=await raw.text())
    error.headers = raw.headers
    return error
