"""A local HTTP server standing in for the API server's wire, and a client configuration for it:
for tests of what the operator's own requests put on the wire (not a fake API server: it answers
what each test scripts)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from kubernetes_asyncio import client


@contextlib.asynccontextmanager
async def local_server(handle: Callable[[web.Request], Awaitable[web.Response]]) -> AsyncIterator[str]:
    """Serve every method and path with ``handle`` on a free loopback port; yields the base URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def client_config(url: str) -> client.Configuration:
    """A client configuration for ``url`` with a bearer token, as a ServiceAccount's."""
    config = client.Configuration(host=url)
    config.api_key = {"BearerToken": "secret-token"}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    return config
